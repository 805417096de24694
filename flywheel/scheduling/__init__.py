"""Cycles: one full turn of the flywheel per domain, inline or on procrastinate workers."""
