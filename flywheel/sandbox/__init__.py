"""Run model-written code against tests, isolated and without trusting it.

No database imports: `finetune/` uses this package too.
"""

from flywheel.errors import SandboxUnavailable
from flywheel.sandbox.execute import run_tests
from flywheel.sandbox.limits import Limits
from flywheel.sandbox.process import check_available, refuse_unsafe_local
from flywheel.sandbox.verdict import TestResult, Verdict

__all__ = [
    "Limits",
    "SandboxUnavailable",
    "TestResult",
    "Verdict",
    "check_available",
    "refuse_unsafe_local",
    "run_tests",
]
