"""Interactions (what a model did in production), the raw feedback events about them, and
forgetting a rater or a source record with everything derived from it (`forget`)."""
