"""Repositories as verifiable tasks: tested functions of the working tree, and commits that
changed source and tests together. See `ingestor.RepositoryIngestor`."""

from ingest.repo.ingestor import RepositoryIngestor

__all__ = ["RepositoryIngestor"]
