"""The OpenAI-compatible protocol of the local server: errors in OpenAI's shape, the request
bodies, chat-template prompts and tool-call parsing."""

from __future__ import annotations

import json
import re
import uuid
from contextlib import suppress
from typing import Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


# --- errors, in OpenAI's shape ---------------------------------------------------------------


class ApiError(Exception):
    def __init__(
        self, status: int, message: str, *, type_: str, code: str, param: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = (
            status, message, type_, code, param,
        )  # fmt: skip

    def response(self) -> JSONResponse:
        error = {"message": self.message, "type": self.type, "param": self.param, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


def bad_request(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, type_="invalid_request_error", code="invalid_value", param=param)


def not_found(message: str, param: str | None = "model") -> ApiError:
    kind = "invalid_request_error"
    return ApiError(404, message, type_=kind, code="model_not_found", param=param)


# --- request bodies ---------------------------------------------------------------------------


class StreamOptions(BaseModel):
    include_usage: bool = False


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat body this server honours; others are ignored (as vLLM)."""

    model_config = ConfigDict(extra="ignore")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    ignore_eos: bool = False


class LoadLoraRequest(BaseModel):
    lora_name: str = ""
    lora_path: str = ""


class UnloadLoraRequest(BaseModel):
    lora_name: str = ""


# --- prompts and answers ----------------------------------------------------------------------


def render_prompt(tokenizer: Any, body: ChatRequest) -> list[int]:
    """The chat template's prompt (with `tools` when given), tokenized."""
    messages = [_template_message(message) for message in body.messages]
    try:
        text = tokenizer.apply_chat_template(
            messages, tools=body.tools, add_generation_prompt=True, tokenize=False
        )
    except Exception as error:  # jinja's errors: the messages do not fit the template
        raise bad_request(f"cannot render the messages: {error}", "messages") from error
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's message as chat templates read it: text parts joined, tool-call arguments
    as objects rather than JSON strings."""
    message = dict(message)
    if isinstance(message.get("content"), list):
        parts = message["content"]
        message["content"] = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
    calls = []
    for call in message.get("tool_calls") or []:
        function = dict(call.get("function", {}))
        if isinstance(function.get("arguments"), str):
            with suppress(json.JSONDecodeError):
                function["arguments"] = json.loads(function["arguments"])
        calls.append({**call, "function": function})
    if calls:
        message["tool_calls"] = calls
    return message


def parse_tool_calls(
    tokenizer: Any, text: str, *, prefix: str = "", tools: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]] | None:
    """OpenAI tool calls in generated `text` (after the prompt `prefix`), or None: the
    tokenizer's own response parser when it has one for its template (TRL sets those of the
    templates it ships), else `<tool_call>{json}</tool_call>` blocks."""
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        try:
            if getattr(tokenizer, "response_template", None):
                parsed = tokenizer.parse_response(text, prefix=prefix, tools=tools)
            else:
                parsed = tokenizer.parse_response(text)
            calls = (parsed or {}).get("tool_calls") or []
        except (ValueError, TypeError, KeyError):
            return None
    else:
        try:
            calls = [{"function": json.loads(block)} for block in _TOOL_CALL.findall(text)]
        except json.JSONDecodeError:
            return None
    functions = [call.get("function", call) for call in calls if isinstance(call, dict)]
    if not functions or not all(isinstance(f.get("name"), str) for f in functions):
        return None
    return [
        {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
         "function": {"name": f["name"], "arguments": _arguments(f.get("arguments"))}}
        for f in functions
    ]  # fmt: skip


def _arguments(arguments: Any) -> str:
    return arguments if isinstance(arguments, str) else json.dumps(arguments or {})


def add_response_parser(tokenizer: Any) -> None:
    """TRL knows the response parsers of the templates it ships; others keep the fallback."""
    if getattr(tokenizer, "response_template", None) or getattr(tokenizer, "response_schema", None):
        return
    try:
        from trl.chat_template_utils import add_response_schema

        add_response_schema(tokenizer)
    except (ImportError, ValueError):
        pass


def usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}  # fmt: skip
