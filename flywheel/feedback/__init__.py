"""Interactions (what a model did in production) and raw feedback events about them."""
