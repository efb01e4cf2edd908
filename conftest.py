"""The project's own suites run under substrax's opt-in pytest plugin (and may use pytester).

Every test belongs to one tier, given here by where it lives and the fixtures it uses, never by
a mark written on the test (``tier`` below):

- ``unit``: fast and in one process: the tests under ``packages/*/tests`` and every docstring
  example, unless they use a fixture that starts other processes or servers.
- ``integration``: real servers, several processes, kill -9, the examples in their short mode:
  ``tests-integration/``, and the package tests using one of ``INTEGRATION_FIXTURES``.
- ``release``: what a release needs once: the built packages (``RELEASE_MODULES``), the
  siblings installed beside them, the docs site and the full demo.

The README's command runs unit and integration (``-m "not release"`` in ``addopts``); CI also
runs ``-m unit`` at the lowest versions the parts allow and ``-m release``.

Every docstring example in ``packages/*/src`` is collected by pytest's ``--doctest-modules``
(``addopts`` in pyproject.toml). An example runs in a namespace of its own: not its module's
globals, only what the example imports itself, so that it runs as written when pasted into an
interpreter. No ``doctest_namespace`` is shared: nothing is common to every example. Each runs
in empty temporary, working and state directories of its own (``TMPDIR``, the current directory,
``SUBSTRAX_STATE_DIR``), and fails if it leaves anything in them.
"""

import contextlib
import functools
import gc
import importlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from _pytest.doctest import DoctestItem


# Tests talk to no address but 127.0.0.1. MLflow fetches a telemetry config from its servers at
# the first tracked call unless told not to; its own check for pytest reads PYTEST_CURRENT_TEST,
# which is not set while test modules are imported, nor in a server started at collection.
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"

pytest_plugins = ["substrax.testing.pytest_plugin", "pytester"]

# Scripts run as programs by the integration tests, never imported by collection. (pytest's
# doctest collection already skips every ``__main__.py``.)
collect_ignore_glob = ["tests-integration/programs/*.py"]


# Packages whose ``__init__`` loads names on first use (PEP 562). An error class shows its package
# as ``__module__``, so doctest finds its example only in that package's namespace, where a lazy
# name appears once something used it: load every public name before collection, so what is
# collected never depends on what happened to be imported first.
_LAZY_PACKAGES = (
    "substrax.support",
    "substrax.runtime",
    "substrax.mesh",
    "substrax.spmd",
    "substrax.optim",
    "substrax.checkpoint",
    "substrax.tracking",
    "substrax.callbacks",
    "substrax.compute",
    "substrax.testing",
)


def pytest_collection() -> None:
    """Load every public name of the lazy packages, so their examples are all collected."""
    for name in _LAZY_PACKAGES:
        package = importlib.import_module(name)
        for public in getattr(package, "__all__", ()):
            getattr(package, public)


ROOT = Path(__file__).resolve().parent

# The modules of tests-integration/ that make a release's checks: wheels, siblings, site, demo.
RELEASE_MODULES = frozenset(
    {"test_packaging.py", "test_siblings.py", "test_docs_build.py", "test_demo.py"}
)

# Fixtures that start processes or servers: a package test that uses one is an integration test.
INTEGRATION_FIXTURES = frozenset(
    {
        "child_processes",  # below: the test starts processes of its own
        "child",  # runtime: a Python child with a timeout
        "spawns_a_child",  # compute: a task that starts a grandchild
        "local_project",  # compute: jobs run by the local backend's worker processes
        "writer_elsewhere",  # checkpoint: a writer in another process, SIGKILLed
        "run_where_file_modes_apply",  # checkpoint: a child without root's file access
        "mlflow_server",  # tracking: a real `mlflow server` on 127.0.0.1
        "vanishing_mlflow",  # tracking: a server that dies mid-run
        "wandb_offline",  # tracking: W&B's own service process (wandb-core)
        "small_disk",  # tracking: a 4 MiB tmpfs mounted for the test (a full disk)
        "two_processes",  # checkpoint: a two-process jax job
        "wall_clock",  # below: the test waits in real time on threads or processes
    }
)


# Tools the code under test runs and waits a moment for (the upload set asks git what it tracks;
# the stdlib's platform.processor() asks `uname -p`, as MLflow's first import does): a unit test
# may start these.
QUICK_TOOLS = frozenset({"git", "uname"})


def tier(item: pytest.Item) -> str:
    """The tier of ``item``: ``release``, ``integration`` or ``unit`` (see the module docstring)."""
    path = Path(str(item.path)).resolve()
    if path.is_relative_to(ROOT / "tests-integration"):
        return "release" if path.name in RELEASE_MODULES else "integration"
    if INTEGRATION_FIXTURES.intersection(getattr(item, "fixturenames", ())):
        return "integration"
    return "unit"


# A test module's own module-scoped fixture, written at the start of a line (not in a string a
# test hands to pytester, which is indented).
_MODULE_FIXTURE = re.compile(r'^@pytest\.fixture\(scope="module"', re.MULTILINE)


@functools.cache
def module_group(path: Path) -> str | None:
    """The xdist group of a test module that defines a module-scoped fixture, else None.

    ``--dist loadgroup`` spreads a module's tests over the workers, and each worker would make the
    module's fixture again (a two-process job, a compiled model): grouped, it is made once.
    """
    if path.suffix != ".py" or not _MODULE_FIXTURE.search(path.read_text()):
        return None
    return f"module:{path.relative_to(ROOT)}"


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: a run may go without xdist
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores, as a tenth of the suite waits.

    Its tests wait on child processes, servers and timeouts: on two cores a third worker cut the
    README's command by a tenth, and a fourth gained nothing more.
    """
    del config
    return (os.cpu_count() or 1) + 1


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with its tier (and its module's group, ``module_group``); give each
    docstring example an empty namespace.

    Then freeze what collection made (jax, orbax, MLflow and every test module, imported):
    the garbage collector never scans it again, so a full collection, which tests run to
    find what a failed read left in reference cycles, costs what the tests made since, not
    half a second each.
    """
    for item in items:
        item.add_marker(tier(item))
        group = module_group(Path(str(item.path)).resolve())
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        example = getattr(item, "dtest", None)  # a DoctestItem's doctest.DocTest
        if example is not None:
            module = example.globs.get("__name__")
            example.globs.clear()
            example.globs["__name__"] = module
    # numpy < 2 runs `lscpu` on numpy.testing's first import (its SVE probe), which a unit
    # test's first np.testing call would be failed for (the lowest-direct tier has numpy 1.26)
    importlib.import_module("numpy.testing")
    gc.collect()
    gc.freeze()


def _children() -> set[int]:
    """The process ids whose parent is this process (Linux's /proc; empty elsewhere)."""
    found: set[int] = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # the fields after the command's closing parenthesis: state, then the parent's pid
            if int(stat.read_text().rpartition(")")[2].split()[1]) == os.getpid():
                found.add(int(stat.parent.name))
    return found


@pytest.fixture
def child_processes() -> Iterator[None]:
    """For a test that starts processes of its own: an integration test; kills what it leaves.

    A child still running when the test ends (a failed assertion before its ``wait``) is
    killed, so that no process of one test outlives it and waits forever.
    """
    before = _children()
    yield
    for pid in _children() - before:
        if _is_wandb_service(pid):  # the worker's W&B service, kept for its later runs
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _is_wandb_service(pid: int) -> bool:
    """Whether ``pid`` is W&B's service (``wandb-core``), which the first ``wandb.init`` of a
    process starts for the rest of its life: killed, every later run of the worker fails."""
    try:
        return b"wandb-core" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


class WallClock:
    """Real time, for a test whose threads or processes must let it pass: an integration test."""

    sleep = staticmethod(time.sleep)


@pytest.fixture
def wall_clock() -> WallClock:
    """Real time (``wall_clock.sleep``), which makes the test that asks for it an integration test.

    A unit test moves a clock it gives the code under test; one whose threads or processes race
    against real time (a writer that seals a step later, a peer that arrives late) sleeps here.
    """
    return WallClock()


@pytest.fixture(autouse=True)
def _unit_tests_stay_in_one_process_and_move_their_own_clocks(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fail a unit test that starts a process, or that sleeps in real time.

    A test that starts processes (itself or through the code under test) asks for
    ``child_processes``, which makes it an integration test. Only a sleep written in a test module
    counts: the code under test, a background thread or a helper polling for one (until a
    deadline) may sleep; a test gives the code under test a clock it moves, or, if threads must
    race real time, sleeps through ``wall_clock``. Docstring examples are left alone.
    """
    if request.node.get_closest_marker("unit") is None or isinstance(request.node, DoctestItem):
        return
    real_sleep, real_start = time.sleep, subprocess.Popen.__init__

    def sleep(seconds: float) -> None:
        if Path(sys._getframe(1).f_code.co_filename).name.startswith("test_"):
            pytest.fail(
                f"a unit test slept {seconds} s in real time: give the code under test a clock"
                " the test moves (or, if threads or processes must race real time, use"
                " wall_clock.sleep)"
            )
        real_sleep(seconds)

    def start(self: subprocess.Popen[str], args: Any, *more: Any, **options: Any) -> None:  # noqa: ANN401
        program = args if isinstance(args, str | bytes | os.PathLike) else next(iter(args), "")
        if Path(os.fsdecode(program)).name in QUICK_TOOLS:
            real_start(self, args, *more, **options)
            return
        pytest.fail(
            f"a unit test started a process ({args!r}): ask for the child_processes fixture,"
            " which makes it an integration test"
        )

    def spawn_or_fork(name: str) -> Any:  # noqa: ANN401
        real = getattr(os, name)

        def refuse(*args: Any, **options: Any) -> Any:  # noqa: ANN401
            if args and Path(os.fsdecode(args[0])).name in QUICK_TOOLS:  # Popen's own spawn
                return real(*args, **options)
            pytest.fail(
                f"a unit test started a process (os.{name}{args[:2]!r}): ask for the"
                " child_processes fixture, which makes it an integration test"
            )

        return refuse

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(subprocess.Popen, "__init__", start)
    for name in ("posix_spawn", "posix_spawnp", "fork"):  # the ways around Popen
        monkeypatch.setattr(os, name, spawn_or_fork(name))


_CLEAN_DIRECTORIES = ("temporary", "working", "state")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Run a docstring example in empty directories of its own; fail it if it leaves files there.

    An example writes into a ``tempfile.TemporaryDirectory()`` block (CONTRIBUTING.md, "Docs and
    examples"): whatever is left in the temporary directory, the working directory or substrax's
    state directory once it ran is a file a user pasting it would find behind.
    """
    if not isinstance(item, DoctestItem):
        return (yield)
    with tempfile.TemporaryDirectory(prefix="substrax-example-") as root:
        places = {name: Path(root, name) for name in _CLEAN_DIRECTORIES}
        for place in places.values():
            place.mkdir()
        saved = {name: os.environ.get(name) for name in ("TMPDIR", "SUBSTRAX_STATE_DIR")}
        cwd, tempdir = Path.cwd(), tempfile.tempdir
        os.environ["TMPDIR"] = tempfile.tempdir = str(places["temporary"])
        os.environ["SUBSTRAX_STATE_DIR"] = str(places["state"])
        os.chdir(places["working"])
        try:
            result = yield
        finally:
            os.chdir(cwd)
            tempfile.tempdir = tempdir
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        listed = {
            name: sorted(path.name for path in place.iterdir()) for name, place in places.items()
        }
        left = {name: names for name, names in listed.items() if names}
        if left:
            pytest.fail(
                f"the example left files behind: {left}; write into a"
                " `with tempfile.TemporaryDirectory() as directory:` block",
                pytrace=False,
            )
    return result
