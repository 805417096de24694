"""Evaluating adapters against their domain's frozen eval items, and the promotion gate."""
