"""Money in whole cents: no floats."""


def vat_amount(net_cents: int, rate_percent: int) -> int:
    """The VAT on a net amount in cents, rounded half up to a whole cent."""
    return (net_cents * rate_percent + 50) // 100


def apply_discount(total_cents: int, percent: int) -> int:
    """The total after a percentage discount, rounded down to a whole cent; never negative."""
    if not 0 <= percent <= 100:
        raise ValueError(f"a discount is 0-100 percent, not {percent}")
    return total_cents * (100 - percent) // 100


def split_evenly(total_cents: int, parts: int) -> list[int]:
    """Split a total into `parts` instalments that differ by at most one cent, larger first."""
    base, extra = divmod(total_cents, parts)
    return [base + 1] * extra + [base] * (parts - extra)


def format_cents(cents: int) -> str:
    """Cents as a decimal amount with two places and a thousands separator: 123456 -> 1,234.56."""
    sign = "-" if cents < 0 else ""
    whole, fraction = divmod(abs(cents), 100)
    return f"{sign}{whole:,}.{fraction:02d}"
