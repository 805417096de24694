"""The one error a recipe raises for bad input (config, dataset export, base model): it is
reported on one line, before any training starts, and the process exits with status 2."""


class TrainingInputError(Exception):
    """Something the user gave cannot be trained on; the message says what and how to fix it."""
