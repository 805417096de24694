"""Test side: run tasks' tests against a proxy of the candidate, report each result.

The candidate's functions are proxies: a call goes out as one line and its result comes back
as one line, both in the plain-value text of literals.py, so only plain values (numbers,
strings, bytes, containers of them) cross, and the tests only ever hold builtins the
decoder built: never an object of the candidate's that could compare equal to anything.
Exceptions come back by name; builtin exception types are re-raised as themselves, but for
those that steer control flow. Results go to a file descriptor only this process holds; the
parent decides the verdict from them.
"""

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

sys.path.insert(0, os.path.dirname(__file__))  # /harness: `-I` leaves the script's own out
import jobs
import literals

sys.set_int_max_str_digits(0)  # ints of any size now cross; tests may print them

# Builtin exceptions cross as themselves, so that `pytest.raises(TypeError)` works; not those
# that steer control flow: a StopIteration from the candidate inside a test's `map` or `zip`
# would silently end the iteration, and the test pass. They arrive as CandidateError, as do
# GeneratorExit, KeyboardInterrupt and SystemExit (not Exceptions at all).
DISCARD_WAIT_S = 1.0  # how long a child that was made for a job and not used may take to go
CONTROL_FLOW = (StopIteration, StopAsyncIteration)
SAFE_EXCEPTIONS = {
    name: value
    for name, value in vars(builtins).items()
    if isinstance(value, type)
    and issubclass(value, Exception)
    and not issubclass(value, CONTROL_FLOW)
}


class CandidateError(Exception):
    """The candidate raised something that is not a builtin exception, or answered garbage."""


class CandidateGone(Exception):
    """The candidate process died or stopped answering."""


class OutputLimit(Exception):
    """A call or its reply is longer than literals.MAX_TEXT_BYTES. Its message starts with
    `output_limit:`, from which the parent labels the verdict."""


class Channel:
    """The tests' end of the pipes to the candidate: one call at a time, one line each way."""

    def __init__(self, request_fd, response_fd, call_timeout_s):
        self.requests = os.fdopen(request_fd, "w", encoding="utf-8", buffering=1)
        self.response_fd = response_fd
        self.buffer = bytearray()
        self.call_timeout_s = call_timeout_s
        self.is_dead = False

    def call(self, name, args, kwargs):
        """The candidate's `name(*args, **kwargs)`, by one deadline for the whole reply."""
        if self.is_dead:
            raise CandidateGone("the candidate stopped answering earlier")
        deadline = time.monotonic() + self.call_timeout_s
        request = encode_call(name, args, kwargs)
        try:
            self.requests.write(request + "\n")
        except (BrokenPipeError, OSError) as error:
            self.is_dead = True
            raise CandidateGone("the candidate exited") from error
        return self.receive(self.read_line(deadline))

    def receive(self, line):
        """The value of a reply line, or the exception it stands for."""
        try:
            reply = literals.decode(line.decode("ascii"))
        except (UnicodeDecodeError, literals.NotPlain) as error:
            raise CandidateError(f"the candidate's reply is not a plain value: {error}") from error
        match reply:
            case ("value", value):
                return value
            case ("raise", str(kind), str(message)):
                raise SAFE_EXCEPTIONS.get(kind, CandidateError)(kind + ": " + message)
            case ("output_limit", str(detail)):
                raise OutputLimit("output_limit: the candidate's reply is " + detail)
            case ("not_plain", str(detail)):
                raise CandidateError("the candidate's value is not a plain value: " + detail)
        raise CandidateError("the candidate's reply is not a reply")

    def read_line(self, deadline):
        """One line from the candidate, by `deadline`; reading stops past the size limit."""
        searched = 0
        while (end := self.buffer.find(b"\n", searched)) < 0:
            if len(self.buffer) > literals.MAX_TEXT_BYTES:
                break
            searched = len(self.buffer)
            self.buffer += self.read_chunk(deadline)
        if end < 0 or end > literals.MAX_TEXT_BYTES:
            self.is_dead = True  # the rest of this reply would be read as the next one
            raise OutputLimit(
                f"output_limit: the candidate's reply is over {literals.LIMIT_MIB} MiB"
            )
        line = bytes(self.buffer[:end])
        del self.buffer[: end + 1]
        return line

    def read_chunk(self, deadline):
        remaining = deadline - time.monotonic()
        ready = remaining > 0 and select.select([self.response_fd], [], [], remaining)[0]
        if not ready:
            self.is_dead = True
            raise CandidateGone("timeout: the candidate did not answer in time")
        chunk = os.read(self.response_fd, 65536)
        if not chunk:
            self.is_dead = True
            raise CandidateGone("the candidate exited")
        return chunk


def encode_call(name, args, kwargs):
    """The request line for one call. Arguments that cannot cross fail the test with an error
    no `pytest.raises(<builtin>)` expects: the test never reached the candidate."""
    try:
        return literals.encode((name, args, kwargs))
    except literals.TooLarge as error:
        raise OutputLimit(f"output_limit: the call to {name} is {error}") from error
    except literals.NotPlain as error:
        raise literals.NotPlain(f"an argument to {name} is not a plain value: {error}") from None


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
    except (CandidateGone, OutputLimit) as error:
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


class Prepared:
    """A forked child of this clean process waiting on `channel` for its job, made while the
    previous job runs, so a job starts without waiting for a fork."""

    def __init__(self, control):
        self.channel, theirs = socket.socketpair()
        try:  # a running job's tests may have taken every process the budget allows
            self.child = os.fork()
        except OSError:
            self.child = None
        if self.child == 0:
            control.close()
            self.channel.close()
            run_child(theirs)
        theirs.close()

    def hand(self, job, fds):
        """Give the child its job; False if it cannot take it."""
        if self.child is None:
            return False
        try:
            jobs.send(self.channel, job, fds)
            return True
        except OSError:
            return False

    def discard(self):
        """Close it (a child still waiting for a job exits) and reap it."""
        self.channel.close()
        if self.child is not None:
            reap(self.child, time.monotonic() + DISCARD_WAIT_S)


def run_child(channel):
    """Wait for a job, then run it in its own working directory; never returns."""
    try:
        job, fds = jobs.receive(channel)
        channel.close()
        if job is not None:
            os.chdir(job["workdir"])
            resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"]))
            run_job(job, *fds)
    finally:
        os._exit(0)


def serve(control):
    """A warm test runner: one job at a time, each in a forked child of this clean process.

    A job arrives as `receive` reads it. This process never runs tests itself, so every job
    starts from the same state, in an empty working directory removed afterwards; it kills a
    job that outlives its wall clock.
    """
    prepared = Prepared(control)
    for number in itertools.count():
        job, fds = jobs.receive(control)
        if job is None:
            prepared.discard()
            return
        deadline = time.monotonic() + job["wall_s"]
        job["workdir"] = f"/work/job-{number}"
        os.mkdir(job["workdir"])
        if not prepared.hand(job, fds):
            prepared.discard()
            prepared = Prepared(control)
            prepared.hand(job, fds)  # if this one cannot either, the job's pipes just close
        for fd in fds:
            os.close(fd)
        current, prepared = prepared, Prepared(control)  # the next job's, made meanwhile
        current.channel.close()
        if current.child is not None:
            reap(current.child, deadline)
        shutil.rmtree(job["workdir"], ignore_errors=True)
        control.sendall(b'{"done": true}\n')


def reap(child, deadline):
    """Wait for the job's child to exit (woken by its pidfd, not by polling), killing it at
    the deadline."""
    exited = os.pidfd_open(child)
    try:
        remaining = deadline - time.monotonic()
        if not select.select([exited], [], [], max(remaining, 0.0))[0]:
            os.kill(child, signal.SIGKILL)
        os.waitpid(child, 0)
    finally:
        os.close(exited)


def main():
    control = socket.socket(fileno=int(sys.argv[1]))
    control.sendall(b'{"ready": true}\n')
    serve(control)


main()
