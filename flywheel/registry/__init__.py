"""Training runs, model versions and the audit trail of alias moves."""
