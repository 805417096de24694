"""The repository ingestor: tested functions and test-carrying commits become verifiable tasks
that verifier QA accepts; everything else is rejected with a reason, bad input with one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
from collections import Counter
from pathlib import Path

import pytest

from flywheel.errors import InvalidInput
from flywheel.sandbox.qa import QaResult, TaskSpec, check_task
from flywheel.signals.candidates import TaskCandidate
from ingest.framework import Rejected
from ingest.repo import RepositoryIngestor
from ingest.repo.codebase import Codebase
from ingest.repo.discover import discover_tests
from ingest.repo.files import DirectorySnapshot

FIXTURES = Path(__file__).parent.parent / "fixtures"
TEXTKIT = FIXTURES / "repos" / "textkit"
SDIST = FIXTURES / "sdists" / "inflection-0.5.1.tar.gz"
AUTHOR = "Ada Lovelace"

Outcomes = dict[str, list[str] | str]  # record ref -> task refs, or the rejection reason


def ingest(ingestor: RepositoryIngestor) -> tuple[Outcomes, list[TaskCandidate]]:
    outcomes: Outcomes = {}
    tasks: list[TaskCandidate] = []
    for record in ingestor.records():
        try:
            produced = ingestor.convert(record)
        except Rejected as rejected:
            outcomes[record.ref] = rejected.reason
            continue
        assert all(isinstance(task, TaskCandidate) for task in produced)
        tasks += [task for task in produced if isinstance(task, TaskCandidate)]
        outcomes[record.ref] = [task.provenance.source_ref for task in produced]
    return outcomes, tasks


def qa(task: TaskCandidate) -> QaResult:
    assert task.entry_point is not None
    assert task.reference_solution is not None
    assert task.hidden_tests is not None
    spec = TaskSpec(
        task.provenance.source_ref,
        task.prompt,
        task.reference_solution,
        task.hidden_tests,
        task.entry_point,
    )
    return check_task(spec)


def by_entry_point(tasks: list[TaskCandidate]) -> dict[str, TaskCandidate]:
    return {str(task.entry_point): task for task in tasks}


@pytest.fixture
def textkit(tmp_path: Path) -> Path:
    """The fixture tree, plus files no fixture should hold as text: a Latin-1 module with its
    coding cookie, one no codec reads, a binary one and one over the size limit."""
    root = tmp_path / "textkit"
    shutil.copytree(TEXTKIT, root)
    package = root / "textkit"
    (package / "legacy.py").write_bytes(
        b'# -*- coding: latin-1 -*-\n"""Old greetings."""\n\n\ndef greet(name):\n'
        b'    """Greet `name` in German."""\n    return "Gr\xfc\xdfe, " + name\n'
    )
    (root / "tests" / "test_legacy.py").write_text(
        "from textkit.legacy import greet\n\n\ndef test_greet():\n"
        '    assert greet("Ana") == "Gr\\u00fc\\u00dfe, Ana"\n',
        encoding="utf-8",
    )
    (package / "mojibake.py").write_bytes(b'def f():\n    """\xff\xfe"""\n')
    (package / "blob.py").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00")
    (package / "generated.py").write_bytes(b"X = 1\n" * 200_000)
    return root


def test_working_tree_functions_become_tasks_or_say_why_not(textkit: Path) -> None:
    with RepositoryIngestor(str(textkit)) as ingestor:
        outcomes, tasks = ingest(ingestor)
        revision = ingestor.fingerprint()[:12]

    def ref(path: str, name: str) -> list[str]:
        return [f"textkit@{revision}:{path}::{name}"]

    assert outcomes == {
        "textkit/blob.py": "binary_file",
        "textkit/core.py::slugify": ref("textkit/core.py", "slugify"),
        "textkit/core.py::word_count": ref("textkit/core.py", "word_count"),
        "textkit/core.py::truncate": ref("textkit/core.py", "truncate"),
        "textkit/core.py::shout": "uses_fixtures",
        "textkit/core.py::double": "no_docstring",
        "textkit/core.py::pairs": "generator",
        "textkit/core.py::Tally.__init__": "method",
        "textkit/core.py::Tally.add": "method",
        "textkit/generated.py": "too_large",
        # a test calls it with slugify, whose module imports it: it cannot come last
        "textkit/helpers.py::normalize_space": "used_at_import",
        "textkit/legacy.py::greet": ref("textkit/legacy.py", "greet"),
        "textkit/mojibake.py": "undecodable",
        "textkit/stats.py::mean_length": "third_party_imports",
    }
    assert {task.provenance.group_key for task in tasks} == {"repository:textkit"}
    assert "Grüße" in by_entry_point(tasks)["greet"].reference_solution


def test_hidden_tests_are_rewritten_to_call_the_solution(textkit: Path) -> None:
    with RepositoryIngestor(str(textkit)) as ingestor:
        tasks = by_entry_point(ingest(ingestor)[1])

    # parametrize became a loop; the xfail case, the skipped test and the fixture test are out
    assert tasks["slugify"].hidden_tests == (
        "import solution\n"
        "from solution import slugify\n"
        "from solution import normalize_space\n\n\n"
        "def test_slugify():\n"
        "    for text, expected in [('Hello World', 'hello-world'), "
        "('  many   spaces ', 'many-spaces')]:\n"
        "        assert slugify(text) == expected\n\n\n"
        "def test_slugify_separator():\n"
        "    assert slugify('a b', separator='_') == 'a_b'\n\n\n"
        "def test_slug_of_squashed_text():\n"
        "    assert slugify(normalize_space(' A   b ')) == 'a-b'\n"
    )
    # a module constant that is a plain literal travels as its value
    assert tasks["truncate"].hidden_tests == (
        "import solution\n"
        "MAX_WORDS = 3\n"
        "from solution import truncate\n\n\n"
        "def test_truncate():\n"
        "    assert len(truncate('a b c d e').split()) == MAX_WORDS\n"
    )
    # unittest methods became functions, `import textkit.core` chains call `solution`; the
    # test that passes an iterator (which cannot cross to the candidate) is left out
    assert tasks["word_count"].hidden_tests == (
        "import solution\n"
        "import pytest\n"
        "EMPTY = ''\n\n\n"
        "def test_WordCountTest_test_counts():\n"
        "    assert solution.word_count('a b  c') == 3\n\n\n"
        "def test_WordCountTest_test_empty_and_wrong_type():\n"
        "    assert solution.word_count(EMPTY) == 0, 'no words'\n"
        "    with pytest.raises(TypeError):\n"
        "        solution.word_count(None)\n"
    )


def test_prompt_carries_inlined_helpers_and_is_a_prefix_of_the_reference(textkit: Path) -> None:
    with RepositoryIngestor(str(textkit)) as ingestor:
        slugify = by_entry_point(ingest(ingestor)[1])["slugify"]

    reference = slugify.reference_solution or ""
    body = '    words = re.findall(r"[a-z0-9]+", squash(text).lower())\n'
    assert reference == slugify.prompt + body + "    return separator.join(words)\n"
    assert slugify.prompt.endswith('    \'hello-world\'\n    """\n')
    for context in ("import re\n", "def normalize_space(text):", "squash = normalize_space\n"):
        assert context in slugify.prompt
    assert "from .helpers" not in reference
    assert "many   spaces" not in slugify.prompt


def test_working_tree_tasks_pass_verifier_qa(textkit: Path) -> None:
    with RepositoryIngestor(str(textkit)) as ingestor:
        tasks = ingest(ingestor)[1]

    results = {str(task.entry_point): qa(task) for task in tasks}

    assert {name: result.status for name, result in results.items()} == {
        "slugify": "usable",
        "word_count": "usable",
        "truncate": "usable",
        "greet": "usable",
    }


def test_each_test_runs_in_the_sandbox_or_says_why_not(textkit: Path) -> None:
    found = discover_tests(Codebase(DirectorySnapshot(textkit)))

    reasons = {test.origin.removeprefix("tests/"): test.reason for test in found}

    assert reasons == {
        "test_core.py::test_slugify": None,
        "test_core.py::test_slugify_separator": None,
        "test_core.py::test_shout_to_file": "uses_fixtures",
        "test_core.py::test_slugify_unicode": "skipped_test",
        "test_core.py::test_double": None,
        "test_core.py::test_pairs": "opaque_value",  # pairs is a generator
        "test_core.py::test_truncate": None,
        "test_core.py::test_slug_of_squashed_text": None,
        "test_legacy.py::test_greet": None,
        "test_words.py::WordCountTest::test_counts": None,
        "test_words.py::WordCountTest::test_empty_and_wrong_type": None,
        "test_words.py::test_mean_length": None,
        "test_words.py::test_word_count_refuses_iterators": "non_literal_argument",
    }


IDIOMS = """
import unittest

import pytest

from m import inc


@pytest.mark.slow
@pytest.mark.parametrize("x,y", [(1, 2), (2, 3)])
@pytest.mark.parametrize("z", [0])
def test_grid(x, y, z):
    assert inc(x) + z == y


class IncTest(unittest.TestCase):
    def test_forms(self):
        self.assertTrue(inc(0))
        self.assertIn(inc(1), [2], "in")
        self.assertIsNone(None)
        self.assertRaises(TypeError, inc, "a")
"""


def test_pytest_and_unittest_idioms_become_plain_code(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text('def inc(x):\n    """x + 1."""\n    return x + 1\n')
    (tmp_path / "test_m.py").write_text(IDIOMS, encoding="utf-8")

    found = {test.name: test.code for test in discover_tests(Codebase(DirectorySnapshot(tmp_path)))}

    assert found == {
        "test_grid": (
            "def test_grid():\n"
            "    for x, y in [(1, 2), (2, 3)]:\n"
            "        for z in [0]:\n"
            "            assert inc(x) + z == y"
        ),
        "test_IncTest_test_forms": (
            "def test_IncTest_test_forms():\n"
            "    assert inc(0)\n"
            "    assert inc(1) in [2], 'in'\n"
            "    assert None is None\n"
            "    with pytest.raises(TypeError):\n"
            "        inc('a')"
        ),
    }


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": AUTHOR,
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": AUTHOR,
        "GIT_COMMITTER_EMAIL": "ada@example.com",
        "GIT_CONFIG_GLOBAL": os.devnull,
    }
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, check=True
    )
    return done.stdout.strip()


def commit(repo: Path, message: str, files: dict[str, str]) -> str:
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text, encoding="utf-8")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "--short=7", "HEAD")


ADD = 'def add(a, b):\n    """Sum of a and b."""\n    return a + b\n'
ADD_NONE = 'def add(a, b):\n    """Sum; None counts as 0."""\n    return (a or 0) + (b or 0)\n'
CLAMP = '\n\ndef clamp(x, low, high):\n    """x limited to [low, high]."""\n'
CLAMP_BODY = "    return max(low, min(x, high))\n"
TEST_ADD = "from calc.ops import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n"
TEST_CLAMP = "\n\ndef test_clamp():\n    assert clamp(5, 0, 3) == 3\n"
TEST_NONE = "\n\ndef test_add_none():\n    assert add(None, 2) == 2\n"
TEST_NEGATIVE = "\n\ndef test_add_negative():\n    assert add(-1, -2) == -3\n"


@pytest.fixture
def history_repo(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A git repository whose commits change source and tests together, source only, tests
    only, and source with tests the old code already passes."""
    repo = tmp_path / "calc"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = {"root": commit(repo, "Add add", {"calc/__init__.py": "", "calc/ops.py": ADD})}
    shas["test_add"] = commit(repo, "Test add", {"tests/test_ops.py": TEST_ADD})
    shas["clamp"] = commit(
        repo,
        "Add clamp",
        {
            "calc/ops.py": ADD + CLAMP + CLAMP_BODY,
            "tests/test_ops.py": TEST_ADD.replace("add\n", "add, clamp\n", 1) + TEST_CLAMP,
        },
    )
    tests = TEST_ADD.replace("add\n", "add, clamp\n", 1) + TEST_CLAMP
    shas["none"] = commit(
        repo,
        "add() treats None as 0\n\nCallers pass None for missing amounts.",
        {"calc/ops.py": ADD_NONE + CLAMP + CLAMP_BODY, "tests/test_ops.py": tests + TEST_NONE},
    )
    tests += TEST_NONE
    shas["docs"] = commit(
        repo, "Say so", {"calc/ops.py": "# ops\n" + ADD_NONE + CLAMP + CLAMP_BODY}
    )
    shas["tests"] = commit(repo, "More tests", {"tests/test_ops.py": tests + TEST_NEGATIVE})
    shas["refactor"] = commit(
        repo,
        "Tidy clamp",
        {
            "calc/ops.py": "# ops\n" + ADD_NONE + CLAMP + "    return min(max(x, low), high)\n",
            "tests/test_ops.py": tests + TEST_NEGATIVE + "\n\ndef test_clamp_low():\n"
            "    assert clamp(-5, 0, 3) == 0\n",
        },
    )
    return repo, shas


def test_history_commits_with_source_and_tests_become_tasks(
    history_repo: tuple[Path, dict[str, str]],
) -> None:
    repo, shas = history_repo

    with RepositoryIngestor(str(repo), history=7) as ingestor:
        outcomes, tasks = ingest(ingestor)

    head = shas["refactor"]
    assert outcomes == {
        "calc/ops.py::add": [f"calc@{head}:calc/ops.py::add"],
        "calc/ops.py::clamp": [f"calc@{head}:calc/ops.py::clamp"],
        f"commit {shas['refactor']}": [f"calc@{shas['refactor']}:calc/ops.py::clamp"],
        f"commit {shas['tests']}": "no_source_change",
        f"commit {shas['docs']}": "no_test_change",
        f"commit {shas['none']}": [f"calc@{shas['none']}:calc/ops.py::add"],
        f"commit {shas['clamp']}": [f"calc@{shas['clamp']}:calc/ops.py::clamp"],
        f"commit {shas['test_add']}": "no_source_change",
        f"commit {shas['root']}": "root_commit",
    }
    none = next(
        task for task in tasks if task.provenance.source_ref.startswith(f"calc@{shas['none']}")
    )
    assert "#     Callers pass None for missing amounts." in none.prompt
    assert none.prompt.endswith(ADD)  # the code before the commit, to change
    assert none.reference_solution == ADD_NONE
    assert none.hidden_tests == (
        "import solution\nfrom solution import add\n\n\n"
        "def test_add_none():\n    assert add(None, 2) == 2\n"
    )
    assert none.provenance.names == (AUTHOR,)
    assert {task.provenance.group_key for task in tasks} == {"repository:calc"}


def test_history_tasks_go_through_qa_and_old_code_that_passes_is_unusable(
    history_repo: tuple[Path, dict[str, str]],
) -> None:
    repo, shas = history_repo

    with RepositoryIngestor(str(repo), history=7) as ingestor:
        tasks = ingest(ingestor)[1]

    results = {task.provenance.source_ref.split(":")[0]: qa(task) for task in tasks}
    assert results[f"calc@{shas['none']}"].status == "usable"
    assert results[f"calc@{shas['clamp']}"].status == "usable"
    refactor = results[f"calc@{shas['refactor']}"]
    assert (refactor.status, refactor.reason) == (
        "unusable",
        "tests accept a trivial solution (stub)",
    )


def test_git_url_is_cloned_shallowly_and_removed(
    history_repo: tuple[Path, dict[str, str]],
) -> None:
    repo, _ = history_repo
    with RepositoryIngestor(str(repo), history=2) as local:
        expected = ingest(local)

    ingestor = RepositoryIngestor(repo.as_uri(), history=2)
    clone = ingestor.checkout.root
    assert ingest(ingestor) == expected
    assert git(clone, "rev-list", "--count", "HEAD") == "3"  # two commits and their parent
    ingestor.close()
    assert not clone.exists()


def test_real_sdist_ingests_into_tasks_that_qa_accepts(tmp_path: Path) -> None:
    with RepositoryIngestor(str(SDIST)) as ingestor:
        outcomes, tasks = ingest(ingestor)
    with tarfile.open(SDIST) as archive:
        archive.extractall(tmp_path, filter="data")
    with RepositoryIngestor(str(tmp_path / "inflection-0.5.1")) as extracted:
        assert ingest(extracted)[0] == outcomes

    results = [qa(task) for task in tasks]
    rejected = Counter(outcome for outcome in outcomes.values() if isinstance(outcome, str))
    statuses = Counter(result.status for result in results)
    print(f"inflection 0.5.1: {len(outcomes)} records, {len(tasks)} tasks, {dict(statuses)}")
    print(f"rejected: {dict(rejected)}")
    for result in results:
        print(f"  {result.task_id}: {result.status} ({result.reason})")
    assert len(tasks) >= 10
    assert statuses["usable"] >= 10
    assert all(result.reason for result in results)
    assert rejected == {"no_tests": 2}  # _irregular and transliterate: no test calls them


def test_fingerprint_follows_the_content(textkit: Path) -> None:
    with RepositoryIngestor(str(textkit)) as ingestor:
        before = ingestor.fingerprint()
    with RepositoryIngestor(str(textkit)) as ingestor:
        assert ingestor.fingerprint() == before
    (textkit / "textkit" / "helpers.py").write_text("X = 2\n", encoding="utf-8")
    with RepositoryIngestor(str(textkit)) as ingestor:
        assert ingestor.fingerprint() != before


@pytest.mark.parametrize(
    ("source", "history", "message"),
    [
        ("{tmp}/missing", 0, "no such directory or repository"),
        ("{tmp}/notes.txt", 0, "is a file, not a repository"),
        ("{tmp}/empty", 0, "holds no Python source"),
        ("{textkit}", 1, "is not a git repository: --history needs one"),
        ("{textkit}", -1, "history must be between 0 and"),
        ("file://{tmp}/missing", 0, "cannot clone file://"),
        ("{tmp}/broken.tar.gz", 0, "not a readable archive"),
    ],
)
def test_bad_sources_fail_with_one_line(
    tmp_path: Path, source: str, history: int, message: str
) -> None:
    (tmp_path / "notes.txt").write_text("hello", encoding="utf-8")
    (tmp_path / "empty").mkdir()
    (tmp_path / "broken.tar.gz").write_bytes(b"not gzip at all")
    path = source.format(tmp=tmp_path, textkit=TEXTKIT)

    with pytest.raises(InvalidInput) as caught:
        RepositoryIngestor(path, history=history)

    assert message in caught.value.message
    assert "\n" not in caught.value.message


def test_archive_members_outside_the_tree_are_refused(tmp_path: Path) -> None:
    evil = tmp_path / "evil.tar.gz"
    payload = tmp_path / "payload.py"
    payload.write_text("X = 1\n", encoding="utf-8")
    with tarfile.open(evil, "w:gz") as archive:
        archive.add(payload, arcname="../escaped.py")

    with pytest.raises(InvalidInput, match="would land outside its directory"):
        RepositoryIngestor(str(evil))
    assert not (tmp_path.parent / "escaped.py").exists()
