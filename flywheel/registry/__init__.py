"""Runs (cycles and trainings), model versions and the audit trail of alias moves."""
