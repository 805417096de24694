"""Alembic environment and revisions (`flywheel db upgrade` runs them)."""
