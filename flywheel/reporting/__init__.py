"""A domain's flywheel history as one self-contained HTML report (`flywheel report`)."""

from flywheel.reporting.records import DomainReport
from flywheel.reporting.service import gather_report, render_html, write_report

__all__ = ["DomainReport", "gather_report", "render_html", "write_report"]
