"""Sample data for `flywheel demo`: feedback, tickets and a repository, written to files that
the ordinary `flywheel ingest` commands read, and the arithmetic domain's calibrated settings.
Standard library only."""

from flywheel.demo.data import (
    ARITHMETIC_DOMAIN,
    CODE_DOMAIN,
    SUPPORT_DOMAIN,
    arithmetic_plan,
    write_arithmetic,
    write_repository,
    write_support,
)

__all__ = [
    "ARITHMETIC_DOMAIN",
    "CODE_DOMAIN",
    "SUPPORT_DOMAIN",
    "arithmetic_plan",
    "write_arithmetic",
    "write_repository",
    "write_support",
]
