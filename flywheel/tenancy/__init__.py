"""Tenants, their API keys and their domains."""
