"""Test side: run tasks' tests against a proxy of the candidate, report each result.

The candidate's functions are proxies: arguments go out as `repr`, results come back through
`ast.literal_eval`, so only plain values (numbers, strings, lists, dicts, ...) cross and the
candidate can never hand the tests an object that compares equal to anything. Exceptions come
back by name; only builtin exception types are re-raised as themselves. Results go to a file
descriptor only this process holds; the parent decides the verdict from them.
"""

import ast
import builtins
import itertools
import json
import os
import resource
import select
import shutil
import signal
import socket
import sys
import time
import types

SAFE_EXCEPTIONS = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type) and issubclass(value, Exception)
}


class CandidateError(Exception):
    """The candidate raised something that is not a builtin exception, or answered garbage."""


class CandidateGone(Exception):
    """The candidate process died or stopped answering."""


class Channel:
    def __init__(self, request_fd, response_fd, call_timeout_s):
        self.requests = os.fdopen(request_fd, "w", encoding="utf-8", buffering=1)
        self.response_fd = response_fd
        self.buffer = b""
        self.call_timeout_s = call_timeout_s
        self.is_dead = False

    def call(self, name, args, kwargs):
        if self.is_dead:
            raise CandidateGone("the candidate stopped answering earlier")
        try:
            self.requests.write(
                json.dumps({"name": name, "args": repr(args), "kwargs": repr(kwargs)}) + "\n"
            )
        except (BrokenPipeError, OSError) as error:
            self.is_dead = True
            raise CandidateGone("the candidate exited") from error
        reply = json.loads(self.read_line())
        if "raise" in reply:
            kind = SAFE_EXCEPTIONS.get(reply["raise"], CandidateError)
            raise kind(reply["raise"] + ": " + reply.get("message", ""))
        try:
            return ast.literal_eval(reply["value"])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
            raise CandidateError("the candidate returned a value that is not a literal") from error

    def read_line(self):
        while b"\n" not in self.buffer:
            ready, _, _ = select.select([self.response_fd], [], [], self.call_timeout_s)
            if not ready:
                self.is_dead = True
                raise CandidateGone("timeout: the candidate did not answer in time")
            chunk = os.read(self.response_fd, 65536)
            if not chunk:
                self.is_dead = True
                raise CandidateGone("the candidate exited")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line


def proxy(channel, name):
    def call(*args, **kwargs):
        return channel.call(name, args, kwargs)

    call.__name__ = name
    return call


class Raises:
    def __init__(self, expected):
        self.expected = expected

    def __enter__(self):
        return self

    def __exit__(self, kind, value, traceback):
        if kind is None:
            raise AssertionError("DID NOT RAISE " + repr(self.expected))
        return issubclass(kind, self.expected)


class TestGlobals(dict):
    """The tests' globals: a name they use but do not define, and that is not a builtin,
    is the candidate's (HumanEval tests call helpers the prompt defined, like `poly`)."""

    def __init__(self, channel, **names):
        super().__init__(**names)
        self.channel = channel

    def __missing__(self, name):
        if name.startswith("__") or hasattr(builtins, name):
            raise KeyError(name)
        return proxy(self.channel, name)


def install_modules(channel):
    """`from solution import f`, `import solution` and a minimal `pytest.raises`."""
    solution = types.ModuleType("solution")
    solution.__getattr__ = lambda name: proxy(channel, name)
    sys.modules["solution"] = solution
    pytest = types.ModuleType("pytest")
    pytest.raises = Raises
    sys.modules["pytest"] = pytest


def collect(namespace, entry_point, channel):
    tests = [
        (name, value)
        for name, value in namespace.items()
        if name.startswith("test") and callable(value) and not isinstance(value, type)
    ]
    if callable(namespace.get("check")):
        candidate = proxy(channel, entry_point)
        tests.append(("check", lambda: namespace["check"](candidate)))
    return tests


def run_one(test):
    try:
        test()
        return "passed", ""
    except AssertionError as error:
        return "failed", "assertion failed: " + str(error)[:500]
    except CandidateGone as error:
        return "failed", str(error)
    except BaseException as error:
        return "failed", type(error).__name__ + ": " + str(error)[:500]


def run_job(job, request_fd, response_fd, results_fd):
    """Run one task's tests against the candidate behind the given pipes."""
    results = os.fdopen(results_fd, "w", encoding="utf-8", buffering=1)
    channel = Channel(request_fd, response_fd, job["call_timeout_s"])
    install_modules(channel)
    namespace = TestGlobals(channel, __name__="tests")
    namespace[job["entry_point"]] = proxy(channel, job["entry_point"])
    exec(compile(job["tests"], "tests.py", "exec"), namespace)
    tests = collect(namespace, job["entry_point"], channel)
    # Declared before any runs: the parent scores a test that never reports as failed.
    results.write(json.dumps({"collected": [name for name, _ in tests]}) + "\n")
    for name, test in tests:
        status, message = run_one(test)
        results.write(json.dumps({"test": name, "status": status, "message": message}) + "\n")
    results.write(json.dumps({"done": len(tests)}) + "\n")


def serve(control):
    """A warm test runner: one job at a time, each in a forked child of this clean process.

    A job arrives as an 8-byte length with the job's three pipe ends attached (SCM_RIGHTS),
    then that many bytes of JSON. This process never runs tests itself, so every job starts
    from the same state, in an empty working directory removed afterwards; it kills a job
    that outlives its wall clock.
    """
    for number in itertools.count():
        header, fds, _, _ = socket.recv_fds(control, 8, 3)
        if not header:
            return
        payload = b""
        size = int.from_bytes(header, "big")
        while len(payload) < size:
            chunk = control.recv(size - len(payload))
            if not chunk:
                return
            payload += chunk
        job = json.loads(payload)
        workdir = f"/work/job-{number}"
        os.mkdir(workdir)
        child = os.fork()
        if child == 0:
            control.close()
            os.chdir(workdir)
            resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"]))
            try:
                run_job(job, *fds)
            finally:
                os._exit(0)
        for fd in fds:
            os.close(fd)
        reap(child, time.monotonic() + job["wall_s"])
        shutil.rmtree(workdir, ignore_errors=True)
        control.sendall(b'{"done": true}\n')


def reap(child, deadline):
    while True:
        pid, _ = os.waitpid(child, os.WNOHANG)
        if pid:
            return
        if time.monotonic() > deadline:
            os.kill(child, signal.SIGKILL)
            os.waitpid(child, 0)
            return
        time.sleep(0.002)


def main():
    control = socket.socket(fileno=int(sys.argv[1]))
    control.sendall(b'{"ready": true}\n')
    serve(control)


main()
