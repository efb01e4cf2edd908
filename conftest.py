"""The project's own suites run under substrax's opt-in pytest plugin (and may use pytester).

Every docstring example in ``packages/*/src`` is collected by pytest's ``--doctest-modules``
(``addopts`` in pyproject.toml). An example runs in a namespace of its own: not its module's
globals, only what the example imports itself, so that it runs as written when pasted into an
interpreter. No ``doctest_namespace`` is shared: nothing is common to every example.
"""

import importlib

import pytest


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
