"""`python -m finetune.serve`, the local inference server, as a real subprocess on loopback: its
answers checked against plain `model.generate` and peft loaded directly, over HTTP (httpx and
the official `openai` client)."""

from __future__ import annotations

import asyncio
import json
import selectors
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from openai import OpenAI
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetune import synthetic, tiny
from finetune.serve.protocol import add_response_parser, parse_tool_calls
from tests.finetune.conftest import TRAINING

pytestmark = TRAINING

PROMPTS = ["What is 2 + 3?", "Compute 17 * 4.", "What is 100 - 58?", "Add 9 and 11.",
           "What is 6 * 7?", "Subtract 3 from 40.", "What is 12 + 30?",
           "Multiply 8 by 5."]  # fmt: skip
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]  # fmt: skip
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def start(base: Path, *flags: str) -> tuple[subprocess.Popen[str], str]:
    """The server on a free port, once it printed its ready line."""
    command = [sys.executable, "-m", "finetune.serve", "--base-model", str(base), "--port", "0"]
    process = subprocess.Popen([*command, *flags], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        if not selector.select(timeout=120):
            process.kill()
            raise AssertionError("the server printed no ready line in 120 s")
    line = process.stdout.readline().strip()
    assert line.startswith("flywheel-serve listening on http://127.0.0.1:"), line
    return process, line.removeprefix("flywheel-serve listening on ")


def stop(process: subprocess.Popen[str]) -> None:
    assert process.stdout is not None
    process.stdout.close()
    process.terminate()
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def make_adapter(base: Path, directory: Path, seed: int) -> Path:
    """A LoRA adapter with random (non-zero) weights: it changes what the base says."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "o_proj"],
                        init_lora_weights=False)  # fmt: skip
    get_peft_model(model, config).save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama pretrained for a second on the synthetic texts: it writes digits and stops."""
    directory = tmp_path_factory.mktemp("serve-base")
    tokenizer = tiny.build_tokenizer(synthetic.tokenizer_texts(), vocab_size=300)
    model = tiny.build_model(tokenizer, hidden_size=32, num_layers=1, max_position_embeddings=2048)
    texts = synthetic.pretraining_texts(tokenizer)
    tiny.pretrain(model, tokenizer, texts, steps=150, batch_size=16, learning_rate=1e-2)
    tiny.save_base(directory, model, tokenizer)
    return directory


@pytest.fixture(scope="module")
def adapters(base: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("serve-adapters")
    return {name: make_adapter(base, root / name, seed) for name, seed in (("a1", 1), ("a2", 2))}


@pytest.fixture(scope="module")
def url(base: Path, adapters: dict[str, Path]) -> Iterator[str]:
    process, address = start(base, "--batch-wait-ms", "150", "--max-batch-size", "8")
    try:
        for name, path in adapters.items():
            loaded = httpx.post(f"{address}/v1/load_lora_adapter",
                                json={"lora_name": name, "lora_path": str(path)})  # fmt: skip
            assert loaded.status_code == 200, loaded.text
        yield address
    finally:
        stop(process)


@pytest.fixture(scope="module")
def client(url: str) -> OpenAI:
    return OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def reference(
    base: Path, prompt: str, max_tokens: int, adapter: Path | None = None
) -> tuple[str, str, int]:
    """Plain greedy `generate` on the model (with the adapter loaded by peft): the text, the
    finish reason and the tokens generated."""
    tokenizer = AutoTokenizer.from_pretrained(base)
    model: Any = AutoModelForCausalLM.from_pretrained(base)
    if adapter is not None:
        model = PeftModel.from_pretrained(model, adapter)
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                         add_generation_prompt=True)  # fmt: skip
    ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
    with torch.inference_mode():
        out = model.eval().generate(**ids, max_new_tokens=max_tokens, do_sample=False)
    new = out[0, ids["input_ids"].shape[1] :].tolist()
    count = len(new)
    if new[-1] == tokenizer.eos_token_id:
        return str(tokenizer.decode(new[:-1], skip_special_tokens=True)), "stop", count
    return str(tokenizer.decode(new, skip_special_tokens=True)), "length", count


def chat(url: str, model: str, prompt: str, timeout: float = 60, **fields: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], **fields}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=timeout)


def metrics(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/metrics").json())


def assert_openai_error(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"]
    assert isinstance(error["code"], str)
    return dict(error)


def test_models_lists_the_base_and_the_loaded_adapters(client: OpenAI, base: Path) -> None:
    assert [model.id for model in client.models.list()] == [str(base), "a1", "a2"]


def test_a_greedy_completion_is_what_generate_says(client: OpenAI, base: Path) -> None:
    answer = client.chat.completions.create(
        model=str(base), messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=12
    )
    assert answer.usage is not None
    text, reason, count = reference(base, PROMPTS[0], 12)
    assert (answer.choices[0].message.content, answer.choices[0].finish_reason) == (text, reason)
    assert answer.usage.completion_tokens == count
    assert text  # a real answer, not an empty one


def test_each_adapter_answers_as_peft_does(
    client: OpenAI, base: Path, adapters: dict[str, Path]
) -> None:
    answers = {}
    for name, path in adapters.items():
        answer = client.chat.completions.create(
            model=name, messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=12
        )
        answers[name] = answer.choices[0].message.content
        assert answers[name] == reference(base, PROMPTS[1], 12, path)[0]
    assert len({*answers.values(), reference(base, PROMPTS[1], 12)[0]}) == 3


def test_concurrent_requests_to_one_adapter_are_batched(
    url: str, base: Path, adapters: dict[str, Path]
) -> None:
    before = metrics(url)

    async def all_at_once() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as session:
            return await asyncio.gather(*(
                session.post(f"{url}/v1/chat/completions", json={
                    "model": "a1", "messages": [{"role": "user", "content": p}], "max_tokens": 10})
                for p in PROMPTS))  # fmt: skip

    answers = asyncio.run(all_at_once())
    after = metrics(url)
    assert after["batches"] - before["batches"] < len(PROMPTS)
    assert after["max_batch_size"] > 1
    for prompt, answer in zip(PROMPTS, answers, strict=True):
        content = answer.json()["choices"][0]["message"]["content"]
        assert content == reference(base, prompt, 10, adapters["a1"])[0]  # padding changes nothing


def test_requests_for_several_adapters_at_once_each_get_their_own(
    url: str, base: Path, adapters: dict[str, Path]
) -> None:
    before = metrics(url)
    asked = [(name, prompt) for prompt in PROMPTS[:3] for name in (str(base), "a1", "a2")]

    async def mixed() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as session:
            return await asyncio.gather(*(
                session.post(f"{url}/v1/chat/completions", json={
                    "model": name, "messages": [{"role": "user", "content": p}], "max_tokens": 8})
                for name, p in asked))  # fmt: skip

    for (name, prompt), answer in zip(asked, asyncio.run(mixed()), strict=True):
        content = answer.json()["choices"][0]["message"]["content"]
        assert content == reference(base, prompt, 8, adapters.get(name))[0]
    assert metrics(url)["batches"] - before["batches"] >= 3  # one adapter per batch


def test_a_stream_is_the_answer_in_pieces_then_usage_and_done(url: str, base: Path) -> None:
    whole = chat(url, "a2", PROMPTS[2], max_tokens=16).json()
    body = {"model": "a2", "messages": [{"role": "user", "content": PROMPTS[2]}], "max_tokens": 16,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    assert {chunk["object"] for chunk in chunks} == {"chat.completion.chunk"}
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    assert len([piece for piece in pieces if piece]) > 1  # incremental, not one final chunk
    assert "".join(pieces) == whole["choices"][0]["message"]["content"]
    reasons = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert reasons[-1] == whole["choices"][0]["finish_reason"]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == whole["usage"]


def test_the_openai_client_streams_too(client: OpenAI, url: str) -> None:
    stream = client.chat.completions.create(
        model="a1", messages=[{"role": "user", "content": PROMPTS[3]}], max_tokens=8, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert (
        text == chat(url, "a1", PROMPTS[3], max_tokens=8).json()["choices"][0]["message"]["content"]
    )


def test_loading_a_name_twice_is_400_and_unloading_twice_404(
    url: str, adapters: dict[str, Path]
) -> None:
    load = {"lora_name": "again", "lora_path": str(adapters["a1"])}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load).status_code == 200
    assert_openai_error(httpx.post(f"{url}/v1/load_lora_adapter", json=load), 400)
    assert chat(url, "again", PROMPTS[0], max_tokens=2).status_code == 200
    unload = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "again"})
    assert unload.status_code == 200
    assert_openai_error(
        httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": "again"}), 404
    )
    assert_openai_error(chat(url, "again", PROMPTS[0]), 404)


def test_an_adapter_is_served_under_a_registry_name_with_dots(
    url: str, adapters: dict[str, Path]
) -> None:
    """The gateway names adapters `<tenant>.<domain>-v<version>`; peft refuses "." in its own
    adapter names (module names), so the server maps one to the other."""
    name = "demo.arithmetic-v1"
    load = {"lora_name": name, "lora_path": str(adapters["a1"])}
    assert httpx.post(f"{url}/v1/load_lora_adapter", json=load).status_code == 200
    answer = chat(url, name, PROMPTS[0], max_tokens=10)
    assert answer.status_code == 200, answer.text
    reference_answer = chat(url, "a1", PROMPTS[0], max_tokens=10)
    assert (
        answer.json()["choices"][0]["message"] == reference_answer.json()["choices"][0]["message"]
    )
    assert httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name}).status_code == 200


def test_a_path_without_an_adapter_is_404_and_a_missing_field_400(url: str, tmp_path: Path) -> None:
    missing = {"lora_name": "ghost", "lora_path": str(tmp_path)}
    assert_openai_error(httpx.post(f"{url}/v1/load_lora_adapter", json=missing), 404)
    assert_openai_error(httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "x"}), 400)


def test_an_unknown_model_is_404_in_openais_shape(url: str) -> None:
    error = assert_openai_error(chat(url, "no-such-model", PROMPTS[0]), 404)
    assert error["code"] == "model_not_found"
    assert error["param"] == "model"


@pytest.mark.parametrize(
    "body",
    [
        {"model": "a1", "messages": []},
        {"model": "a1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
        {"model": "a1", "messages": [{"role": "user", "content": "hi"}], "temperature": -1},
        {"messages": [{"role": "user", "content": "hi"}]},
        "not json",
    ],
)
def test_a_bad_body_is_400_in_openais_shape(url: str, body: Any) -> None:
    content = body if isinstance(body, str) else json.dumps(body)
    response = httpx.post(f"{url}/v1/chat/completions", content=content,
                          headers={"content-type": "application/json"})  # fmt: skip
    assert_openai_error(response, 400)


def test_sampling_answers_within_max_tokens(url: str) -> None:
    answer = chat(url, "a1", PROMPTS[4], max_tokens=5, temperature=0.9, top_p=0.9).json()
    assert answer["usage"]["completion_tokens"] <= 5


def test_ignore_eos_generates_max_tokens(url: str) -> None:
    answer = chat(url, "a1", PROMPTS[0], max_tokens=30, ignore_eos=True).json()
    assert (answer["usage"]["completion_tokens"], answer["choices"][0]["finish_reason"]) == (
        30,
        "length",
    )


def test_a_client_that_leaves_mid_stream_is_dropped_and_the_server_keeps_serving(
    url: str,
) -> None:
    before = metrics(url)
    body = {"model": "a1", "messages": [{"role": "user", "content": PROMPTS[5]}],
            "max_tokens": 200, "ignore_eos": True, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data:") and json.loads(line[5:])["choices"][0]["delta"].get(
                "content"
            ):
                break  # generation is under way: leave
    deadline = time.monotonic() + 10
    while metrics(url).get("dropped", 0) <= before.get("dropped", 0):
        assert time.monotonic() < deadline, metrics(url)
        time.sleep(0.05)
    after = metrics(url)
    assert after["cancelled"] > before.get("cancelled", 0)
    assert after["completion_tokens"] - before.get("completion_tokens", 0) < 200
    assert after["queued"] == 0
    assert chat(url, "a1", PROMPTS[6], max_tokens=3).json()["usage"]["completion_tokens"] == 3


def test_a_client_that_gives_up_on_an_answer_is_dropped_from_its_batch(url: str) -> None:
    """It hangs up once a batch has taken its request (a client timing out after a fixed time
    raced the batch: 1500 tokens took 0.7 s here, and it gave up after 1 s)."""
    before = metrics(url)
    body = json.dumps(
        {
            "model": "a2",
            "messages": [{"role": "user", "content": PROMPTS[6]}],
            "max_tokens": 1500,
            "ignore_eos": True,
        }
    ).encode()
    address = httpx.URL(url)
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {address.host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    with socket.create_connection((address.host, address.port)) as client:
        client.sendall(head.encode() + body)
        deadline = time.monotonic() + 10
        while not batched(url, before):
            assert time.monotonic() < deadline, metrics(url)
            time.sleep(0.01)
    deadline = time.monotonic() + 10
    while metrics(url).get("dropped", 0) <= before.get("dropped", 0):
        assert time.monotonic() < deadline, metrics(url)
        time.sleep(0.05)
    assert metrics(url)["completion_tokens"] - before.get("completion_tokens", 0) < 1500
    assert chat(url, "a2", PROMPTS[6], max_tokens=3).json()["usage"]["completion_tokens"] == 3


def batched(url: str, before: dict[str, Any]) -> bool:
    """Whether a batch took the request queued since `before` (none left queued)."""
    now = metrics(url)
    return bool(now["requests"] > before["requests"] and now["batches"] > before["batches"]
                and now["queued"] == 0)  # fmt: skip


def test_unloading_every_adapter_leaves_the_base_as_it_was(url: str, base: Path) -> None:
    """The module's last test on this server: the peft wrapper goes with the last adapter."""
    for name in ("a1", "a2"):
        unload = httpx.post(f"{url}/v1/unload_lora_adapter", json={"lora_name": name})
        assert unload.status_code == 200
    assert [model["id"] for model in httpx.get(f"{url}/v1/models").json()["data"]] == [str(base)]
    answer = chat(url, str(base), PROMPTS[7], max_tokens=12).json()
    assert answer["choices"][0]["message"]["content"] == reference(base, PROMPTS[7], 12)[0]


# --- a real chat template with tools: a tiny Qwen 3 -------------------------------------------


@pytest.fixture(scope="module")
def tool_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen 3 whose generation config biases it, token by token, to one tool call and
    then <|im_end|> (transformers' `sequence_bias`): a model that calls the tool."""
    directory = tmp_path_factory.mktemp("serve-qwen")
    family = tiny.FAMILIES["qwen3"]
    tokenizer = tiny.build_family_tokenizer(family, synthetic.tokenizer_texts(), vocab_size=300)
    model = tiny.build_family_model(family, tokenizer, max_position_embeddings=2048)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    target = [*tokenizer(CALL, add_special_tokens=False)["input_ids"], end]
    model.generation_config.sequence_bias = [[target[: i + 1], 10.0 * (i + 1)]
                                             for i in range(len(target))]  # fmt: skip
    tiny.save_base(directory, model, tokenizer)
    return directory


@pytest.fixture(scope="module")
def tool_url(tool_base: Path) -> Iterator[str]:
    process, address = start(tool_base, "--max-batch-size", "1", "--batch-wait-ms", "0",
                             "--max-queue", "2")  # fmt: skip
    try:
        yield address
    finally:
        stop(process)


def test_a_tool_call_is_answered_as_tool_calls(tool_url: str, tool_base: Path) -> None:
    answer = chat(tool_url, str(tool_base), "Weather in Paris?", tools=TOOLS, max_tokens=100)
    choice = answer.json()["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["content"] is None
    [call] = choice["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}


def test_tools_are_rendered_and_without_them_the_text_is_content(
    tool_url: str, tool_base: Path
) -> None:
    with_tools = chat(tool_url, str(tool_base), "Weather?", tools=TOOLS, max_tokens=100).json()
    plain = chat(tool_url, str(tool_base), "Weather?", max_tokens=100).json()
    assert with_tools["usage"]["prompt_tokens"] > plain["usage"]["prompt_tokens"] + 20
    assert plain["choices"][0]["finish_reason"] == "stop"  # on <|im_end|>, not in the content
    assert "get_weather" in plain["choices"][0]["message"]["content"]
    assert "<|im_end|>" not in plain["choices"][0]["message"]["content"]


def test_a_streamed_tool_call_arrives_as_a_tool_calls_delta(tool_url: str, tool_base: Path) -> None:
    body = {"model": str(tool_base), "messages": [{"role": "user", "content": "Paris?"}],
            "tools": TOOLS, "max_tokens": 100, "stream": True}  # fmt: skip
    with httpx.stream("POST", f"{tool_url}/v1/chat/completions", json=body, timeout=60) as response:
        events = [line.removeprefix("data: ") for line in response.iter_lines() if line]
    assert events[-1] == "[DONE]"
    choices = [json.loads(event)["choices"][0] for event in events[:-1]]
    [call] = next(c["delta"]["tool_calls"] for c in choices if c["delta"].get("tool_calls"))
    assert call["index"] == 0
    assert call["function"]["name"] == "get_weather"
    assert choices[-1]["finish_reason"] == "tool_calls"


def test_a_full_queue_answers_503_in_openais_shape(tool_url: str, tool_base: Path) -> None:
    async def flood() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as session:
            return await asyncio.gather(*(
                session.post(f"{tool_url}/v1/chat/completions", json={
                    "model": str(tool_base), "messages": [{"role": "user", "content": "x"}],
                    "max_tokens": 100})
                for _ in range(12)))  # fmt: skip

    statuses = [response.status_code for response in asyncio.run(flood())]
    assert set(statuses) == {200, 503}
    rejected = next(r for r in asyncio.run(flood()) if r.status_code == 503)
    assert assert_openai_error(rejected, 503)["type"] == "server_error"
    assert metrics(tool_url)["queued"] == 0


def test_the_template_parser_and_the_fallback_read_the_same_call(tool_base: Path) -> None:
    qwen = AutoTokenizer.from_pretrained(tool_base)
    add_response_parser(qwen)
    assert getattr(qwen, "response_template", None)  # TRL's parser for Qwen 3's template
    prefix = qwen.apply_chat_template([{"role": "user", "content": "Paris?"}], tools=TOOLS,
                                      tokenize=False, add_generation_prompt=True)  # fmt: skip
    plain = AutoTokenizer.from_pretrained(tool_base)
    plain.chat_template = tiny.CHAT_TEMPLATE  # a template TRL has no parser for
    add_response_parser(plain)
    for tokenizer in (qwen, plain):
        [call] = parse_tool_calls(tokenizer, CALL, prefix=prefix, tools=TOOLS) or []
        assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}
    assert parse_tool_calls(plain, "no call here") is None
    assert parse_tool_calls(plain, "<tool_call>{broken</tool_call>") is None
