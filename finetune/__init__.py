"""Training recipes (SFT, DPO, GRPO) run as a subprocess: `python -m finetune ...`.

A pure trainer: reads a frozen dataset export and a config, writes an adapter and MLflow
metrics. Imports `flywheel.sandbox` and `flywheel.settings` only — never the database.
"""
