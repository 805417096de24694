"""External sources into the signal store: ticket exports and APIs, git repositories,
feedback and task files (HumanEval, MBPP, Flywheel's own).

Each reader turns its records into candidates (SFT examples, preference pairs, verifiable
tasks, feedback events); `runner` drives it in resumable batches and hands every batch to
`flywheel.signals.store`, which redacts, hashes and writes it. Imports `flywheel` only, and of
it never the ORM models: every table has its writer in `flywheel/`.
"""
