import pytest
from invoicing.money import apply_discount, format_cents, split_evenly, vat_amount


def test_vat_rounds_half_up():
    assert vat_amount(1000, 19) == 190
    assert vat_amount(999, 19) == 190
    assert vat_amount(0, 21) == 0


def test_discount():
    assert apply_discount(1000, 15) == 850
    assert apply_discount(999, 50) == 499
    with pytest.raises(ValueError):  # noqa: PT011 (ingest repo takes pytest.raises(type) only)
        apply_discount(1000, 120)


def test_split_evenly_adds_up():
    assert split_evenly(100, 3) == [34, 33, 33]
    assert sum(split_evenly(1001, 7)) == 1001


def test_format_cents():
    assert format_cents(123456) == "1,234.56"
    assert format_cents(-5) == "-0.05"
