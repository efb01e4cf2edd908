"""substrax's opt-in pytest plugin: a JAX test runtime, device markers, config isolation.

This module's path is an interface: conftest files name it in ``pytest_plugins``.
Opt in from a ``conftest.py`` (no ``pytest11`` entry point is registered, so installing
substrax changes no other project's test runs)::

    pytest_plugins = ["substrax.testing.pytest_plugin"]

What it does:

- Before jax loads, sets the session's runtime with ``resolve_test_runtime(os.environ,
  prefix="SUBSTRAX_TEST_", ...)``: cpu with 8 emulated devices unless ``JAX_NUM_CPU_DEVICES``
  or ``--xla_force_host_platform_device_count`` is already set. ``SUBSTRAX_TEST_DEVICE_COUNT``
  picks another count (``0``: no emulation); ``SUBSTRAX_TEST_JAX_PLATFORMS=cuda`` moves the
  session onto a GPU. A jax imported before the plugin configured (by a conftest, another
  plugin) is configured through its config, as its backends have not started (the report
  header then shows that config, not the variables jax read at import); backends that
  started already (a computation at import) under other settings are a usage error.
- Markers: ``x64`` (the test body runs inside ``jax.enable_x64(True)``), ``devices(count,
  kind=None)`` and ``accelerator(kind=None)`` (skips naming what is missing). A malformed
  marker is a usage error at collection.
- Config isolation: the autouse fixture ``substrax_jax_config_isolation`` restores jax's
  global config after each test and fails a test that changed it, naming the options; a config
  context manager entered and never exited (``jax.enable_x64(True).__enter__()``) is such a
  change too, named with ``(thread-local)`` and undone (the test's thread only). A
  module-, class-, package- or session-scoped fixture may change it for the tests that use it,
  but must set it back in its teardown: one that does not is an error at that teardown, naming
  the fixture and the options (restored). A change made outside any test or fixture setup (a
  fixture's teardown, a hook) is an error of the next test, restored first. The baseline is
  the config once jax is imported (after collection, usually; for a test that is the first to
  import jax, as its import ends): a wider fixture that is the first to import jax and changes
  the config in the same setup is not seen (the change is taken for the baseline); import jax
  in the test module or conftest to have it checked.
- Under xdist, a usage error found while a worker collects (a malformed marker, 64-bit mode
  switched on at import) fails each test it concerns at setup, with the same message.
- A collection guard: the session stops when a module switched ``jax_enable_x64`` on at
  import (unless ``JAX_ENABLE_X64`` is set for the whole run).
- Fixtures ``output_dir``, ``rng_seed``, ``rng_key`` and ``rngs``. The keys come from one
  seed, 42 unless the run is given another with ``--substrax-seed N`` (0 to ``2**32 - 1``,
  another value is a usage error; the option can also sit in the ``addopts`` of the pytest
  configuration); the report header shows the seed in force.

Importing this module imports no jax.
"""

import difflib
import importlib.util
import os
import sys
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from substrax.support import int_argument

from ._jax_config import THREAD_LOCAL, ConfigWatch, snapshot_jax_config
from ._jax_import import on_first_import
from ._jax_startup import apply_test_runtime, configured_settings
from ._markers import MARKERS, DeviceRequirement, parse_marker, skip_reason


if TYPE_CHECKING:
    import jax
    from flax import nnx

ENV_PREFIX = "SUBSTRAX_TEST_"
_VARIABLES = ("DEVICE_COUNT", "JAX_PLATFORMS")  # the ones resolve_test_runtime reads
SEED = 42
MAX_SEED = 2**32 - 1  # past it, jax.random.key overflows or (x64 off) gives a small seed's keys
RNG_STREAMS = ("default", "params", "dropout", "sample")
_CUDA_PLUGINS = ("jax_cuda13_plugin", "jax_cuda12_plugin")
_MARKER_NAMES = ("x64", "devices", "accelerator")
_REQUIREMENTS = pytest.StashKey[list[DeviceRequirement]]()
_CONFIG_WATCH = pytest.StashKey[ConfigWatch]()
_THROUGH_CONFIG = pytest.StashKey[bool]()  # the runtime went into an imported jax's config
_PROBLEM = pytest.StashKey[str]()  # a usage error an xdist worker reports at the test's setup
_USE_CONTEXTS = (
    "use jax's context managers (e.g. `with jax.enable_x64(True):`) or @pytest.mark.x64 "
    "instead of jax.config.update"
)
_TRUTHY = frozenset({"1", "true", "yes", "on"})


def _account(changed: list[str], unrestored: list[str], fix: str = "") -> str:
    """Name the changed options, say whether they are restored and how to avoid each kind."""
    text = ", ".join(changed)
    if unrestored:
        text += f" (could not be restored: {', '.join(unrestored)}; later tests may see it)"
    else:
        text += " (now restored)"
    if any(not label.endswith(THREAD_LOCAL) for label in changed):
        text += f"; {fix}{_USE_CONTEXTS}"
    if any(label.endswith(THREAD_LOCAL) for label in changed):
        text += (
            "; a (thread-local) change is a jax config context manager entered and never "
            "exited (e.g. jax.enable_x64(True).__enter__()): use it in a `with` block"
        )
    return text


def _cuda_plugin_available() -> bool:
    return any(importlib.util.find_spec(name) is not None for name in _CUDA_PLUGINS)


def _check_variables(environ: Mapping[str, str]) -> None:
    """Refuse a ``SUBSTRAX_TEST_*`` variable the plugin does not read: a misspelling would do nothing."""
    known = [ENV_PREFIX + suffix for suffix in _VARIABLES]
    for name in sorted(environ):
        if name.startswith(ENV_PREFIX) and name not in known:
            close = difflib.get_close_matches(name.removeprefix(ENV_PREFIX), _VARIABLES, n=1)
            hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
            raise pytest.UsageError(
                f"substrax test runtime: {name}={environ[name]!r} is not a variable the plugin "
                f"reads{hint}; it reads {' and '.join(known)}: rename it, or unset it"
            )


def _configure_runtime() -> bool:
    """Set the session's runtime; whether through jax's config (jax was imported first)."""
    from substrax.runtime import (  # noqa: PLC0415 - after pytest has parsed its options
        RuntimeConfigurationError,
        resolve_test_runtime,
    )

    _check_variables(os.environ)
    try:
        runtime = resolve_test_runtime(
            os.environ, prefix=ENV_PREFIX, cuda_plugin_available=_cuda_plugin_available()
        )
    except (ValueError, RuntimeConfigurationError) as error:
        raise pytest.UsageError(f"substrax test runtime: {error}") from error
    return apply_test_runtime(runtime)


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--substrax-seed``: the seed of the ``rng_seed``, ``rng_key`` and ``rngs`` fixtures."""
    parser.getgroup("substrax").addoption(
        "--substrax-seed",
        dest="substrax_seed",
        metavar="N",
        type=int_argument("--substrax-seed", maximum=MAX_SEED),
        default=SEED,
        help=(
            f"seed of the rng_seed, rng_key and rngs fixtures, 0 to {MAX_SEED} (2**32 - 1, the "
            f"largest seed jax.random.key takes with jax_enable_x64 off; default: {SEED})"
        ),
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers and set the JAX runtime before any test module imports jax."""
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    config.stash[_CONFIG_WATCH] = ConfigWatch()
    config.stash[_THROUGH_CONFIG] = _configure_runtime()


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Show the JAX settings the session runs under, and the seed of the key fixtures.

    They are the environment's, or jax's config where the plugin set them there (jax was
    imported first: the variables hold what it read at import, which the plugin overrode).
    """
    flags = f" XLA_FLAGS={os.environ['XLA_FLAGS']}" if "XLA_FLAGS" in os.environ else ""
    if config.stash.get(_THROUGH_CONFIG, False):
        settings = f"{configured_settings()}{flags} (set in jax's config: jax was imported first)"
    else:
        shown = ("JAX_PLATFORMS", "JAX_NUM_CPU_DEVICES", "JAX_ENABLE_X64")
        settings = " ".join(f"{name}={os.environ[name]}" for name in shown if name in os.environ)
        settings = f"{settings}{flags}".strip()
    return [
        f"substrax test runtime: {settings or 'jax defaults'}",
        f"substrax seed: {config.option.substrax_seed} (change it with --substrax-seed N)",
    ]


def _usage_error(config: pytest.Config, error: pytest.UsageError, items: list[pytest.Item]) -> None:
    """Raise ``error``; in an xdist worker, where it would be lost, fail ``items`` at setup."""
    if not hasattr(config, "workerinput"):
        raise error
    for item in items:
        item.stash.setdefault(_PROBLEM, str(error))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Validate every use of the plugin's markers; a malformed one is a usage error."""
    for item in items:
        requirements: list[DeviceRequirement] = []
        for name in _MARKER_NAMES:
            for marker in item.iter_markers(name):
                try:
                    requirement = parse_marker(item.nodeid, marker)
                except pytest.UsageError as error:
                    _usage_error(config, error, [item])
                    continue
                if requirement is not None:
                    requirements.append(requirement)
        if requirements:
            item.stash[_REQUIREMENTS] = requirements


def pytest_collection_finish(session: pytest.Session) -> None:
    """Stop the session when collecting tests switched 64-bit mode on globally.

    Otherwise, with jax imported, take the config every test and fixture is held to.
    """
    if "jax" not in sys.modules:
        return
    import jax  # noqa: PLC0415 - already imported

    if jax.config.jax_enable_x64 and os.environ.get("JAX_ENABLE_X64", "").lower() not in _TRUTHY:
        error = pytest.UsageError(
            "jax_enable_x64 was switched on while collecting tests (a test module or conftest "
            "calls jax.config.update('jax_enable_x64', True) at import), which changes the "
            "dtypes of every other test; mark the tests that need it with @pytest.mark.x64, "
            "or set JAX_ENABLE_X64=1 for the whole run"
        )
        _usage_error(session.config, error, session.items)
    if (watch := session.config.stash.get(_CONFIG_WATCH, None)) is not None:
        watch.baseline()


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> Generator[None, object, object]:
    """Record the jax config changes a fixture wider than a function makes in its setup."""
    watch = request.config.stash.get(_CONFIG_WATCH, None)
    if watch is None or fixturedef.scope == "function" or "jax" not in sys.modules:
        return (yield)
    watch.baseline()
    before = snapshot_jax_config()
    try:
        return (yield)
    finally:
        watch.set_up(id(fixturedef), before)


def pytest_fixture_post_finalizer(
    fixturedef: pytest.FixtureDef[object], request: pytest.FixtureRequest
) -> None:
    """Fail the teardown of a wider fixture that left jax's config changed, after restoring it."""
    watch = request.config.stash.get(_CONFIG_WATCH, None)
    if watch is None or fixturedef.scope == "function" or "jax" not in sys.modules:
        return
    left, unrestored = watch.torn_down(id(fixturedef))
    if left:
        pytest.fail(
            f"the {fixturedef.scope}-scoped fixture {fixturedef.argname!r} changed jax's global "
            f"config and did not set it back: "
            f"{_account(left, unrestored, 'set it back after its yield, or ')}",
            pytrace=False,
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, object, object]:
    """Skip a test whose ``devices``/``accelerator`` marker this process cannot satisfy.

    In an xdist worker, a usage error found at collection fails each test it concerns here.
    """
    if (problem := item.stash.get(_PROBLEM, None)) is not None:
        pytest.fail(f"usage error: {problem}", pytrace=False)
    for requirement in item.stash.get(_REQUIREMENTS, []):
        reason = skip_reason(requirement)
        if reason is not None:
            item.add_marker(pytest.mark.skipif(True, reason=reason))
            break
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, object, object]:
    """Run an ``x64`` test's body inside ``jax.enable_x64(True)`` (thread-local)."""
    if item.get_closest_marker("x64") is None:
        return (yield)
    import jax  # noqa: PLC0415 - only for x64 tests

    with jax.enable_x64(True):
        return (yield)


@pytest.fixture(autouse=True)
def substrax_jax_config_isolation(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that changed jax's global config, after restoring it.

    The config is held to the session's baseline with the changes of the wider fixtures set up
    now. A test that starts with another config (changed by a fixture's teardown or a hook since
    the last test) fails at its setup, after the config is restored. A test that is the first
    to import jax is held to the config as its import left it (a session that never imports
    jax never loads it here).
    Use jax's context managers (``with jax.enable_x64(True):``) or the ``x64`` marker instead of
    ``jax.config.update``; one entered and never exited is a change as well (its option is
    named with ``(thread-local)``), undone on the test's thread.
    """
    watch = request.config.stash.get(_CONFIG_WATCH, None)
    if watch is None:
        yield
        return
    if "jax" not in sys.modules:  # the baseline is taken as the test's import of jax ends
        with on_first_import("jax", watch.baseline):
            yield
        if "jax" in sys.modules:
            _fail_if_changed(*watch.restore())
        return
    strays, unrestored = watch.restore()
    if strays:
        pytest.fail(
            f"jax's global config was changed outside any test and fixture setup (by a "
            f"fixture's teardown or a hook, since the last test): "
            f"{_account(strays, unrestored)}",
            pytrace=False,
        )
    try:
        yield
    finally:
        changed, unrestored = watch.restore()
    _fail_if_changed(changed, unrestored)


def _fail_if_changed(changed: list[str], unrestored: list[str]) -> None:
    if changed:
        pytest.fail(
            f"the test changed jax's global config: {_account(changed, unrestored)}",
            pytrace=False,
        )


@pytest.fixture
def output_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty ``tmp_path/outputs``, set as ``AVITAI_OUTPUT_DIR`` for the test."""
    from substrax.artifacts import OUTPUT_DIR_ENV  # noqa: PLC0415

    path = tmp_path / "outputs"
    path.mkdir()
    monkeypatch.setenv(OUTPUT_DIR_ENV, str(path))
    return path


@pytest.fixture
def rng_seed(request: pytest.FixtureRequest) -> int:
    """The session's seed: 42, or the ``--substrax-seed`` given."""
    seed: int = request.config.option.substrax_seed
    return seed


@pytest.fixture
def rng_key(rng_seed: int) -> "jax.Array":
    """A typed PRNG key from the session's seed: ``jax.random.key(42)`` by default."""
    import jax  # noqa: PLC0415

    return jax.random.key(rng_seed)


@pytest.fixture
def rngs(rng_seed: int) -> "nnx.Rngs":
    """``rngs_from_seed(seed, ("default", "params", "dropout", "sample"))`` (needs flax).

    The seed is the session's (42 by default, ``--substrax-seed`` to change it).
    """
    from substrax.rng import rngs_from_seed  # noqa: PLC0415

    return rngs_from_seed(rng_seed, RNG_STREAMS)
