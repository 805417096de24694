"""Child processes that must not outlive the process that started them."""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable


def die_with_parent() -> Callable[[], None] | None:
    """What a child runs before exec (`preexec_fn`): SIGTERM it when the process that started
    it dies, however it dies (a SIGKILLed gateway or worker never runs its cleanup; uvicorn
    ends a SIGTERMed one by re-raising the signal). Linux's PR_SET_PDEATHSIG, looked up here
    in the parent so the child only makes the call (no locks, no imports); None elsewhere."""
    if sys.platform != "linux":
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig, sigterm = 1, int(signal.SIGTERM)

    def set_death_signal() -> None:
        prctl(pr_set_pdeathsig, sigterm, 0, 0, 0)

    return set_death_signal
