"""`python -m finetune.serve --base-model DIR [--port 0]`: the embedded inference server.

A base model (transformers) and the LoRA adapters loaded into it by name (peft), served over
the OpenAI-compatible subset vLLM speaks: `GET /v1/models`, `POST /v1/chat/completions`
(streamed or not), `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter`, plus
`GET /health` and `GET /metrics` (JSON counters, batch sizes among them).

Requests wait in a bounded queue (503 when full). One generation thread takes up to
`--max-batch-size` queued requests for the adapter of the oldest one (so no adapter starves),
left-pads them and runs `model.generate` once for the group. Streaming is incremental: a
stopping criterion sees every step's tokens, hands each row's new text to its request, and
stops rows that finished or whose client went away (the rest of the batch runs on).

Once it serves it prints one line on stdout: `flywheel-serve listening on http://HOST:PORT`.
"""
