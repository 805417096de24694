"""Invoicing helpers: VAT, discounts and instalments, in whole cents."""
