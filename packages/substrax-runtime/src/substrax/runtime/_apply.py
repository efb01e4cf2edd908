"""Apply a ``JaxRuntime`` to this process: before jax is imported, or after."""

import os
import sys
from collections.abc import Mapping, MutableMapping
from typing import Any

from ._config import JaxRuntime
from ._environment import (
    bool_text,
    check_count_against_env_flag,
    check_flag_device_count,
    config_values,
    runtime_environment,
)
from ._errors import RuntimeConfigurationError
from ._jax_client import backends_started
from ._xla_flags import parse_xla_flags


def _device_count(jax: Any, platform: str = "cpu") -> int | None:  # noqa: ANN401 - jax
    """How many devices of ``platform`` the started backends have; None without its backend."""
    try:
        return len(jax.devices(platform))
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
    array or compile); after that they are refused unless they already hold (one platform
    holds, where ``jax_platforms`` is unset, when it is ``jax.default_backend()``); the rest go
    through ``jax.config.update``: only the fields the runtime gives, so a setting made with
    ``jax.config.update`` stays, and the default compilation cache directory fills in only when
    jax has none. A cache turned off, or on again by a ``compilation_cache_dir``, is also
    written into ``environ`` (``JAX_ENABLE_COMPILATION_CACHE``), which ``child_environment``
    passes on while it is off.

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

    if backends_started() or target is not os.environ:  # jax reads os.environ alone
        _refuse_startup_settings(runtime, target, started=target is os.environ)
    else:  # jax reads them when it starts its backends: still to come
        rendered = runtime_environment(runtime, target)
        target.update({name: v for name, v in rendered.items() if name.startswith("XLA_")})
        if runtime.platforms is not None:  # read into jax's config at its import: set there
            jax.config.update("jax_platforms", ",".join(runtime.platforms))

    if runtime.xla_flags and runtime.cpu_devices is None:
        check_flag_device_count(runtime, str(jax.config.jax_num_cpu_devices), "jax's config")

    if runtime.cpu_devices is not None:
        _apply_cpu_devices(jax, runtime.cpu_devices, target)
    # a cache directory jax already has (from its environment, or jax.config.update) is kept:
    # only the runtime's own compilation_cache_dir replaces it
    base = dict(target)
    if current_dir := jax.config.jax_compilation_cache_dir:
        base["JAX_COMPILATION_CACHE_DIR"] = str(current_dir)
    base["JAX_ENABLE_COMPILATION_CACHE"] = bool_text(jax.config.jax_enable_compilation_cache)
    changed = False
    for _, name, value in config_values(runtime, base).values():
        changed |= "compilation_cache" in name and getattr(jax.config, name) != value
        jax.config.update(name, value)
    if changed:  # jax sets its cache up at the first compile: a new directory needs a reset
        from jax.experimental.compilation_cache import compilation_cache  # noqa: PLC0415

        compilation_cache.reset_cache()
    if not runtime.compilation_cache or runtime.compilation_cache_dir is not None:
        # written too, off or on again: child_environment's children keep it off while it is
        target["JAX_ENABLE_COMPILATION_CACHE"] = bool_text(jax.config.jax_enable_compilation_cache)


def _apply_cpu_devices(jax: Any, count: int, environ: Mapping[str, str]) -> None:  # noqa: ANN401
    """Set jax's CPU device count once jax is imported; refused as before jax's import."""
    previous = jax.config.jax_num_cpu_devices
    if previous != count:
        try:
            jax.config.update("jax_num_cpu_devices", count)
        except RuntimeError as error:
            if _device_count(jax) != count:  # else it holds (XLA_FLAGS' count)
                raise RuntimeConfigurationError(
                    f"cpu_devices={count} cannot be applied: jax has already started its "
                    f"backends ({error}); set JAX_NUM_CPU_DEVICES before the first jax call"
                ) from error
            previous = count  # nothing was changed
    try:  # jax would take the count and leave environ's own flag behind for child processes
        check_count_against_env_flag(count, environ)
    except RuntimeConfigurationError:
        jax.config.update("jax_num_cpu_devices", previous)
        raise


def platforms_agree(wanted: tuple[str, ...], has: tuple[str, ...]) -> bool:
    """Whether jax's platforms ``has`` are the ``wanted`` ones, name by name, in order.

    jax's ``gpu`` is its name for either GPU platform: ``jax.default_backend()`` says ``gpu``
    on a machine whose backend is ``cuda`` (or ``rocm``), and ``JAX_PLATFORMS=gpu`` picks one, so
    ``cuda`` and ``rocm`` each agree with ``gpu`` (not with each other).

    Example:
        >>> from substrax.runtime._apply import platforms_agree
        >>> platforms_agree(("cuda",), ("gpu",)), platforms_agree(("cuda", "cpu"), ("cuda", "cpu"))
        (True, True)
        >>> platforms_agree(("rocm",), ("cuda",)), platforms_agree(("cpu",), ("gpu",))
        (False, False)
    """
    gpus = {"gpu", "cuda", "rocm"}
    return len(wanted) == len(has) and all(
        w == h or ("gpu" in (w, h) and {w, h} <= gpus) for w, h in zip(wanted, has, strict=True)
    )


def _refuse_startup_settings(
    runtime: JaxRuntime, environ: Mapping[str, str], *, started: bool = True
) -> None:
    """Raise for the settings jax reads only at start, unless they already hold.

    ``started``: jax started its backends; else ``environ`` is not the one jax reads.
    """
    stale: list[str] = []
    if runtime.platforms is not None:
        import jax  # noqa: PLC0415 - jax is already imported

        current = jax.config.jax_platforms or ""
        names = tuple(p.strip() for p in current.split(",") if p.strip())
        has = f"jax has {current!r}"
        if not names:  # jax started every backend it found, and made one the default
            names = (jax.default_backend(),)
            has = f"jax_platforms is unset and jax's default backend is {names[0]!r}"
            others = runtime.platforms[1:]  # after the default: they hold if jax started them
            if missing := [p for p in others if _device_count(jax, p) is None]:
                has += f", and it started no {', '.join(missing)} backend"
            else:
                names += others
        if not platforms_agree(runtime.platforms, names):
            stale.append(f"platforms={runtime.platforms!r} ({has})")
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
        if started:
            why, fix = (
                "jax has started its backends",
                (
                    "apply the runtime before jax starts its backends (its first device query, "
                    "array or compile)"
                ),
            )
        else:
            why = "jax is imported and reads os.environ, not the environ= given"
            fix = "leave environ= out to apply them to this process"
        raise RuntimeConfigurationError(
            f"{why}, so {', '.join(stale)} would no longer be read; {fix}, or run a child "
            "process with child_environment(runtime)"
        )
