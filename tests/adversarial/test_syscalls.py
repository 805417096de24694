"""The seccomp filter: every denied call fails with EPERM inside the candidate, the harness
lives on, and what honest code uses (threads, fork, subprocesses, /dev/shm) still works."""

from __future__ import annotations

import subprocess

from flywheel.sandbox import Limits, run_tests
from flywheel.sandbox.harness.syscalls import DENIED_SYSCALLS

TESTS = "from solution import probe\n\ndef test_probe():\n    assert probe() == [], probe()\n"
LIMITS = Limits(wall_s=10, call_timeout_s=8)
CLONE_NEWUSER, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x40000000, 17


def syscall_numbers(names: tuple[str, ...]) -> dict[str, int]:
    """This machine's numbers for `names`, as libseccomp resolves them."""
    listing = subprocess.run(
        [
            "/usr/bin/python3", "-I", "-c",
            "import seccomp, sys\nfor name in sys.argv[1:]:\n"
            "    print(name, seccomp.resolve_syscall(seccomp.Arch.NATIVE, name))",
            *names,
        ],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return {name: int(number) for name, number in map(str.split, listing.stdout.splitlines())}


def test_every_denied_syscall_fails_with_eperm() -> None:
    numbers = syscall_numbers(DENIED_SYSCALLS)
    solution = f"""
import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
def probe():
    wrong = []
    for name, number in {numbers!r}.items():
        ctypes.set_errno(0)
        if libc.syscall(number, 0, 0, 0, 0, 0, 0) != -1 or ctypes.get_errno() != errno.EPERM:
            wrong.append((name, ctypes.get_errno()))
    return wrong
"""
    verdict = run_tests(solution, TESTS, entry_point="probe", limits=LIMITS)

    assert verdict.is_passed, verdict.tests[0].message


def test_no_new_namespaces_by_clone_or_unshare() -> None:
    numbers = syscall_numbers(("clone", "clone3", "unshare"))
    solution = f"""
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
clone = lambda flags: libc.syscall({numbers["clone"]}, flags, 0, 0, 0, 0)
def probe():
    got = {{}}
    for name, call in (
        ('unshare user', lambda: libc.syscall({numbers["unshare"]}, {CLONE_NEWUSER})),
        ('clone user', lambda: clone({CLONE_NEWUSER | SIGCHLD})),
        ('clone net', lambda: clone({CLONE_NEWNET | SIGCHLD})),
        ('clone3', lambda: libc.syscall({numbers["clone3"]}, 0, 0)),
    ):
        ctypes.set_errno(0)
        result = call()
        if result == 0:
            os._exit(0)  # a child made it: it must not answer for the parent
        got[name] = (result, ctypes.get_errno())
    expected = {{name: (-1, errno.EPERM) for name in got}}
    expected['clone3'] = (-1, errno.ENOSYS)  # so that libc falls back to clone
    return [item for item in got.items() if item[1] != expected[item[0]]]
"""
    verdict = run_tests(solution, TESTS, entry_point="probe", limits=LIMITS)

    assert verdict.is_passed, verdict.tests[0].message


def test_honest_code_keeps_threads_fork_subprocesses_and_shared_memory() -> None:
    solution = """
import os, subprocess, threading
from multiprocessing import shared_memory
def probe():
    wrong = []
    results = []
    thread = threading.Thread(target=lambda: results.append('thread'))
    thread.start()
    thread.join()
    if results != ['thread']:
        wrong.append('thread')
    pid = os.fork()
    if pid == 0:
        os._exit(7)
    if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 7:
        wrong.append('fork')
    if subprocess.run(['/usr/bin/true']).returncode != 0:
        wrong.append('subprocess')
    block = shared_memory.SharedMemory(create=True, size=4096)
    block.buf[0] = 1
    block.close()
    block.unlink()
    return wrong
"""
    verdict = run_tests(solution, TESTS, entry_point="probe", limits=LIMITS)

    assert verdict.is_passed, verdict
