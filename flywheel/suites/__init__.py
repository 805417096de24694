"""Suites: a named set of a tenant's domains trained as one adapter in one run, gated per member."""
