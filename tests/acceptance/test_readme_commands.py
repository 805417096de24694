"""Every command the README names exists, with every option it names: `test_readme.py` runs
the README's code blocks, this checks the commands its prose and comments only mention (inline
code spans such as `flywheel keys revoke KEY_ID`, `flywheel verify --file X`, `python -m
bench.redaction`, and the commands in code blocks, comments included).

A `flywheel ...` mention is resolved word by word through the CLI's command groups to the
command it names; `flywheel <that command> --help` must exit 0, and every `--option` the
mention gives must be in that help. A `python -m MODULE` mention must name a module that
exists; one that parses its arguments with argparse must answer `--help` with exit 0 and list
each `--option` the mention gives. An option the prose names alone (`--recheck` verifies them
all again) must be in the help of a command its section names. Words in capitals (`DIR`,
`KEY_ID`), `...` and `[...]` are placeholders.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

import pytest
import typer
from typer.core import TyperGroup

from flywheel.cli import _add_plugins, app
from tests.acceptance.readme import README, ROOT

pytestmark = pytest.mark.no_database

FENCE = re.compile(r"^\s*```")
SPAN = re.compile(r"`([^`]+)`")
# Where a command in a code line ends: a shell comment, a pipe, a redirection, `&`, `;`, `)`.
CODE_END = re.compile(r"\s#|[|&;)<>]")
# In a comment's prose, a command ends at two spaces or a parenthesis: `# a laptop:   flywheel
# gateway --backend local   (transformers + peft)`.
PROSE_END = re.compile(r"\s{2,}|\(")
FLYWHEEL = re.compile(r"(?:^|(?<=[\s=(]))flywheel(?=\s)")
PYTHON_M = re.compile(r"(?:^|(?<=[\s=(]))python3? -m (?=\S)")


@dataclass(frozen=True)
class Mention:
    line: int  # the README line it starts on
    program: str  # "flywheel" or "python -m"
    words: tuple[str, ...]  # what follows the program, brackets stripped

    def __str__(self) -> str:
        return f"README.md:{self.line}: `{self.program} {' '.join(self.words)}`"


def _mentions_in(text: str, line: int, end: re.Pattern[str]) -> list[Mention]:
    """The commands named in `text` (one span, or one code line): each runs from its program
    to the first `end`, or to where the next command starts."""
    starts = [(m.start(), m.end(), "flywheel") for m in FLYWHEEL.finditer(text)]
    starts += [(m.start(), m.end(), "python -m") for m in PYTHON_M.finditer(text)]
    starts.sort()
    mentions = []
    for index, (start, after, program) in enumerate(starts):
        stop = starts[index + 1][0] if index + 1 < len(starts) else len(text)
        rest = text[after:stop]
        cut = end.search(rest)
        rest = rest[: cut.start()] if cut else rest
        words = tuple(word.strip("[]") for word in rest.split())
        mentions.append(Mention(line + text.count("\n", 0, start), program, words))
    return mentions


def _code_line(text: str, line: int) -> list[Mention]:
    """A code line's commands: in its code, and in its comment (its inline spans, or else its
    prose)."""
    comment = re.search(r"(?:^|\s)#(.*)$", text)
    found = _mentions_in(text[: comment.start()] if comment else text, line, CODE_END)
    if comment:
        spans = SPAN.findall(comment.group(1))
        for part in spans or [comment.group(1)]:
            found += _mentions_in(part, line, CODE_END if spans else PROSE_END)
    return found


def _prose(lines: list[str]) -> str:
    """The README with its fenced code blocks blanked (line numbers kept)."""
    prose, in_block = [], False
    for line in lines:
        fence = bool(FENCE.match(line))
        in_block ^= fence
        prose.append("" if fence or in_block else line)
    return "\n".join(prose)


def _sections(lines: list[str]) -> list[str]:
    """The `## ` heading each line (numbered from 1: index 0 is unused) sits under."""
    sections, heading = [""], ""
    for line in lines:
        heading = line.removeprefix("## ").strip() if line.startswith("## ") else heading
        sections.append(heading)
    return sections


def _lines(text: str | None) -> list[str]:
    return (README.read_text(encoding="utf-8") if text is None else text).splitlines()


def readme_mentions(text: str | None = None) -> list[Mention]:
    """Every `flywheel ...` and `python -m ...` the README names, in code blocks (lines joined
    at a trailing backslash) and in inline code spans (which may run over a line break)."""
    lines = _lines(text)
    mentions: list[Mention] = []
    in_block, pending, pending_line = False, "", 0
    for number, line in enumerate(lines, start=1):
        if FENCE.match(line):
            in_block = not in_block
        elif in_block and line.rstrip().endswith("\\"):
            pending_line = pending_line if pending else number
            pending += line.rstrip()[:-1] + " "
        elif in_block:
            mentions += _code_line(pending + line, pending_line if pending else number)
            pending = ""
    prose = _prose(lines)
    for span in SPAN.finditer(prose):
        start = prose.count("\n", 0, span.start()) + 1
        mentions += _mentions_in(span.group(1), start, CODE_END)
    return sorted(mentions, key=lambda mention: mention.line)


def bare_options(text: str | None = None) -> list[tuple[int, str, str]]:
    """The options the README's prose names alone (`--recheck` verifies them all again), each
    with its line and its section: (line, section, option)."""
    lines = _lines(text)
    prose, sections = _prose(lines), _sections(lines)
    found = []
    for span in SPAN.finditer(prose):
        option = re.match(r"(--[a-z][\w-]*)", span.group(1))
        if option:
            line = prose.count("\n", 0, span.start()) + 1
            found.append((line, sections[line], option.group(1)))
    return found


def _placeholder(word: str) -> bool:
    return word in ("...", "…") or word.startswith(("$", "<")) or word.upper() == word


@cache
def _cli() -> TyperGroup:
    _add_plugins()
    return typer.main.get_group(app)


def _resolve(words: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """The command path `words` names through the CLI's groups, and the words after it; an
    AssertionError when a word where a subcommand must stand names none."""
    command: object = _cli()
    path: list[str] = []
    rest = list(words)
    while isinstance(command, TyperGroup) and rest and not rest[0].startswith("-"):
        word = rest[0]
        sub = command.commands.get(word)
        if sub is None:
            assert _placeholder(word), f"`flywheel {' '.join(path)}` has no command {word!r}"
            return path, []
        path.append(word)
        rest.pop(0)
        command = sub
    return path, rest


def _options(words: list[str]) -> list[str]:
    """The `--options` among `words` (`--mix=X` as `--mix`)."""
    return [word.split("=", 1)[0] for word in words if re.match(r"--[a-z]", word)]


def _help(argv: list[str]) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "400", "TERM": "dumb", "OMP_NUM_THREADS": "1"}
    env.pop("FLYWHEEL_VERBOSE", None)
    return subprocess.run(
        [*argv, "--help"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


@cache
def _flywheel_help(path: tuple[str, ...]) -> subprocess.CompletedProcess[str]:
    return _help([str(Path(sys.executable).parent / "flywheel"), *path])


def check_flywheel(mention: Mention) -> None:
    path, rest = _resolve(mention.words)
    result = _flywheel_help(tuple(path))
    where = f"{mention}: `flywheel {' '.join(path)} --help`"
    assert result.returncode == 0, f"{where} exits {result.returncode}\n{result.stderr[-2000:]}"
    for option in _options(rest):
        assert re.search(rf"{re.escape(option)}(?![\w-])", result.stdout), (
            f"{where} lists no {option}"
        )


def _argparse_module(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"no module {module}"
    assert spec.origin, f"no module {module}"
    origin = Path(spec.origin)
    if spec.submodule_search_locations:  # a package: what `python -m` runs is its __main__
        origin = origin.parent / "__main__.py"
    assert origin.is_file(), f"`python -m {module}` has nothing to run ({origin})"
    # A package's __main__ may hand over to a module of it (finetune.serve's app.py parses).
    sources = origin.parent.glob("*.py") if spec.submodule_search_locations else [origin]
    return any("argparse" in source.read_text(encoding="utf-8") for source in sources)


@cache
def _module_help(module: str) -> subprocess.CompletedProcess[str]:
    return _help([sys.executable, "-m", module])


@cache
def _prefetch() -> None:
    """Every README command's `--help` at once, four at a time: a module's imports torch,
    tens of seconds each on a busy machine (cached: the checks then read them)."""
    jobs: dict[tuple[str, ...], Callable[[], object]] = {}
    for mention in MENTIONS:
        try:
            if mention.program == "flywheel":
                path = tuple(_resolve(mention.words)[0])
                jobs[("flywheel", *path)] = partial(_flywheel_help, path)
            elif _argparse_module(mention.words[0]):
                jobs[("-m", mention.words[0])] = partial(_module_help, mention.words[0])
        except AssertionError:  # reported by the mention's own check
            continue
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lambda job: job(), jobs.values()))


def check_module(mention: Mention) -> None:
    module, *rest = mention.words
    assert _argparse_module(module) or not _options(rest), (
        f"{mention}: {module} takes no options (it does not use argparse)"
    )
    if not _argparse_module(module):
        return
    result = _module_help(module)
    where = f"{mention}: `python -m {module} --help`"
    assert result.returncode == 0, f"{where} exits {result.returncode}\n{result.stderr[-2000:]}"
    for option in _options(rest):
        assert re.search(rf"{re.escape(option)}(?![\w-])", result.stdout), (
            f"{where} lists no {option}"
        )


# Options the README names for other programs, not ours.
FOREIGN = {
    "--slurp": "gh api's (how `gh api --paginate` output may be written)",
    "--forwarded-allow-ips": "uvicorn's",
}


def _helps_of(mention: Mention) -> str:
    """The --help text of the command a mention names ("" where it names none)."""
    try:
        if mention.program == "flywheel":
            return _flywheel_help(tuple(_resolve(mention.words)[0])).stdout
        return _module_help(mention.words[0]).stdout if _argparse_module(mention.words[0]) else ""
    except AssertionError:  # reported by test_the_readme_names_a_real_command
        return ""


def check_bare_option(line: int, option: str, mentions: list[Mention]) -> None:
    """An option the prose names alone must be one of a command its section names (or one of
    `flywheel`'s own)."""
    candidates = [Mention(line, "flywheel", ()), *mentions]
    where = f"README.md:{line}: `{option}`"
    assert any(
        re.search(rf"{re.escape(option)}(?![\w-])", _helps_of(mention)) for mention in candidates
    ), f"{where} is an option of no command its section names: {[str(m) for m in mentions]}"


MENTIONS = readme_mentions()
BARE = [entry for entry in bare_options() if entry[2] not in FOREIGN]


def _section_mentions(section: str) -> list[Mention]:
    sections = _sections(_lines(None))
    return [mention for mention in MENTIONS if sections[mention.line] == section]


def test_the_readme_mentions_its_commands() -> None:
    named = {str(mention) for mention in MENTIONS}
    assert len(MENTIONS) > 60, named
    for expected in (
        "`flywheel keys revoke KEY_ID`",
        "`flywheel verify --file HumanEval.jsonl.gz`",
        "`flywheel models webhooks deliver`",
        "`flywheel ingest repo DIR --history 50`",  # a span over a line break
        "`flywheel gateway --upstream-url http://vllm:8000/v1`",  # in a code comment
        "`flywheel models watch`",  # in a YAML block's comment
        "`python -m bench.redaction`",
    ):
        assert any(name.endswith(expected) for name in named), expected


@pytest.mark.parametrize("mention", MENTIONS, ids=str)
def test_the_readme_names_a_real_command(mention: Mention) -> None:
    _prefetch()
    if mention.program == "flywheel":
        check_flywheel(mention)
    else:
        check_module(mention)


@pytest.mark.parametrize(("line", "section", "option"), BARE, ids=lambda x: str(x)[:40])
def test_an_option_the_prose_names_exists(line: int, section: str, option: str) -> None:
    _prefetch()
    check_bare_option(line, option, _section_mentions(section))


def test_a_bare_option_of_no_command_in_its_section_fails() -> None:
    text = "## S\n\n`flywheel keys list` lists keys; `--all-tenants` lists every tenant's.\n"
    ((line, _, option),) = bare_options(text)

    with pytest.raises(AssertionError, match="is an option of no command"):
        check_bare_option(line, option, readme_mentions(text))


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("Run `flywheel keys rotate KEY_ID`.", "has no command 'rotate'"),
        ("Run `flywheel verify --file X --fast`.", "lists no --fast"),
        ("```bash\nflywheel serve --port 1 \\\n    --no-such-flag\n```", "lists no --no-such"),
        ("Run `flywheel models webhooks resend`.", "has no command 'resend'"),
        ("See `python -m bench.no_such_bench`.", "no module bench.no_such_bench"),
        ("See `python -m bench.redaction --no-such-option`.", "lists no --no-such-option"),
    ],
)
def test_a_command_or_option_that_does_not_exist_fails(text: str, reason: str) -> None:
    (mention,) = readme_mentions(text)
    check = check_flywheel if mention.program == "flywheel" else check_module

    with pytest.raises(AssertionError, match=re.escape(reason)):
        check(mention)


def test_placeholders_and_code_comments_are_not_commands() -> None:
    text = (
        "```bash\nKEY=$(flywheel keys create --tenant acme --json \\\n"
        "      | python3 -c 'print(1)')   # shown once\n"
        "# production: flywheel gateway --upstream-url U   (vLLM --enable-lora)\n```\n"
        "The `flywheel ingest ...` commands; `flywheel domains configure NAME --tenant T`."
    )

    mentions = [str(mention) for mention in readme_mentions(text)]

    assert mentions == [
        "README.md:2: `flywheel keys create --tenant acme --json`",
        "README.md:4: `flywheel gateway --upstream-url U`",
        "README.md:6: `flywheel ingest ...`",
        "README.md:6: `flywheel domains configure NAME --tenant T`",
    ]
    for mention in readme_mentions(text):
        check_flywheel(mention)
