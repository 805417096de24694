"""`flywheel demo`: the whole flywheel on bundled sample data, through the real CLI.

- `runner`: the `flywheel demo` command: ingest, a tiny base model, a cycle, more feedback, a
  second cycle, a summary (`summary`) and the HTML report. It runs every step as a `flywheel`
  command (and the trainer as a subprocess): it imports nothing of `ingest` or `finetune`;
- `data`: the input files it ingests (`write_arithmetic`, `write_support`,
  `write_repository`) and the arithmetic domain's calibrated plan (`arithmetic_plan`), built
  from `arithmetic_feedback`, `support` and `repository`;
- `arithmetic`: the arithmetic domain itself (problems, the carry mistake, the split), shared
  with `finetune.synthetic`, which pretrains the demo's base model from it.

This package's `__init__` imports nothing, so `finetune` importing `flywheel.demo.arithmetic`
(standard library only) loads that module and no other of the demo.
"""
