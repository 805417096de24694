"""Immutable, versioned training sets per domain with strict train/eval separation."""
