"""The docstring examples are self-contained and clean up after themselves.

pytest's ``--doctest-modules`` (``addopts`` in pyproject.toml) runs every example in
``packages/*/src`` beside the other tests; the root conftest.py gives each example an empty
namespace and fails one that leaves files in its temporary, working or state directory. These tests
hold the examples to that convention (CONTRIBUTING.md, "Docs and examples"), check that the hook
can fail, and that every example is still collected.
"""

import ast
import doctest
import re
import subprocess
import sys
from pathlib import Path

import pytest


ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted(ROOT.glob("packages/*/src"))
# The old per-package runners (seven, replaced by --doctest-modules) ran 277 docstrings with
# examples; collecting fewer means examples were lost (a module that no longer imports, say).
OLD_RUNNERS_DOCSTRINGS = 277


def _examples(path: Path) -> list[tuple[int, str]]:
    """(line, source) of every ``>>>`` example in the docstrings of ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    parser = doctest.DocTestParser()
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        docstring = ast.get_docstring(node, clean=False)
        if not docstring or ">>>" not in docstring:
            continue
        first = node.body[0].lineno  # the docstring's own line
        found += [(first + e.lineno, e.source) for e in parser.get_examples(docstring)]
    return found


def test_no_example_calls_mkdtemp() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{line}: {source.strip()}"
        for path in sorted(ROOT.glob("packages/*/src/**/*.py"))
        for line, source in _examples(path)
        if "mkdtemp" in source
    ]
    assert not offenders, (
        "examples that leave a directory behind; write into a "
        "`with tempfile.TemporaryDirectory() as directory:` block instead:\n" + "\n".join(offenders)
    )


def test_the_mkdtemp_check_sees_examples(tmp_path: Path) -> None:
    module = tmp_path / "module.py"
    module.write_text(
        'def f():\n    """Do.\n\n    Example:\n        >>> import tempfile\n'
        '        >>> f(tempfile.mkdtemp())\n    """\n'
    )
    assert [source for _, source in _examples(module) if "mkdtemp" in source] == [
        "f(tempfile.mkdtemp())\n"
    ]


def test_an_example_sees_only_what_it_imports(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(
        module='''
        import math

        LIMIT = 3


        def under_limit(value):
            """Whether ``value`` is under the limit.

            >>> from module import under_limit
            >>> under_limit(2)
            True
            """
            return value < LIMIT


        def uses_its_module():
            """Uses names the example never imports.

            >>> math.floor(LIMIT / 2)
            1
            """
        '''
    )
    result = pytester.runpytest("--doctest-modules", "-p", "no:randomly", "-p", "no:xdist")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*NameError*name 'math' is not defined*"])


def test_an_example_that_leaves_files_behind_fails(pytester: pytest.Pytester) -> None:
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(
        module='''
        def tidy():
            """Writes into a directory it removes.

            >>> import tempfile
            >>> from pathlib import Path
            >>> with tempfile.TemporaryDirectory() as directory:
            ...     _ = (Path(directory) / "out.txt").write_text("x")
            """


        def litters_the_working_directory():
            """Writes where it runs.

            >>> from pathlib import Path
            >>> _ = Path("out.txt").write_text("x")
            """


        def litters_the_temporary_directory():
            """Makes a directory it never removes.

            >>> import tempfile
            >>> _ = tempfile.mkdtemp()
            """


        def litters_the_state_directory():
            """Writes into substrax's state directory.

            >>> import os
            >>> from pathlib import Path
            >>> _ = (Path(os.environ["SUBSTRAX_STATE_DIR"]) / "jobs").mkdir()
            """
        '''
    )
    result = pytester.runpytest("--doctest-modules", "-p", "no:randomly", "-p", "no:xdist")
    result.assert_outcomes(passed=1, failed=3)
    for left in (
        r"'working': \['out\.txt'\]",
        r"'temporary': \['tmp\w+'\]",
        r"'state': \['jobs'\]",
    ):
        result.stdout.re_match_lines([rf"the example left files behind: {{{left}}}; write into a"])
    assert not list(pytester.path.glob("out.txt")), "the example ran outside its own directory"


def test_every_docstring_example_is_collected() -> None:
    command = [
        sys.executable, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(ROOT),
        "--collect-only", "-q", "-n0", "-p", "no:randomly", *map(str, SOURCES),
    ]  # fmt: skip
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    report = result.stdout[-4000:] + result.stderr[-2000:]
    collected = re.search(r"(\d+) tests? collected", result.stdout)
    assert result.returncode == 0, report
    assert collected is not None, report
    assert int(collected[1]) >= OLD_RUNNERS_DOCSTRINGS, report
