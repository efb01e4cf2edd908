"""``JaxRuntime``: the settings a JAX process starts with, validated on construction."""

# Callers are untyped at run time: the isinstance checks below are the validation.
# pyright: reportUnnecessaryIsInstance=false

# Annotations stay unevaluated so that pathlib (5 ms with what it imports) loads only when a
# compilation cache directory is actually given.
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from substrax.support import check_float, check_int, check_seconds

from ._xla_flags import (
    HOST_DEVICE_COUNT_FLAG,
    bad_device_count_flag,
    device_count_conflict,
    merge_xla_flags,
    parse_xla_flags,
)


if TYPE_CHECKING:
    from pathlib import Path


# an assignment, not a `type` statement: `typing.get_args` reads it, as in 0.1.22
MatmulPrecision = Literal["default", "high", "highest", "bfloat16", "tensorfloat32", "float32"]
MATMUL_PRECISIONS: tuple[str, ...] = get_args(MatmulPrecision)


def _check_bool(name: str, value: object) -> None:
    if value is not None and not isinstance(value, bool):
        raise TypeError(f"JaxRuntime.{name} must be a bool or None, got {value!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class JaxRuntime:
    """The JAX settings of one process; ``None`` (or ``()``) leaves a setting alone.

    Each field maps to the variable jax reads when it starts (``runtime_environment`` renders
    them) or to a ``jax.config`` option (``apply_runtime`` sets those in a running process).

    Attributes:
        platforms: Backends in priority order (``JAX_PLATFORMS``), e.g. ``("cpu",)``: jax's
            case-sensitive names (``cpu``, ``cuda``, ``rocm``, ``gpu``, ``tpu``) or a plugin's.
            A name jax cannot start is reported when jax starts (``detect_devices`` raises
            ``RuntimeConfigurationError`` naming ``JAX_PLATFORMS``).
        cpu_devices: Emulated CPU devices (``JAX_NUM_CPU_DEVICES``), at least 1.
        enable_x64: 64-bit types (``JAX_ENABLE_X64``).
        matmul_precision: Default matmul precision (``JAX_DEFAULT_MATMUL_PRECISION``).
        compilation_cache_dir: Absolute persistent-cache path (``JAX_COMPILATION_CACHE_DIR``);
            None keeps a ``JAX_COMPILATION_CACHE_DIR`` the environment already sets, else
            :func:`default_compilation_cache_dir`, the user cache directory.
        compilation_cache: jax's persistent compilation cache, on by default so that a second
            run of the same program skips compiling its steps; False turns it off
            (``JAX_ENABLE_COMPILATION_CACHE=false``). True is the default, so it cannot tell
            a wish from silence: a cache the environment (or an earlier runtime) turned off
            stays off. Name ``compilation_cache_dir`` to turn it on again.
        xla_flags: Flags merged by name into ``XLA_FLAGS``.
        preallocate: Accelerator memory preallocation (``XLA_PYTHON_CLIENT_PREALLOCATE``).
        memory_fraction: Accelerator memory share in (0, 1] (``XLA_CLIENT_MEM_FRACTION``).
        debug_nans: Fail on the first NaN produced (``JAX_DEBUG_NANS``).
        log_compiles: Log every compilation (``JAX_LOG_COMPILES``).
        persistent_cache_min_compile_time_secs: Only compilations at least this long are written
            to the persistent cache (``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``).

    Raises:
        TypeError: A field has the wrong type (a bool is never a count or a fraction).
        ValueError: A value is out of range, a path is relative, an XLA flag is malformed,
            ``--xla_force_host_platform_device_count`` is not a whole number >= 1 (as
            ``cpu_devices`` must be), or the two ask for two counts.
        XlaFlagConflictError: ``xla_flags`` repeats a flag with two values.

    Example:
        >>> from substrax.runtime import JaxRuntime
        >>> runtime = JaxRuntime(platforms=("cpu",), cpu_devices=8)
        >>> runtime.cpu_devices
        8
        >>> JaxRuntime(cpu_devices=0)
        Traceback (most recent call last):
        ...
        ValueError: JaxRuntime.cpu_devices=0 must be an integer >= 1
    """

    platforms: tuple[str, ...] | None = None
    cpu_devices: int | None = None
    enable_x64: bool | None = None
    matmul_precision: MatmulPrecision | None = None
    compilation_cache_dir: Path | None = None
    compilation_cache: bool = True
    xla_flags: tuple[str, ...] = ()
    preallocate: bool | None = None
    memory_fraction: float | None = None
    debug_nans: bool | None = None
    log_compiles: bool | None = None
    persistent_cache_min_compile_time_secs: float | None = None

    def __post_init__(self) -> None:
        self._check_platforms()
        self._check_cpu_devices()
        for name in ("enable_x64", "preallocate", "debug_nans", "log_compiles"):
            _check_bool(name, getattr(self, name))
        if self.matmul_precision is not None and self.matmul_precision not in MATMUL_PRECISIONS:
            raise ValueError(
                f"JaxRuntime.matmul_precision {self.matmul_precision!r} is not one of "
                f"{', '.join(MATMUL_PRECISIONS)}"
            )
        self._check_cache_dir()
        self._check_memory_fraction()
        self._check_min_compile_time()
        flags: object = self.xla_flags
        if not isinstance(flags, tuple):
            raise TypeError(
                f"JaxRuntime.xla_flags must be a tuple of flags, got {self.xla_flags!r}"
            )
        flag = parse_xla_flags(merge_xla_flags("", self.xla_flags)).get(HOST_DEVICE_COUNT_FLAG)
        bad = bad_device_count_flag(flag, "JaxRuntime.xla_flags")
        if bad is not None:
            raise ValueError(bad)
        count = None if self.cpu_devices is None else str(self.cpu_devices)
        conflict = device_count_conflict(
            count, flag, count_from="JaxRuntime.cpu_devices", flag_from="JaxRuntime.xla_flags"
        )
        if conflict is not None:
            raise ValueError(conflict)

    def _check_platforms(self) -> None:
        platforms: object = self.platforms
        if platforms is None:
            return
        if not isinstance(platforms, tuple) or not all(isinstance(p, str) for p in platforms):
            raise TypeError(
                f"JaxRuntime.platforms must be a tuple of names such as ('cpu',), got {platforms!r}"
            )
        if not platforms:
            raise ValueError("JaxRuntime.platforms must name at least one platform, or be None")
        for name in platforms:
            if not name.strip() or "," in name or name != name.strip():
                raise ValueError(
                    f"JaxRuntime.platforms entry {name!r} must be a name without commas or "
                    "spaces around it, such as 'cpu' or 'cuda'"
                )

    def _check_cpu_devices(self) -> None:
        if self.cpu_devices is not None:
            check_int("JaxRuntime.cpu_devices", self.cpu_devices, minimum=1)

    def _check_cache_dir(self) -> None:
        enabled: object = self.compilation_cache
        if not isinstance(enabled, bool):
            raise TypeError(f"JaxRuntime.compilation_cache must be a bool, got {enabled!r}")
        path: object = self.compilation_cache_dir
        if path is None:
            return
        if not enabled:
            raise ValueError(
                f"JaxRuntime.compilation_cache=False turns the cache off, but "
                f"compilation_cache_dir={str(path)!r} names one; drop one of the two"
            )
        from pathlib import Path  # noqa: PLC0415 - see the note on the imports

        if isinstance(path, str | os.PathLike) and not isinstance(path, Path):  # coerce str paths
            path = Path(path)
            object.__setattr__(self, "compilation_cache_dir", path)
        if not isinstance(path, Path):
            raise TypeError(f"JaxRuntime.compilation_cache_dir must be a Path, got {path!r}")
        if not path.is_absolute():
            raise ValueError(
                f"JaxRuntime.compilation_cache_dir must be absolute, got {str(path)!r}; "
                "pass Path(...).resolve()"
            )

    def _check_memory_fraction(self) -> None:
        if self.memory_fraction is not None:
            check_float(
                "JaxRuntime.memory_fraction",
                self.memory_fraction,
                minimum=0,
                maximum=1,
                exclusive_minimum=True,
            )

    def _check_min_compile_time(self) -> None:
        value = self.persistent_cache_min_compile_time_secs
        if value is not None:
            check_seconds("JaxRuntime.persistent_cache_min_compile_time_secs", value)
