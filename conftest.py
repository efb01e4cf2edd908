"""The project's own suites run under substrax's opt-in pytest plugin (and may use pytester).

Every docstring example in ``packages/*/src`` is collected by pytest's ``--doctest-modules``
(``addopts`` in pyproject.toml). An example runs in a namespace of its own: not its module's
globals, only what the example imports itself, so that it runs as written when pasted into an
interpreter. No ``doctest_namespace`` is shared: nothing is common to every example. Each runs
in empty temporary, working and state directories of its own (``TMPDIR``, the current directory,
``SUBSTRAX_STATE_DIR``), and fails if it leaves anything in them.
"""

import importlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Give each docstring example an empty namespace instead of a copy of its module's globals."""
    for item in items:
        example = getattr(item, "dtest", None)  # a DoctestItem's doctest.DocTest
        if example is not None:
            module = example.globs.get("__name__")
            example.globs.clear()
            example.globs["__name__"] = module


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
