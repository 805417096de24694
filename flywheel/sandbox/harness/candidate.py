"""Candidate side: a zygote that gives each solution a fresh, isolated child to run in.

This process starts once per warm sandbox, never runs candidate code itself, and gives each
job a child of its own, forked while the previous job ran (`Prepared`), that enters new user,
mount, pid, IPC, UTS and network namespaces (fresh size-capped /work, /tmp and /dev/shm, its
own /proc, SysV IPC and loopback, pid 1 of its own pid namespace so nothing it starts
outlives it), asks to be the OOM killer's first choice, drops every capability and installs
the seccomp filter; then waits. Once its job arrives it sets the job's rlimits, loads the
solution and answers calls, one line each way in the plain-value text of literals.py. A
child serves one job only; jobs share nothing but the zygote they were forked from.
Nothing it makes survives the job: every namespace and mount of it dies with its last
process, and kernel keys cannot be made at all:

request fd:  `(name, args, kwargs)`
response fd: `("value", value)`, `("raise", "<type name>", message)`, or why the value
             cannot cross: `("not_plain", why)`, `("output_limit", why)`

Modules named after its mode on the command line are imported before it says it is ready, so
that its children start with them (the environments' zygotes preload what environments
import). It never sees the tests or any expected value. On its control socket it says it is
ready once started; after each job (which ends when the host sends a byte saying the tests
are over, if it has not ended before) it reports the job's peak memory.
"""

import contextlib
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
import jobs
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
HELD_PROCESSES = 2  # a child made ready for the next job: its middle process and its pid 1


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


def enter_namespaces(sizes):
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
    work_mb, scratch_mb = sizes
    scratch = scratch_mb * MIB
    mounts = ((b"/work", work_mb * MIB), (b"/tmp", scratch), (b"/dev/shm", scratch))
    for path, size in mounts:
        options = b"size=" + str(size).encode()
        check(LIBC.mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, options), "mount tmpfs")


def confine(denied):
    """In the job's pid-1 process, before its job arrives: own /proc, first in line for the
    OOM killer, no capabilities, no new privileges, the seccomp filter (`denied`; None when
    unsandboxed). The job's rlimits follow once it has arrived (lowering one needs no
    capability)."""
    is_sandboxed = denied is not None
    check(LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
    with open("/proc/self/oom_score_adj", "w") as oom:
        oom.write("1000")
    if is_sandboxed:
        check(
            LIBC.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None), "proc"
        )
        os.chdir("/work")
    check(LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if is_sandboxed:
        check(LIBC.capset(ctypes.byref(CapHeader(0x20080522, 0)), (CapData * 2)()), "capset")
        denied.load()


def set_job_limits(job):
    # The sandbox uid's process count includes the next job's child, made meanwhile.
    for limit, value in (
        (resource.RLIMIT_CPU, job["cpu_s"]),
        (resource.RLIMIT_AS, job["process_memory_mb"] * MIB),
        (resource.RLIMIT_NPROC, job["max_processes"] + HELD_PROCESSES),
        (resource.RLIMIT_FSIZE, job["max_file_mb"] * MIB),
        (resource.RLIMIT_NOFILE, job["max_open_files"]),
    ):
        resource.setrlimit(limit, (value, value))


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


class Prepared:
    """A child made ready before its job: namespaces entered, /work, /tmp and /dev/shm
    mounted at `sizes`, confined but for the job's rlimits, waiting on `channel` for the job.
    Made while the previous job runs, so a job starts without waiting for any of that."""

    def __init__(self, sizes, denied):
        self.sizes = sizes
        self.channel, theirs = socket.socketpair()
        try:  # a running job may have taken every process its budget allows
            self.middle = os.fork()
        except OSError as error:
            self.middle, self.failure = None, "sandbox setup failed: " + repr(error)
            theirs.close()
            return
        if self.middle == 0:
            self.channel.close()
            run_middle(sizes, denied, theirs)
        theirs.close()
        said = self.channel.recv(4096)  # "R" once ready; what failed, or nothing, if not
        self.failure = None if said == b"R" else said.decode(errors="replace") or "it exited"

    def hand(self, job, fds):
        """Give the child its job; False if it cannot take it (it failed, or it was killed)."""
        if self.failure is not None:
            return False
        try:
            jobs.send(self.channel, job, fds)
            return True
        except OSError as error:
            self.failure = repr(error)
            return False

    def discard(self):
        """Close it (a child still waiting for a job exits) and reap it."""
        self.channel.close()
        if self.middle is not None:
            stop(self.middle, grace_s=STOP_GRACE_S)


def run_middle(sizes, denied, channel):
    """The child's first process: enters the namespaces, forks the job's pid 1 (it must be
    forked after unsharing the pid namespace) and waits for it; never returns."""
    close_all_but({channel.fileno()})  # the zygote's: its control socket, other children's
    try:
        if denied is not None:
            enter_namespaces(sizes)
        inner = os.fork()  # pid 1 of the new pid namespace
        if inner == 0:
            run_inner(denied, channel)
        channel.close()
        # When told to stop: kill pid 1; waitpid returns once its namespace is empty.
        signal.signal(signal.SIGTERM, lambda *_: os.kill(inner, signal.SIGKILL))
        os.waitpid(inner, 0)
    except BaseException as error:  # said to the zygote, which puts it in the job's output
        with contextlib.suppress(OSError):
            channel.sendall(("sandbox setup failed: " + repr(error)).encode())
    finally:
        os._exit(0)


def run_inner(denied, channel):
    """The job's pid 1: confined, says it is ready, then waits for its job and answers its
    calls; never returns."""
    try:
        confine(denied)
    except BaseException as error:
        channel.sendall(("sandbox setup failed: " + repr(error)).encode())
        os._exit(0)
    channel.sendall(b"R")
    job, fds = jobs.receive(channel)
    if job is None:  # discarded unused
        os._exit(0)
    set_job_limits(job)
    request_fd, response_fd, output_fd = fds
    os.dup2(output_fd, 1)
    os.dup2(output_fd, 2)
    close_all_but({request_fd, response_fd})
    sys.stdout = os.fdopen(1, "w", buffering=1)
    sys.stderr = os.fdopen(2, "w", buffering=1)
    requests = os.fdopen(request_fd, "r", encoding="utf-8")
    responses = os.fdopen(response_fd, "w", encoding="utf-8", buffering=1)
    answer_calls(job["solution"], requests, responses)
    os._exit(0)


def run_job(job, fds, control, prepared, denied):
    """Run one job in `prepared` (or, if it cannot take this job, in a child made now);
    return the job's peak memory in KiB and the child made ready for the next job."""
    deadline = time.monotonic() + job["wall_s"]
    sizes = (job["tmpfs_mb"], job["scratch_mb"])
    if prepared is None or prepared.sizes != sizes or not prepared.hand(job, fds):
        if prepared is not None:
            prepared.discard()
        prepared = Prepared(sizes, denied)
        if not prepared.hand(job, fds):  # say why in the job's output; the verdict shows it
            os.write(fds[2], (str(prepared.failure) + "\n").encode())
    for fd in fds:
        os.close(fd)
    following = Prepared(sizes, denied)  # made while this job runs
    peak_kib = reap(prepared, control, deadline)
    return peak_kib, following


def close_all_but(keep):
    """Close every descriptor above 2 but `keep` (the control socket above all)."""
    start = 3
    for fd in sorted(keep):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, 65536)


def reap(prepared, control, deadline):
    """Wait for the job to exit, and end it early when the host says its tests are over (a
    byte on the control socket; a candidate is of no more use then) or at the deadline.
    Returns its peak resident memory in KiB once the host has said the job is over. Waits
    wake on the child's pidfd and the socket, never on a polling interval."""
    if prepared.middle is None:  # it never started: nothing to wait for
        prepared.channel.close()
        control.recv(1)
        return 0
    exited = os.pidfd_open(prepared.middle)
    try:
        ready = select.select([exited, control], [], [], max(deadline - time.monotonic(), 0))[0]
        is_over = control in ready
        if is_over:
            control.recv(1)  # one byte, or b"" if the host closed the socket: over either way
        prepared.channel.close()
        # Stopped unless it has exited: told to stop, or out of time.
        usage = os.wait4(prepared.middle, 0)[2] if exited in ready else stop(prepared.middle)
    finally:
        os.close(exited)
    if not is_over:
        control.recv(1)  # the host always says so (or closes the socket)
    return usage.ru_maxrss


def stop(middle, grace_s=STOP_GRACE_S):
    """Ask a child's middle process to kill its pid 1 and wait for the whole namespace to
    go (so nothing of the job is left when this returns); kill it outright if it cannot."""
    exited = os.pidfd_open(middle)
    try:
        os.kill(middle, signal.SIGTERM)
        if not select.select([exited], [], [], grace_s)[0]:
            os.kill(middle, signal.SIGKILL)  # its pid-1 child dies by PDEATHSIG, and all with it
        return os.wait4(middle, 0)[2]
    finally:
        os.close(exited)


def main():
    control = socket.socket(fileno=int(sys.argv[1]))
    import syscalls  # from /harness, like literals

    denied = syscalls.build_filter() if sys.argv[2] == "sandboxed" else None
    for name in sys.argv[3:]:  # standard modules its jobs import: imported once, here
        __import__(name)
    control.sendall(b'{"ready": true}\n')
    prepared = None
    while True:
        job, fds = jobs.receive(control)
        if job is None:
            if prepared is not None:
                prepared.discard()
            return
        peak_kib, prepared = run_job(job, fds, control, prepared, denied)
        held = 0 if prepared.failure else HELD_PROCESSES
        report = {"peak_rss_kib": peak_kib, "held_processes": held}
        control.sendall(json.dumps(report).encode() + b"\n")


main()
