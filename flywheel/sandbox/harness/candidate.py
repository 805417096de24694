"""Candidate side: load the solution, then answer calls with literal values only.

Runs alone in its own sandbox: it never sees the tests or any expected value. Each request is
one JSON line `{"name": ..., "args": "<repr of a tuple>", "kwargs": "<repr of a dict>"}` on the
request fd; each answer one JSON line on the response fd: `{"value": "<repr>"}` or
`{"raise": "<exception type name>", "message": "..."}`.
"""

import ast
import json
import os
import sys


def main() -> None:
    request_fd, response_fd = int(sys.argv[1]), int(sys.argv[2])
    requests = os.fdopen(request_fd, "r", encoding="utf-8")
    responses = os.fdopen(response_fd, "w", encoding="utf-8", buffering=1)
    namespace = {"__name__": "solution"}
    try:
        with open(sys.argv[3], encoding="utf-8") as source:
            exec(compile(source.read(), "solution.py", "exec"), namespace)
        loaded = None
    except BaseException as error:  # the solution itself may be broken: report it per call
        loaded = error
    for line in requests:
        responses.write(json.dumps(answer(namespace, loaded, json.loads(line))) + "\n")


def answer(namespace, loaded, request):
    if loaded is not None:
        return {"raise": type(loaded).__name__, "message": "solution did not load: " + str(loaded)}
    function = namespace.get(request["name"])
    if not callable(function):
        return {"raise": "NameError", "message": "solution defines no function " + request["name"]}
    try:
        args = ast.literal_eval(request["args"])
        kwargs = ast.literal_eval(request["kwargs"])
        return {"value": repr(function(*args, **kwargs))}
    except BaseException as error:
        return {"raise": type(error).__name__, "message": str(error)[:1000]}


main()
