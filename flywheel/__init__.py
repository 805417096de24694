"""Flywheel: turn an enterprise's own LLM usage into better models."""

__version__ = "0.1.0"
