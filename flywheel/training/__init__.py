"""Launching training: a dataset version exported to files, `python -m finetune` (or
`accelerate launch`) as a subprocess, and a `Run` row that says how it went."""
