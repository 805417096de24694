"""Candidate side: a zygote that gives each solution a fresh, isolated child to run in.

This process starts once per warm sandbox, never runs candidate code itself, and for each
job forks a child that enters new user, mount, pid, IPC, UTS and network namespaces (fresh
size-capped /work, /tmp and /dev/shm, its own /proc, SysV IPC and loopback, pid 1 of its own
pid namespace so nothing it starts outlives it), asks to be the OOM killer's first choice,
sets the job's rlimits, drops every capability, installs the seccomp filter, then loads the
solution and answers calls, one line each way in the plain-value text of literals.py.
Nothing it makes survives the job: every namespace and mount of it dies with its last
process, and kernel keys cannot be made at all:

request fd:  `(name, args, kwargs)`
response fd: `("value", value)`, `("raise", "<type name>", message)`, or why the value
             cannot cross: `("not_plain", why)`, `("output_limit", why)`

It never sees the tests or any expected value. On its control socket it says it is ready once
started; after each job (which ends when the host sends a byte saying the tests are over, if
it has not ended before) it reports the job's peak memory.
"""

import ctypes
import json
import os
import resource
import select
import signal
import socket
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))  # /harness: `-I` leaves the script's own out
import literals

sys.set_int_max_str_digits(0)  # a solution may str() the big ints it is now given

LIBC = ctypes.CDLL(None, use_errno=True)
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWPID = 0x10000000, 0x00020000, 0x20000000
CLONE_NEWIPC, CLONE_NEWUTS, CLONE_NEWNET = 0x08000000, 0x04000000, 0x40000000
NEW_NAMESPACES = (
    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET
)
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 2, 4, 8, 0x4000, 1 << 18
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS = 1, 38
MIB = 1024 * 1024
STOP_GRACE_S = 1.0


class CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def check(result, what):
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, what + ": " + os.strerror(errno))


def enter_namespaces(job):
    """New user, mount, pid, IPC, UTS and network namespaces with fresh size-capped /work,
    /tmp and /dev/shm (the sandbox's /dev is read-only, so nothing else there is writable)."""
    uid, gid = os.getuid(), os.getgid()
    check(LIBC.unshare(NEW_NAMESPACES), "unshare")
    for name, text in (
        ("setgroups", "deny"),
        ("uid_map", f"{uid} {uid} 1"),
        ("gid_map", f"{gid} {gid} 1"),
    ):
        with open("/proc/self/" + name, "w") as control:
            control.write(text)
    check(LIBC.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None), "mount private")
    scratch = job["scratch_mb"] * MIB
    mounts = ((b"/work", job["tmpfs_mb"] * MIB), (b"/tmp", scratch), (b"/dev/shm", scratch))
    for path, size in mounts:
        options = b"size=" + str(size).encode()
        check(LIBC.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount tmpfs")


def confine(job, denied):
    """In the job's pid-1 process: own /proc, first in line for the OOM killer, rlimits, no
    capabilities, no new privileges, the seccomp filter (`denied`; None when unsandboxed)."""
    is_sandboxed = denied is not None
    check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    with open("/proc/self/oom_score_adj", "w") as oom:
        oom.write("1000")
    if is_sandboxed:
        check(
            LIBC.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "proc"
        )
        os.chdir("/work")
    for limit, value in (
        (resource.RLIMIT_CPU, job["cpu_s"]),
        (resource.RLIMIT_AS, job["process_memory_mb"] * MIB),
        (resource.RLIMIT_NPROC, job["max_processes"]),
        (resource.RLIMIT_FSIZE, job["max_file_mb"] * MIB),
        (resource.RLIMIT_NOFILE, job["max_open_files"]),
    ):
        resource.setrlimit(limit, (value, value))
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if is_sandboxed:
        check(LIBC.capset(ctypes.byref(CapHeader(0x20080522, 0)), (CapData * 2)()), "capset")
        denied.load()


def answer_calls(source, requests, responses):
    namespace = {"__name__": "solution"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
        loaded = None
    except BaseException as error:  # the solution itself may be broken: report it per call
        loaded = error
    for line in requests:
        reply = answer(namespace, loaded, literals.decode(line.rstrip("\n")))
        responses.write(encode_reply(reply) + "\n")


def answer(namespace, loaded, request):
    """The reply to one `(name, args, kwargs)` call: its value or what it raised."""
    if loaded is not None:
        return ("raise", type(loaded).__name__, "solution did not load: " + str(loaded))
    name, args, kwargs = request
    function = namespace.get(name)
    if not callable(function):
        return ("raise", "NameError", "solution defines no function " + name)
    try:
        return ("value", function(*args, **kwargs))
    except BaseException as error:
        return ("raise", type(error).__name__, str(error)[:1000])


def encode_reply(reply):
    """The reply as a line; a value that cannot cross is answered with the reason instead."""
    try:
        return literals.encode(reply)
    except literals.TooLarge as error:
        return literals.encode(("output_limit", str(error)))
    except literals.NotPlain as error:
        return literals.encode(("not_plain", str(error)))


def run_job(job, fds, control, denied):
    """Fork the isolated child for one job; return its peak memory in KiB."""
    request_fd, response_fd, output_fd = fds
    middle = os.fork()
    if middle == 0:
        try:
            if denied is not None:
                enter_namespaces(job)
            inner = os.fork()  # pid 1 of the new pid namespace
            if inner == 0:
                confine(job, denied)
                os.dup2(output_fd, 1)
                os.dup2(output_fd, 2)
                close_all_but({request_fd, response_fd})
                sys.stdout = os.fdopen(1, "w", buffering=1)
                sys.stderr = os.fdopen(2, "w", buffering=1)
                requests = os.fdopen(request_fd, "r", encoding="utf-8")
                responses = os.fdopen(response_fd, "w", encoding="utf-8", buffering=1)
                answer_calls(job["solution"], requests, responses)
                os._exit(0)
            for fd in fds:
                os.close(fd)
            # When told to stop: kill pid 1; waitpid returns once its namespace is empty.
            signal.signal(signal.SIGTERM, lambda *_: os.kill(inner, signal.SIGKILL))
            os.waitpid(inner, 0)
        except BaseException as error:  # say why in the job's output; the verdict shows it
            os.write(output_fd, ("sandbox setup failed: " + repr(error) + "\n").encode())
        finally:
            os._exit(0)
    for fd in fds:
        os.close(fd)
    return reap(middle, control, time.monotonic() + job["wall_s"])


def close_all_but(keep):
    """Close every descriptor above 2 but `keep` (the control socket above all)."""
    start = 3
    for fd in sorted(keep):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, 65536)


def reap(child, control, deadline):
    """Wait for the job to exit, and end it early when the host says its tests are over (a
    byte on the control socket; a candidate is of no more use then) or at the deadline.
    Returns its peak resident memory in KiB once the host has said the job is over. Waits
    wake on the child's pidfd and the socket, never on a polling interval."""
    exited = os.pidfd_open(child)
    try:
        ready = select.select([exited, control], [], [], max(deadline - time.monotonic(), 0))[0]
        is_over = control in ready
        if is_over:
            control.recv(1)  # one byte, or b"" if the host closed the socket: over either way
        # Stopped unless it has exited: told to stop, or out of time.
        usage = os.wait4(child, 0)[2] if exited in ready else stop(child, exited)
    finally:
        os.close(exited)
    if not is_over:
        control.recv(1)  # the host always says so (or closes the socket)
    return usage.ru_maxrss


def stop(child, exited):
    """Ask the job's middle process to kill its pid 1 and wait for the whole namespace to
    go (so nothing of the job is left when this returns); kill it outright if it cannot."""
    os.kill(child, signal.SIGTERM)
    if not select.select([exited], [], [], STOP_GRACE_S)[0]:
        os.kill(child, signal.SIGKILL)  # its pid-1 child dies by PDEATHSIG, and all with it
    return os.wait4(child, 0)[2]


def receive(control):
    header, fds, _, _ = socket.recv_fds(control, 8, 3)
    if not header:
        return None, ()
    size, payload = int.from_bytes(header, "big"), b""
    while len(payload) < size:
        chunk = control.recv(size - len(payload))
        if not chunk:
            return None, ()
        payload += chunk
    return json.loads(payload), tuple(fds)


def main():
    control = socket.socket(fileno=int(sys.argv[1]))
    import syscalls  # from /harness, like literals

    denied = syscalls.build_filter() if sys.argv[2] == "sandboxed" else None
    control.sendall(b'{"ready": true}\n')
    while True:
        job, fds = receive(control)
        if job is None:
            return
        peak_kib = run_job(job, fds, control, denied)
        control.sendall(json.dumps({"peak_rss_kib": peak_kib}).encode() + b"\n")


main()
