"""Render a ``JaxRuntime`` as environment variables, or apply it to this process."""

import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

from ._cache import default_compilation_cache_dir
from ._config import JaxRuntime
from ._errors import EnvironmentConflictError, RuntimeConfigurationError
from ._jax_client import backends_started
from ._xla_flags import (
    HOST_DEVICE_COUNT_FLAG,
    bad_device_count_flag,
    device_count_conflict,
    merge_xla_flags,
    parse_xla_flags,
)


DEPRECATED_MEMORY_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def _bool(value: bool) -> str:
    return "true" if value else "false"


def _as_is(value: Any) -> Any:  # noqa: ANN401  (a setting's value, whatever its type)
    return value


# Each JaxRuntime field jax reads as a config option: the option's name (its environment variable
# is the name upper-cased) and how the field's value is handed to jax.
_CONFIG_OPTIONS: tuple[tuple[str, str, Callable[[Any], Any]], ...] = (
    ("enable_x64", "jax_enable_x64", _as_is),
    ("matmul_precision", "jax_default_matmul_precision", _as_is),
    ("debug_nans", "jax_debug_nans", _as_is),
    ("log_compiles", "jax_log_compiles", _as_is),
    ("persistent_cache_min_compile_time_secs", "jax_persistent_cache_min_compile_time_secs", float),
)

# The JaxRuntime field that renders each variable, for the messages that name it.
_FIELD_OF: dict[str, str] = {
    "JAX_PLATFORMS": "platforms",
    "JAX_NUM_CPU_DEVICES": "cpu_devices",
    "JAX_COMPILATION_CACHE_DIR": "compilation_cache_dir",
    "JAX_ENABLE_COMPILATION_CACHE": "compilation_cache",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "preallocate",
    "XLA_CLIENT_MEM_FRACTION": "memory_fraction",
    **{option.upper(): field for field, option, _ in _CONFIG_OPTIONS},
}

# The words jax reads as a boolean variable's true and false (its ``bool_env``).
_TRUE_WORDS = frozenset({"1", "t", "true", "y", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "f", "false", "n", "no", "off"})


def _config_values(runtime: JaxRuntime, base: Mapping[str, str]) -> dict[str, tuple[str, str, Any]]:
    """The settings jax reads as config options: ``{field: (env var, config name, value)}``.

    Without a ``compilation_cache_dir``, a ``JAX_COMPILATION_CACHE_DIR`` that ``base`` already
    holds is left alone (the user chose it, as 0.1.22 let them); the default directory fills in
    only when there is none. A cache ``base`` turns off stays off, unless the runtime names its
    ``compilation_cache_dir``: that turns it on again.
    """
    settings: dict[str, tuple[str, str, Any]] = {}
    enabled = ("JAX_ENABLE_COMPILATION_CACHE", "jax_enable_compilation_cache")
    if runtime.compilation_cache:
        chosen = runtime.compilation_cache_dir
        if chosen is not None or not base.get("JAX_COMPILATION_CACHE_DIR"):
            settings["compilation_cache_dir"] = (
                "JAX_COMPILATION_CACHE_DIR",
                "jax_compilation_cache_dir",
                str(chosen or default_compilation_cache_dir()),
            )
        # a cache turned off before (an earlier runtime's, the environment's) is left off, as a
        # directory already set is left alone, unless this runtime names its own directory
        if chosen is not None and base.get(enabled[0], "").strip().lower() in _FALSE_WORDS:
            settings["compilation_cache"] = (*enabled, True)
    else:
        settings["compilation_cache"] = (*enabled, False)
    for field, option, convert in _CONFIG_OPTIONS:
        value = getattr(runtime, field)
        if value is not None:
            settings[field] = (option.upper(), option, convert(value))
    return settings


def runtime_environment(runtime: JaxRuntime, base: Mapping[str, str]) -> dict[str, str]:
    """Render the variables ``runtime`` sets for a process that has not imported jax.

    Only the variables the runtime sets are returned. Each replaces its value in ``base``,
    except ``XLA_FLAGS``, which is merged with ``base["XLA_FLAGS"]`` by flag name, and the
    default compilation cache directory, which is not rendered when ``base`` already sets
    ``JAX_COMPILATION_CACHE_DIR`` (an explicit ``compilation_cache_dir`` still replaces it).

    Args:
        runtime: The settings to render.
        base: The environment the variables will be laid over (e.g. ``os.environ``).

    Returns:
        The variables to set, by name.

    Raises:
        XlaFlagConflictError: ``base`` sets one of ``runtime.xla_flags`` to another value.
        RuntimeConfigurationError: A memory fraction is set while ``base`` holds the deprecated
            ``XLA_PYTHON_CLIENT_MEM_FRACTION``, or ``base`` holds a ``JAX_NUM_CPU_DEVICES`` that
            is not a device count (``"0"``, ``"eight"``), or an ``XLA_FLAGS`` whose
            ``--xla_force_host_platform_device_count`` is not, and ``cpu_devices`` does not
            replace it,
            or ``xla_flags``' ``--xla_force_host_platform_device_count`` asks for another count
            than ``base``'s ``JAX_NUM_CPU_DEVICES`` (which jax would take instead), or
            ``cpu_devices`` asks for another count than that flag in ``base``'s ``XLA_FLAGS``.

    Example:
        >>> from substrax.runtime import JaxRuntime, runtime_environment
        >>> runtime_environment(JaxRuntime(platforms=("cpu",), cpu_devices=8), {})  # doctest: +ELLIPSIS
        {'JAX_PLATFORMS': 'cpu', 'JAX_NUM_CPU_DEVICES': '8', 'JAX_COMPILATION_CACHE_DIR': '.../substrax/jax'}
        >>> runtime_environment(JaxRuntime(cpu_devices=8, compilation_cache=False), {})
        {'JAX_NUM_CPU_DEVICES': '8', 'JAX_ENABLE_COMPILATION_CACHE': 'false'}
        >>> runtime_environment(JaxRuntime(), {"JAX_COMPILATION_CACHE_DIR": "/srv/jax-cache"})
        {}
    """
    env: dict[str, str] = {}
    if runtime.platforms is not None:
        env["JAX_PLATFORMS"] = ",".join(runtime.platforms)
    if runtime.cpu_devices is not None:
        env["JAX_NUM_CPU_DEVICES"] = str(runtime.cpu_devices)
        _check_count_against_env_flag(runtime.cpu_devices, base)
    else:
        _check_cpu_device_count(base)
        flag = parse_xla_flags(base.get("XLA_FLAGS", "")).get(HOST_DEVICE_COUNT_FLAG)
        bad = bad_device_count_flag(flag, "the environment's XLA_FLAGS")
        if bad is not None:
            raise RuntimeConfigurationError(bad)
    for var, _, value in _config_values(runtime, base).values():
        env[var] = _bool(value) if isinstance(value, bool) else str(value)
    if runtime.xla_flags:
        env["XLA_FLAGS"] = merge_xla_flags(base.get("XLA_FLAGS", ""), runtime.xla_flags)
        if runtime.cpu_devices is None:  # with both, JaxRuntime made sure they agree
            _check_flag_device_count(runtime, base.get("JAX_NUM_CPU_DEVICES"), "the environment")
    if runtime.preallocate is not None:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = _bool(runtime.preallocate)
    if runtime.memory_fraction is not None:
        if DEPRECATED_MEMORY_FRACTION_ENV in base:
            raise RuntimeConfigurationError(
                f"memory_fraction sets XLA_CLIENT_MEM_FRACTION, but the environment also holds "
                f"the deprecated {DEPRECATED_MEMORY_FRACTION_ENV}="
                f"{base[DEPRECATED_MEMORY_FRACTION_ENV]!r}; unset it"
            )
        env["XLA_CLIENT_MEM_FRACTION"] = repr(float(runtime.memory_fraction))
    return env


def _check_count_against_env_flag(cpu_devices: int, base: Mapping[str, str]) -> None:
    """Refuse ``cpu_devices`` where ``base``'s ``XLA_FLAGS`` asks for another count.

    jax would take ``cpu_devices`` and drop the user's flag (left behind for child processes).
    """
    flag = parse_xla_flags(base.get("XLA_FLAGS", "")).get(HOST_DEVICE_COUNT_FLAG)
    conflict = device_count_conflict(
        str(cpu_devices),
        flag,
        count_from="JaxRuntime.cpu_devices",
        flag_from="the environment's XLA_FLAGS",
    )
    if conflict is not None:
        raise RuntimeConfigurationError(conflict)


def _check_flag_device_count(runtime: JaxRuntime, count: str | None, count_from: str) -> None:
    """Refuse a device-count flag of ``runtime`` that jax would drop for ``count``."""
    flag = parse_xla_flags(merge_xla_flags("", runtime.xla_flags)).get(HOST_DEVICE_COUNT_FLAG)
    conflict = device_count_conflict(
        count, flag, count_from=count_from, flag_from="JaxRuntime.xla_flags"
    )
    if conflict is not None:
        raise RuntimeConfigurationError(conflict)


def _check_cpu_device_count(base: Mapping[str, str]) -> None:
    """Refuse a ``JAX_NUM_CPU_DEVICES`` jax would fail on only when its CPU backend starts."""
    raw = base.get("JAX_NUM_CPU_DEVICES")
    if raw is None:
        return
    text = raw.strip()
    number = text[1:] if text.startswith("-") else text
    if not number.isdecimal() or (count := int(text)) == 0 or count < -1:  # -1: jax's default
        raise RuntimeConfigurationError(
            f"JAX_NUM_CPU_DEVICES={raw!r} is not a number of emulated CPU devices (a whole "
            "number, at least 1); set it to one, unset it, or pass JaxRuntime(cpu_devices=...)"
        )


def child_environment(
    runtime: JaxRuntime | None,
    env: Mapping[str, str] | None = None,
    *,
    parent: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Build the complete environment of a child process that will start jax.

    Starts from ``parent`` (default ``os.environ``) with every ``JAX_*`` and ``XLA_*`` variable
    dropped, so the child does not inherit this process's jax settings; adds ``env``; then lays
    ``runtime_environment(runtime, ...)`` on top. A variable ``env`` sets that the runtime sets
    to another value is refused, never replaced; one that means the same (``JAX_ENABLE_X64=1``
    for ``enable_x64=True``, ``JAX_NUM_CPU_DEVICES=" 8"`` for ``cpu_devices=8``) is kept as
    the runtime renders it.

    Args:
        runtime: The child's settings, or ``None`` for none beyond ``env``.
        env: Extra variables for the child (they may set ``JAX_*``/``XLA_*`` themselves).
        parent: The environment to start from; defaults to ``os.environ``.

    Returns:
        The child's full environment.

    Raises:
        XlaFlagConflictError: ``env`` sets one of ``runtime.xla_flags`` to another value.
        EnvironmentConflictError: ``env`` sets another variable the runtime sets to another
            value, e.g. ``JAX_PLATFORMS=cpu`` with ``platforms=("tpu",)``.
        RuntimeConfigurationError: ``env``'s ``--xla_force_host_platform_device_count`` asks
            for another count than ``cpu_devices``; else see ``runtime_environment``.

    Example:
        >>> from substrax.runtime import JaxRuntime, child_environment
        >>> runtime = JaxRuntime(cpu_devices=2, compilation_cache=False)
        >>> child_environment(runtime, parent={"JAX_PLATFORMS": "cuda", "HOME": "/h"})
        {'HOME': '/h', 'JAX_NUM_CPU_DEVICES': '2', 'JAX_ENABLE_COMPILATION_CACHE': 'false'}
    """
    source = os.environ if parent is None else parent
    child = {
        name: value for name, value in source.items() if not (name.startswith(("JAX_", "XLA_")))
    }
    extra = dict(env or {})
    child.update(extra)
    if runtime is not None:
        rendered = runtime_environment(runtime, child)
        _refuse_env_conflicts(extra, rendered)
        child.update(rendered)
    return child


def _agrees(variable: str, given: str, required: str) -> bool:
    """Whether jax reads ``given`` as the setting the runtime rendered as ``required``."""
    text = given.strip()
    if text == required:
        return True
    if required in {"true", "false"}:
        return text.lower() in (_TRUE_WORDS if required == "true" else _FALSE_WORDS)
    if variable == "JAX_PLATFORMS":
        return ",".join(p.strip() for p in text.split(",") if p.strip()) == required
    if variable == "JAX_COMPILATION_CACHE_DIR":
        return os.path.normpath(text) == os.path.normpath(required)
    try:
        return float(text) == float(required)
    except ValueError:
        return False


def _refuse_env_conflicts(env: Mapping[str, str], rendered: Mapping[str, str]) -> None:
    """Raise for a variable ``env`` gives another value than the runtime renders for it."""
    for variable, required in rendered.items():
        given = env.get(variable)
        # XLA_FLAGS is merged by flag name: a flag with two values raised already
        if given is None or variable == "XLA_FLAGS" or _agrees(variable, given, required):
            continue
        field = _FIELD_OF.get(variable, variable)
        raise EnvironmentConflictError(
            variable=variable,
            given=given,
            required=required,
            setter=f"JaxRuntime.{field}",
            fix=f"set it in one place: drop {variable} from env, or change the runtime's {field}",
        )


def _cpu_device_count(jax: Any) -> int | None:  # noqa: ANN401 - the jax module
    """How many CPU devices the started backend has; None without a CPU backend."""
    try:
        return len(jax.devices("cpu"))
    except RuntimeError:
        return None


def _jax_is_imported() -> bool:
    return "jax" in sys.modules


def apply_runtime(runtime: JaxRuntime, *, environ: MutableMapping[str, str] | None = None) -> None:
    """Apply ``runtime`` to this process, refusing settings jax would no longer read.

    Before ``jax`` is imported, the variables are written into ``environ`` (default
    ``os.environ``) and jax reads them when it loads. Once jax is imported, ``platforms``
    (through ``jax.config``), ``xla_flags``, ``preallocate`` and ``memory_fraction`` (into
    ``environ``) are still applied until jax starts its backends (its first device query,
    array or compile); after that they are refused unless they already hold; the rest go
    through ``jax.config.update``: only the fields the runtime gives, so a setting made with
    ``jax.config.update`` stays, and the default compilation cache directory fills in only when
    jax has none.

    Args:
        runtime: The settings to apply.
        environ: The environment to write; defaults to ``os.environ``.

    Raises:
        RuntimeConfigurationError: jax is imported and a setting can no longer take effect,
            e.g. ``cpu_devices`` after the backends started with another number of CPU devices
            (the same number, from ``XLA_FLAGS``' device count, say, already holds); or, jax
            imported or not, ``cpu_devices`` asks for another count than ``environ``'s
            ``XLA_FLAGS`` device count; else see ``runtime_environment``.

    Example:
        >>> env = {}
        >>> apply_runtime(JaxRuntime(cpu_devices=8), environ=env)  # doctest: +SKIP
        >>> env  # doctest: +SKIP
        {'JAX_NUM_CPU_DEVICES': '8'}
    """
    target = os.environ if environ is None else environ
    if not _jax_is_imported():
        target.update(runtime_environment(runtime, target))
        return
    import jax  # noqa: PLC0415 - jax is already imported; this only binds the name

    if backends_started():
        _refuse_startup_settings(runtime, target)
    else:  # jax reads them when it starts its backends: still to come
        rendered = runtime_environment(runtime, target)
        target.update({name: v for name, v in rendered.items() if name.startswith("XLA_")})
        if runtime.platforms is not None:  # read into jax's config at its import: set there
            jax.config.update("jax_platforms", ",".join(runtime.platforms))

    if runtime.xla_flags and runtime.cpu_devices is None:
        _check_flag_device_count(runtime, str(jax.config.jax_num_cpu_devices), "jax's config")

    if runtime.cpu_devices is not None:
        _apply_cpu_devices(jax, runtime.cpu_devices, target)
    # a cache directory jax already has (from its environment, or jax.config.update) is kept:
    # only the runtime's own compilation_cache_dir replaces it
    base = dict(target)
    if current_dir := jax.config.jax_compilation_cache_dir:
        base["JAX_COMPILATION_CACHE_DIR"] = str(current_dir)
    base["JAX_ENABLE_COMPILATION_CACHE"] = _bool(jax.config.jax_enable_compilation_cache)
    changed = False
    for _, name, value in _config_values(runtime, base).values():
        changed |= "compilation_cache" in name and getattr(jax.config, name) != value
        jax.config.update(name, value)
    if changed:  # jax sets its cache up at the first compile: a new directory needs a reset
        from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415

        compilation_cache.reset_cache()


def _apply_cpu_devices(jax: Any, count: int, environ: Mapping[str, str]) -> None:  # noqa: ANN401
    """Set jax's CPU device count once jax is imported; refused as before jax's import."""
    previous = jax.config.jax_num_cpu_devices
    if previous != count:
        try:
            jax.config.update("jax_num_cpu_devices", count)
        except RuntimeError as error:
            if _cpu_device_count(jax) != count:  # else it holds (XLA_FLAGS' count)
                raise RuntimeConfigurationError(
                    f"cpu_devices={count} cannot be applied: jax has already started its "
                    f"backends ({error}); set JAX_NUM_CPU_DEVICES before the first jax call"
                ) from error
            previous = count  # nothing was changed
    try:  # jax would take the count and leave environ's own flag behind for child processes
        _check_count_against_env_flag(count, environ)
    except RuntimeConfigurationError:
        jax.config.update("jax_num_cpu_devices", previous)
        raise


def _refuse_startup_settings(runtime: JaxRuntime, environ: Mapping[str, str]) -> None:
    """Raise for the settings jax reads only at start, unless they already hold."""
    stale: list[str] = []
    if runtime.platforms is not None:
        import jax  # noqa: PLC0415 - jax is already imported

        current = jax.config.jax_platforms or ""
        if tuple(p.strip() for p in current.split(",") if p.strip()) != runtime.platforms:
            stale.append(f"platforms={runtime.platforms!r} (jax has {current!r})")
    if runtime.xla_flags:
        current_flags = parse_xla_flags(environ.get("XLA_FLAGS", ""))
        wanted = parse_xla_flags(" ".join(runtime.xla_flags))
        if any(name not in current_flags or current_flags[name] != v for name, v in wanted.items()):
            stale.append(f"xla_flags={runtime.xla_flags!r}")
    rendered = runtime_environment(
        JaxRuntime(preallocate=runtime.preallocate, memory_fraction=runtime.memory_fraction),
        environ,
    )
    stale.extend(
        f"{name}={value!r}"
        for name, value in rendered.items()
        if name.startswith("XLA_") and environ.get(name) != value
    )
    if stale:
        raise RuntimeConfigurationError(
            f"jax is already imported, so {', '.join(stale)} would no longer be read; "
            "apply the runtime before importing jax, or run a child process with "
            "child_environment(runtime)"
        )
