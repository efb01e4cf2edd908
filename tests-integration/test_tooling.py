"""The xdist grouping the suite relies on.

ruff, ruff format, pyright strict, the import-linter layers and ``uv lock --check`` are not tests:
they run once, as pre-commit hooks (``.pre-commit-config.yaml``), first in CI (``.ci/run``).
"""

from pathlib import Path

import pytest


GROUPED = """
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.xdist_group("costly")


@pytest.fixture(scope="module")
def costly() -> None:
    with Path("setups.txt").open("a") as log:
        log.write(os.environ["PYTEST_XDIST_WORKER"] + "\\n")


@pytest.mark.parametrize("n", range(6))
def test_grouped(n: int, costly: None) -> None:
    pass
"""


def test_xdist_groups_keep_a_costly_fixture_on_one_worker(pytester: pytest.Pytester) -> None:
    # The suite's addopts distribute by xdist_group: the MLflow server, the demo job's run and the
    # wheel builds are each made once. A pytest or pytest-xdist release that breaks the grouping
    # (pytest-xdist#1386) makes each worker make them again; this fails first.
    pytester.makepyfile(test_grouped=GROUPED)
    result = pytester.runpytest_subprocess("-n", "2", "--dist", "loadgroup")
    result.assert_outcomes(passed=6)
    assert len((pytester.path / "setups.txt").read_text().split()) == 1


def test_a_module_scoped_fixture_groups_its_module_without_a_mark(
    pytester: pytest.Pytester,
) -> None:
    # The root conftest.py groups a module that defines a module-scoped fixture by itself, so that
    # the fixture (a two-process job, a compiled model) is made once, not once per worker.
    root_conftest = Path(__file__).resolve().parents[1] / "conftest.py"
    pytester.makeconftest(root_conftest.read_text())
    pytester.makepyfile(
        test_grouped=GROUPED.replace('pytestmark = pytest.mark.xdist_group("costly")', "")
    )
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadgroup", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=6)
    assert len((pytester.path / "setups.txt").read_text().split()) == 1
