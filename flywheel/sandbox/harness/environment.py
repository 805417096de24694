"""Environment side of an episode: the "solution" a candidate child (candidate.py) runs.

It holds one episode's environment instances for the whole episode, in the sandbox of a
candidate child (its namespaces, seccomp filter, rlimits and cgroup budget), and answers the
host's calls over the candidate's literal channel, one at a time:

start(source, classes, options)  exec the environment's source as module "environment",
    instantiate each class of `classes` ({name: config}) with no arguments and load its
    config: `_load_scenario(config)` where the class has it (BFCL's convention), else the
    config's keys set as attributes. Returns the tool names.
call(name, arguments)  one tool call: ("ok", text) or ("error", "Error: ..."). The text is
    the tool message, as BFCL makes it: a str as it is, a dict as JSON, anything else as
    str(). An unknown or private name, arguments the method does not take, and anything the
    method raises are errors; the episode goes on. Texts are cut to options'
    max_result_chars.
state()  {class name: {attribute: value}} of each instance's public attributes (`vars`,
    names not starting with "_"): plain values as they are, any other value as its repr.

A MemoryError is not caught: the host reads it as the episode's memory budget spent and ends
the episode. The CPU budget's soft limit is set a second below the hard one, so that running
out says so on stderr ("cpu_limit:") before the kernel's SIGKILL.
"""

import inspect
import json
import os
import resource
import signal
import sys
import types

import literals  # candidate.py's, from /harness

_episode = {}


def start(source, classes, options):
    _watch_cpu()
    module = types.ModuleType("environment")
    sys.modules["environment"] = module  # dataclasses and pickle look classes up there
    exec(compile(source, "environment.py", "exec"), module.__dict__)
    instances = {}
    for name, config in classes.items():
        kind = module.__dict__.get(name)
        if not isinstance(kind, type):
            raise NameError(f"the environment's source defines no class {name}")
        instance = kind()
        _configure(instance, config)
        instances[name] = instance
    _episode.update(instances=instances, tools=_tools(instances), **options)
    return sorted(_episode["tools"])


def _configure(instance, config):
    load = getattr(instance, "_load_scenario", None)
    if callable(load):
        load(config)
    else:
        for key, value in config.items():
            setattr(instance, key, value)


def _tools(instances):
    """{tool name: bound method}: each instance's public methods, the first class's first."""
    tools = {}
    for instance in instances.values():
        for name, method in inspect.getmembers(instance, predicate=inspect.ismethod):
            if not name.startswith("_"):
                tools.setdefault(name, method)
    return tools


def call(name, arguments):
    method = _episode["tools"].get(name)
    if method is None:
        return _error(f"there is no tool named {name!r}")
    if not all(isinstance(key, str) for key in arguments):
        return _error("the arguments must be an object with string keys")
    try:
        inspect.signature(method).bind(**arguments)
    except TypeError as error:
        return _error(f"bad arguments for {name}: {error}")
    except ValueError:  # no signature to check against: the call itself will say
        pass
    try:
        return ("ok", _cut(_text(method(**arguments))))
    except MemoryError:
        raise
    except BaseException as error:  # SystemExit too: a tool may not end the episode
        return _error(_describe(error))


def _text(value):
    """The tool message for a return value, as BFCL's execute_multi_turn_func_call makes it."""
    if type(value) is str:
        return value
    if type(value) is dict:
        try:
            return json.dumps(value)
        except (TypeError, ValueError):
            return str(value)
    return str(value)


def _describe(error):
    try:
        return f"{type(error).__name__}: {error}"
    except Exception:  # its __str__ raises too
        return type(error).__name__


def _error(message):
    return ("error", _cut("Error: " + message))


def _cut(text):
    limit = _episode["max_result_chars"]
    if len(text) <= limit:
        return text
    return text[:limit] + f"... [cut: {len(text) - limit} more characters]"


def state():
    return {
        name: {key: _plain(value) for key, value in _public(instance)}
        for name, instance in _episode["instances"].items()
    }


def _public(instance):
    try:
        attributes = vars(instance)
    except TypeError:  # __slots__ only
        return []
    return [(key, value) for key, value in attributes.items() if not str(key).startswith("_")]


MAX_STATE_DEPTH = 64


def _plain(value, path=frozenset(), depth=0):
    """`value` as plain data, compared by structure: a literal as it is, a container item by
    item, an object as its class name and public attributes. Never as repr text, which a tool
    argument could forge (a string written to look like another object's repr) and which
    would make two equal mappings differ by their order. A cycle (a directory's `parent`)
    and anything deeper than MAX_STATE_DEPTH become markers."""
    try:
        literals.encode(value)
        return value
    except literals.NotPlain:
        pass
    kind = type(value).__name__
    if id(value) in path:
        return {"__cycle__": kind}
    if depth >= MAX_STATE_DEPTH:
        return {"__cut__": kind}
    path = path | {id(value)}
    if isinstance(value, dict):
        return {_plain_key(key): _plain(item, path, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        items = [_plain(item, path, depth + 1) for item in value]
        return items if isinstance(value, list) else tuple(items)
    if isinstance(value, set | frozenset):
        return {"__set__": sorted((_plain(item, path, depth + 1) for item in value), key=repr)}
    try:
        attributes = vars(value)
    except TypeError:  # no __dict__ (a datetime, a Decimal): its type writes its repr
        return {"__object__": kind, "repr": _repr(value)}
    public = {key: item for key, item in attributes.items() if not str(key).startswith("_")}
    return {"__object__": kind, **{str(k): _plain(v, path, depth + 1) for k, v in public.items()}}


def _plain_key(key):
    try:
        literals.encode(key)
        return key
    except literals.NotPlain:
        return _repr(key)


def _repr(value):
    try:
        return repr(value)
    except Exception as error:
        return f"<{type(value).__name__} without a repr: {_describe(error)}>"


def _watch_cpu():
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    if hard != resource.RLIM_INFINITY and hard > 1:
        resource.setrlimit(resource.RLIMIT_CPU, (hard - 1, hard))
        signal.signal(signal.SIGXCPU, _out_of_cpu)


def _out_of_cpu(*_):
    os.write(2, b"cpu_limit: the environment ran out of CPU time\n")
    os._exit(1)
