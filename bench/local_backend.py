"""Benchmark: the local inference server's batched generation against plain `model.generate`.

    python -m bench.local_backend [--requests 8] [--max-tokens 64] [--hidden 256] [--layers 4]
                                  [--rounds 2] [--device auto|cpu|cuda]

Same model (a random Llama built here, with one random LoRA adapter), same prompts, same
number of new tokens (greedy, `ignore_eos`, so every arm generates exactly `--max-tokens` per
prompt), side by side in one run:

  (a) in process: the adapter loaded with peft, `model.generate` once per prompt, in turn;
  (b) `python -m finetune.serve`: the N requests sent at once over HTTP to the adapter (one
      batch of N on the server), timed from the first request sent to the last answer;
  (c) the same server, the N requests one after another (its overhead without batching).

Tokens/s counts generated tokens over wall time, best of `--rounds` after a warm-up round.
Prints both rates and the ratios (b)/(a) and (c)/(a). Asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer

from finetune import tiny

WORDS = ["the", "a", "ticket", "refund", "invoice", "billing", "account", "customer", "order",
         "late", "charge", "twice"]  # fmt: skip


def prompts(count: int) -> list[str]:
    """Prompts of different lengths (the server left-pads them in its batch)."""
    return [" ".join(WORDS[(n + k) % len(WORDS)] for k in range(6 + 5 * n)) for n in range(count)]


def build(root: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    texts = [" ".join(WORDS[k:] + WORDS[:k]) for k in range(len(WORDS))] * 4
    tokenizer = tiny.build_tokenizer(texts, vocab_size=512)
    model = tiny.build_model(tokenizer, hidden_size=args.hidden, num_layers=args.layers,
                             num_heads=4, max_position_embeddings=1024)  # fmt: skip
    tiny.save_base(root / "base", model, tokenizer)
    torch.manual_seed(1)
    config = LoraConfig(r=16, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                        init_lora_weights=False)  # fmt: skip
    get_peft_model(model, config).save_pretrained(root / "adapter")
    return root / "base", root / "adapter"


class InProcess:
    """(a): sequential greedy `generate` with the adapter applied by peft, in this process."""

    def __init__(self, base: Path, adapter: Path, texts: list[str], args: argparse.Namespace):
        cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
        self.device = torch.device("cuda" if cuda else "cpu")
        dtype = torch.bfloat16 if cuda else torch.float32
        tokenizer = AutoTokenizer.from_pretrained(base)
        model: Any = AutoModelForCausalLM.from_pretrained(base, dtype=dtype).to(self.device)
        self.model = PeftModel.from_pretrained(model, adapter).eval()
        self.config = self.model.generation_config
        self.config.update(do_sample=False, max_new_tokens=args.max_tokens, eos_token_id=[])
        self.encoded = []
        for text in texts:
            messages = [{"role": "user", "content": text}]
            prompt = tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=True
            )
            ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")
            self.encoded.append(ids.to(self.device))

    def rate(self) -> float:
        start, tokens = time.perf_counter(), 0
        with torch.inference_mode():
            for ids in self.encoded:
                out = self.model.generate(**ids, generation_config=self.config)
                tokens += out.shape[1] - ids["input_ids"].shape[1]
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return tokens / (time.perf_counter() - start)


def start_server(base: Path, adapter: Path, args: argparse.Namespace) -> tuple[Any, str]:
    command = [sys.executable, "-m", "finetune.serve", "--base-model", str(base), "--port", "0",
               "--max-batch-size", str(args.requests), "--batch-wait-ms", "50",
               "--device", args.device]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    url = line.removeprefix("flywheel-serve listening on ")
    loaded = httpx.post(f"{url}/v1/load_lora_adapter",
                        json={"lora_name": "bench", "lora_path": str(adapter)})  # fmt: skip
    loaded.raise_for_status()
    return process, url


async def over_http(url: str, texts: list[str], args: argparse.Namespace, together: bool) -> float:
    """(b) or (c): tokens/s of the N requests, all at once or one after another."""
    async with httpx.AsyncClient(timeout=600) as client:

        async def one(text: str) -> int:
            body = {
                "model": "bench",
                "messages": [{"role": "user", "content": text}],
                "max_tokens": args.max_tokens,
                "temperature": 0,
                "ignore_eos": True,
            }
            response = await client.post(f"{url}/v1/chat/completions", json=body)
            response.raise_for_status()
            return int(response.json()["usage"]["completion_tokens"])

        start = time.perf_counter()
        if together:
            tokens = sum(await asyncio.gather(*(one(text) for text in texts)))
        else:
            tokens = sum([await one(text) for text in texts])
        return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    args = parser.parse_args()
    texts = prompts(args.requests)
    with tempfile.TemporaryDirectory() as scratch:
        base, adapter = build(Path(scratch), args)
        plain = InProcess(base, adapter, texts, args)
        process, url = start_server(base, adapter, args)
        best = {"a": 0.0, "b": 0.0, "c": 0.0}
        try:
            for round_ in range(args.rounds + 1):  # round 0 warms up; arms interleaved
                rates = {"a": plain.rate(),
                         "b": asyncio.run(over_http(url, texts, args, together=True)),
                         "c": asyncio.run(over_http(url, texts, args, together=False))}  # fmt: skip
                print(f"round {round_}: " + ", ".join(f"({k}) {v:,.0f}" for k, v in rates.items()))
                if round_:
                    best = {k: max(best[k], rates[k]) for k in best}
            batches = httpx.get(f"{url}/metrics").json()["batch_sizes"]
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(f"{args.requests} requests x {args.max_tokens} new tokens, hidden {args.hidden}, "
          f"{args.layers} layers, {os.cpu_count()} CPUs, device {args.device}; "
          f"best of {args.rounds}; server batch sizes {batches}")  # fmt: skip
    a, b, c = best["a"], best["b"], best["c"]
    print(f"(a) {'in-process sequential generate':<36} {a:>10,.0f} tokens/s")
    together = f"{args.requests} concurrent (batched)"
    print(f"(b) server, {together:<24} {b:>10,.0f} tokens/s   ratio {b / a:.2f}")
    print(f"(c) server, {'one at a time':<24} {c:>10,.0f} tokens/s   ratio {c / a:.2f}")


if __name__ == "__main__":
    main()
