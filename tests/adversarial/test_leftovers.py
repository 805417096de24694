"""Nothing of one candidate survives its job: a poisoner, then honest candidates in the same
warm sandbox, must find no file, shared memory, IPC object, key, socket or process of it."""

from __future__ import annotations

from pathlib import Path

from flywheel.sandbox import run_tests
from flywheel.sandbox.warm import ZYGOTES, WarmSandbox, close_pools
from tests.adversarial.host import SANDBOX_UID_MIN

TESTS = "from solution import add\n\ndef test_add():\n    assert add(2, 3) == 5, add(2, 3)\n"
KEY = 0x0F1A  # the SysV IPC key both use

POISONER = f"""
import ctypes, os, socket, time
libc = ctypes.CDLL(None, use_errno=True)
for path in ('/dev/shm/poison', '/dev/poison', '/work/poison', '/tmp/poison'):
    try:
        with open(path, 'wb') as f:
            f.write(b'x' * 2**20)
    except OSError:
        pass
libc.shmget({KEY}, 2**20, 0o1666)
libc.msgget({KEY}, 0o1666)
libc.semget({KEY}, 1, 0o1666)
libc.mq_open(b'/poison', os.O_CREAT | os.O_RDWR, 0o666, None)
for keyring in (-3, -4, -5):  # add_key to the session, user and user-session keyrings
    libc.syscall(248, b'user', b'poison', b'secret', 6, keyring)
libc.sethostname(b'poisoned', 8)
listener = socket.socket(socket.AF_UNIX)
listener.bind('\\0poison')
listener.listen()
if os.fork() == 0:
    os.setsid()
    time.sleep(60)
def add(a, b):
    return a + b
"""

READER = f"""
import ctypes, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def add(a, b):
    seen = [path for path in ('/dev/shm', '/work', '/tmp') for path in os.listdir(path)]
    seen += [name for name in ('poison',) if os.path.exists('/dev/' + name)]
    for what, found in (
        ('shm', libc.shmget({KEY}, 0, 0)),
        ('msg', libc.msgget({KEY}, 0)),
        ('sem', libc.semget({KEY}, 0, 0)),
        ('mq', libc.mq_open(b'/poison', os.O_RDONLY)),
    ):
        if found != -1:
            seen.append(what)
    seen += open('/proc/keys').read().splitlines()
    for table in ('shm', 'msg', 'sem'):
        seen += open('/proc/sysvipc/' + table).read().splitlines()[1:]
    if socket.gethostname() == 'poisoned':
        seen.append('hostname')
    try:
        socket.socket(socket.AF_UNIX).connect('\\0poison')
        seen.append('abstract socket')
    except OSError:
        pass
    seen += [pid for pid in os.listdir('/proc') if pid.isdigit() and int(pid) != os.getpid()]
    return a + b if not seen else repr(seen)
"""


def keys_of_sandbox_uids() -> list[str]:
    """/proc/key-users rows of sandbox uids that hold keys."""
    rows = [line.split() for line in Path("/proc/key-users").read_text().splitlines()]
    return [
        " ".join(row)
        for row in rows
        if int(row[0].rstrip(":")) >= SANDBOX_UID_MIN and row[2].split("/")[0] != "0"
    ]


def idle_zygotes() -> list[WarmSandbox]:
    """The idle zygotes, once the last job's is back (a job ends after its verdict)."""
    assert ZYGOTES.wait_returned()
    return list(ZYGOTES._idle)


def test_a_poisoner_leaves_nothing_for_the_next_candidates() -> None:
    close_pools()

    assert run_tests(POISONER, TESTS, entry_point="add").is_passed
    zygote = idle_zygotes()
    assert len(zygote) == 1  # the same warm sandbox serves the honest candidates next
    for _ in range(2):
        verdict = run_tests(READER, TESTS, entry_point="add")
        assert verdict.is_passed, verdict.tests[0].message
        assert idle_zygotes() == zygote
    assert keys_of_sandbox_uids() == []


def test_a_poisoners_memory_is_freed_with_its_job() -> None:
    """1 MiB in each of /dev/shm, /work and /tmp: an idle sandbox gives it all back."""
    close_pools()
    assert run_tests("def add(a, b):\n    return a + b\n", TESTS, entry_point="add").is_passed
    (zygote,) = idle_zygotes()
    assert zygote.budget is not None
    idle_bytes = zygote.budget._memory_usage()

    assert run_tests(POISONER, TESTS, entry_point="add").is_passed

    assert idle_zygotes() == [zygote]
    assert zygote.budget._memory_usage() < idle_bytes + 2**20
