"""Warm sandboxes: reused when healthy, discarded after trouble, never tied to a thread."""

from __future__ import annotations

import threading

from flywheel.sandbox import Limits, run_tests
from flywheel.sandbox.warm import RUNNERS, ZYGOTES, WarmPool, close_pools

SOLUTION = "def add(a, b):\n    return a + b\n"
TESTS = "from solution import add\n\ndef test_add():\n    assert add(2, 2) == 4\n"


def idle(pool: WarmPool) -> list[object]:
    """The pool's idle sandboxes, once the last job's are back (jobs end after the verdict)."""
    assert pool.wait_returned()
    return list(pool._idle)


def test_sandboxes_outlive_the_thread_that_started_them() -> None:
    """bwrap --die-with-parent follows the starting *thread*; ours must not die with it."""
    close_pools()
    verdicts = []
    worker = threading.Thread(
        target=lambda: verdicts.append(run_tests(SOLUTION, TESTS, entry_point="add"))
    )
    worker.start()
    worker.join()

    assert verdicts[0].is_passed
    warm = idle(ZYGOTES) + idle(RUNNERS)
    assert len(warm) == 2
    assert all(sandbox.is_alive for sandbox in warm)  # type: ignore[attr-defined]
    assert run_tests(SOLUTION, TESTS, entry_point="add").is_passed
    assert idle(ZYGOTES) + idle(RUNNERS) == warm  # the same two, reused


def test_jobs_one_after_another_reuse_the_same_two_sandboxes() -> None:
    """The child a sandbox makes ready for its next job is never counted as a job's leftover,
    so a healthy sandbox goes back to the pool after every job."""
    close_pools()
    assert run_tests(SOLUTION, TESTS, entry_point="add").is_passed
    first = idle(ZYGOTES) + idle(RUNNERS)
    for _ in range(10):
        assert run_tests(SOLUTION, TESTS, entry_point="add").is_passed
        assert idle(ZYGOTES) + idle(RUNNERS) == first  # idle() waits for the job to end

    assert len(first) == 2


def test_honest_candidates_pass_right_after_a_fork_bomb() -> None:
    """A fork bomb may take every process while its zygote makes the next job's child."""
    bomb = "import os\ndef add(a, b):\n    while True:\n        os.fork()\n"
    assert not run_tests(bomb, TESTS, entry_point="add").is_passed

    for _ in range(3):
        verdict = run_tests(SOLUTION, TESTS, entry_point="add")
        assert verdict.is_passed, verdict


def test_a_timed_out_job_discards_its_sandboxes() -> None:
    close_pools()
    assert run_tests(SOLUTION, TESTS, entry_point="add").is_passed
    before = idle(ZYGOTES) + idle(RUNNERS)

    verdict = run_tests(
        "import time\ndef add(a, b):\n    time.sleep(1e9)\n",
        TESTS,
        entry_point="add",
        limits=Limits(wall_s=2, call_timeout_s=5),
    )

    assert verdict.reason == "timeout"
    assert not any(sandbox in idle(ZYGOTES) + idle(RUNNERS) for sandbox in before)


def test_state_does_not_leak_between_candidates_of_one_zygote() -> None:
    writer = (
        "import os\nopen('/work/left-behind', 'w').write('x')\n"
        "open('/tmp/left-behind', 'w').write('x')\n"
        "if os.fork() == 0:\n    import time\n    time.sleep(60)\n"
        "def add(a, b):\n    return a + b\n"
    )
    reader = (
        "import os\ndef add(a, b):\n"
        "    seen = os.listdir('/work') + os.listdir('/tmp')\n"
        "    others = [p for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid()]\n"
        "    return a + b if not seen and not others else repr((seen, others))\n"
    )
    close_pools()

    assert run_tests(writer, TESTS, entry_point="add").is_passed
    verdict = run_tests(reader, TESTS, entry_point="add")

    assert verdict.is_passed, verdict


def test_each_job_of_a_runner_starts_in_an_empty_directory() -> None:
    litter = "import os\nopen('left-behind', 'w').write('x')\n\ndef test_add():\n    pass\n"
    check = "import os\n\ndef test_clean():\n    assert os.listdir('.') == []\n"
    RUNNERS.close()

    assert run_tests(SOLUTION, litter, entry_point="add").is_passed
    assert run_tests(SOLUTION, check, entry_point="add").is_passed
