"""Chat templates for SFT's assistant-only loss: which template marks the assistant's tokens.

TRL masks the loss to the assistant's tokens with `{% generation %}` markers in the chat
template. Few models ship them; for the families TRL knows (Llama 3, Qwen 2.5 / 3, Phi-3,
Gemma, ...) `SFTTrainer` swaps in its own training variant of the exact template. For Llama
3.1 / 3.2 and Mistral it has none and stops with a long ValueError, so Flywheel carries those
variants here, each the original with the markers added and nothing else changed (the markers
render as nothing: a conversation renders byte for byte as the original renders it). Any other
template without markers is a one-line error at start, naming the fix: assistant-only loss
never silently becomes loss on the whole sequence.

    use_training_template(tokenizer, base)   # before building the SFTTrainer
"""

from __future__ import annotations

from pathlib import Path

from transformers import PreTrainedTokenizerBase
from trl.chat_template_utils import (
    get_training_chat_template,
    has_generation_markers,
    llama3_1_chat_template,
    llama3_2_chat_template,
)

from finetune.errors import TrainingInputError

# Mistral's template as mistralai/Mistral-7B-Instruct-v0.2 and Mixtral-8x7B-Instruct-v0.1 ship
# it in tokenizer_config.json (reproduced in huggingface/text-generation-inference's
# router chat-template tests). Neither TRL nor transformers ships a Mistral text template.
MISTRAL_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)

_LLAMA_PLAIN_TURN = (
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in "
    "message) %}\n"
)
_LLAMA_ASSISTANT_TURN = (
    "    {%- if message.role == 'assistant' and 'tool_calls' not in message %}\n"
    "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "        {%- generation %}\n"
    "        {{- message['content'] | trim + '<|eot_id|>' }}\n"
    "        {%- endgeneration %}\n"
    "    {%- elif not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in "
    "message) %}\n"
)
_LLAMA_TOOL_CALL = "        {%- set tool_call = message.tool_calls[0].function %}\n"
_LLAMA_TOOL_CALL_HEADER = "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
_LLAMA_TOOL_TURN = '    {%- elif message.role == "tool" or message.role == "ipython" %}\n'


def _replace_once(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError(f"the template changed: {old.strip()!r} is not there exactly once")
    return text.replace(old, new)


def _llama3_training(original: str) -> str:
    """Llama 3.1 / 3.2 with markers: around a plain assistant turn's content and <|eot_id|>,
    and around a tool call and its <|eot_id|> / <|eom_id|>; the `assistant` header (a prompt
    cue the model does not generate) stays outside, as in TRL's `llama3_training.jinja`."""
    text = _replace_once(original, _LLAMA_PLAIN_TURN, _LLAMA_ASSISTANT_TURN)
    if _LLAMA_TOOL_CALL_HEADER not in text:
        raise RuntimeError("the template changed: no tool-call header")
    lines = text.splitlines(keepends=True)
    text = "".join(line for line in lines if line.strip() != _LLAMA_TOOL_CALL_HEADER.strip())
    text = _replace_once(
        text,
        _LLAMA_TOOL_CALL,
        _LLAMA_TOOL_CALL + "        " + _LLAMA_TOOL_CALL_HEADER + "        {%- generation %}\n",
    )
    closed = "        {%- endgeneration %}\n" + _LLAMA_TOOL_TURN
    return _replace_once(text, _LLAMA_TOOL_TURN, closed)


MISTRAL_TRAINING_CHAT_TEMPLATE = _replace_once(
    MISTRAL_CHAT_TEMPLATE,
    "{{ message['content'] + eos_token}}",
    "{% generation %}{{ message['content'] + eos_token}}{% endgeneration %}",
)

# Original template -> its training variant, for the families TRL has no variant for.
TRAINING_TEMPLATES = {
    llama3_1_chat_template: _llama3_training(llama3_1_chat_template),
    llama3_2_chat_template: _llama3_training(llama3_2_chat_template),
    MISTRAL_CHAT_TEMPLATE: MISTRAL_TRAINING_CHAT_TEMPLATE,
}


def use_training_template(tokenizer: PreTrainedTokenizerBase, base: Path) -> None:
    """Make sure SFT can mask the loss to the assistant's tokens with `tokenizer`'s template.

    Kept as it is when it has `{% generation %}` markers or TRL has a training variant of it
    (`SFTTrainer` swaps that in itself); replaced by Flywheel's variant for Llama 3.1 / 3.2 and
    Mistral (it renders the same text, so the adapter's saved tokenizer still prompts alike);
    otherwise a `TrainingInputError` naming the fix.
    """
    template = tokenizer.chat_template
    if isinstance(template, dict):  # named variants: TRL masks with the default one
        template = template.get("default")
    if not isinstance(template, str):
        raise TrainingInputError(f"the tokenizer in {base} has no chat template")
    if has_generation_markers(template):
        return
    if template in TRAINING_TEMPLATES:
        tokenizer.chat_template = TRAINING_TEMPLATES[template]
        return
    try:
        if get_training_chat_template(tokenizer) is not None:
            return
    except ValueError:
        pass
    raise TrainingInputError(
        f"the chat template in {base} has no {{% generation %}} markers, so assistant_only_loss "
        "cannot find the assistant's tokens: wrap each assistant turn's content and end-of-turn "
        f"token in {{% generation %}}...{{% endgeneration %}} ({base}/chat_template.jinja), "
        "or set assistant_only_loss=false to train on whole conversations"
    )
