"""Render a ``JaxRuntime`` as environment variables: for this process, or a child's."""

import dataclasses
import os
from collections.abc import Callable, Mapping
from typing import Any

from substrax.support import env_values_agree, reads_false

from ._cache import default_compilation_cache_dir
from ._config import JaxRuntime
from ._errors import EnvironmentConflictError, RuntimeConfigurationError
from ._xla_flags import (
    HOST_DEVICE_COUNT_FLAG,
    bad_device_count_flag,
    device_count_conflict,
    merge_xla_flags,
    parse_xla_flags,
)


DEPRECATED_MEMORY_FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def bool_text(value: bool) -> str:
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


def config_values(runtime: JaxRuntime, base: Mapping[str, str]) -> dict[str, tuple[str, str, Any]]:
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
        if chosen is not None and reads_false(base.get(enabled[0], "")):
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
        check_count_against_env_flag(runtime.cpu_devices, base)
    else:
        _check_cpu_device_count(base)
        flag = parse_xla_flags(base.get("XLA_FLAGS", "")).get(HOST_DEVICE_COUNT_FLAG)
        bad = bad_device_count_flag(flag, "the environment's XLA_FLAGS")
        if bad is not None:
            raise RuntimeConfigurationError(bad)
    for var, _, value in config_values(runtime, base).values():
        env[var] = bool_text(value) if isinstance(value, bool) else str(value)
    if runtime.xla_flags:
        env["XLA_FLAGS"] = merge_xla_flags(base.get("XLA_FLAGS", ""), runtime.xla_flags)
        if runtime.cpu_devices is None:  # with both, JaxRuntime made sure they agree
            check_flag_device_count(runtime, base.get("JAX_NUM_CPU_DEVICES"), "the environment")
    if runtime.preallocate is not None:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = bool_text(runtime.preallocate)
    if runtime.memory_fraction is not None:
        if DEPRECATED_MEMORY_FRACTION_ENV in base:
            raise RuntimeConfigurationError(
                f"memory_fraction sets XLA_CLIENT_MEM_FRACTION, but the environment also holds "
                f"the deprecated {DEPRECATED_MEMORY_FRACTION_ENV}="
                f"{base[DEPRECATED_MEMORY_FRACTION_ENV]!r}; unset it"
            )
        env["XLA_CLIENT_MEM_FRACTION"] = repr(float(runtime.memory_fraction))
    return env


def check_count_against_env_flag(cpu_devices: int, base: Mapping[str, str]) -> None:
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


def check_flag_device_count(runtime: JaxRuntime, count: str | None, count_from: str) -> None:
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
    the runtime renders it. One setting is inherited: a compilation cache ``parent`` turns off
    (``JAX_ENABLE_COMPILATION_CACHE=false``, as in a test session) stays off in the child, as
    in ``runtime_environment``, unless the runtime names its ``compilation_cache_dir`` or
    ``env`` sets ``JAX_ENABLE_COMPILATION_CACHE`` (without a runtime, nothing is inherited).

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
        inherited = source.get("JAX_ENABLE_COMPILATION_CACHE", "")
        if reads_false(inherited) and "JAX_ENABLE_COMPILATION_CACHE" not in extra:
            runtime = _cache_left_off(runtime)
        rendered = runtime_environment(runtime, child)
        _refuse_env_conflicts(extra, rendered)
        child.update(rendered)
    return child


def _cache_left_off(runtime: JaxRuntime) -> JaxRuntime:
    """``runtime`` with the cache off, unless it names its own ``compilation_cache_dir``."""
    if runtime.compilation_cache and runtime.compilation_cache_dir is None:
        return dataclasses.replace(runtime, compilation_cache=False)
    return runtime


def _refuse_env_conflicts(env: Mapping[str, str], rendered: Mapping[str, str]) -> None:
    """Raise for a variable ``env`` gives another value than the runtime renders for it."""
    for variable, required in rendered.items():
        given = env.get(variable)
        # XLA_FLAGS is merged by flag name: a flag with two values raised already
        if given is None or variable == "XLA_FLAGS" or env_values_agree(variable, given, required):
            continue
        field = _FIELD_OF.get(variable, variable)
        raise EnvironmentConflictError(
            variable=variable,
            given=given,
            required=required,
            setter=f"JaxRuntime.{field}",
            fix=f"set it in one place: drop {variable} from env, or change the runtime's {field}",
        )
