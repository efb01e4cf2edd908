"""Pick a test run's backend and emulated CPU device count from its environment."""

from collections.abc import Mapping

from substrax.support import check_int

from ._config import JaxRuntime
from ._errors import RuntimeConfigurationError
from ._xla_flags import parse_xla_flags


_HOST_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
_CUDA_NAMES = frozenset({"cuda", "gpu"})
# jax's platform names are case-sensitive: a name given in another case is read as the known one
_KNOWN_PLATFORMS = {name.lower(): name for name in ("cpu", "cuda", "rocm", "tpu", "gpu", "METAL")}


def resolve_test_runtime(
    env: Mapping[str, str],
    *,
    prefix: str,
    cuda_plugin_available: bool,
    default_cpu_devices: int = 8,
) -> JaxRuntime:
    """Choose the ``JaxRuntime`` a test session runs under.

    ``{prefix}JAX_PLATFORMS`` opts a run onto accelerators; an inherited ``JAX_PLATFORMS``
    (say ``cuda,cpu`` on a GPU box) deliberately does not move tests onto the GPU. Otherwise
    the run is on cpu with this many emulated devices:

    1. ``{prefix}DEVICE_COUNT``, a non-negative integer (``0`` means no emulation);
    2. none, when ``JAX_NUM_CPU_DEVICES`` or ``--xla_force_host_platform_device_count`` is set;
    3. ``default_cpu_devices``.

    A platform name is read in any case (``metal`` is jax's ``METAL``, ``CUDA`` its ``cuda``);
    one jax does not know is kept as written. Accelerator memory is not preallocated
    (``preallocate=False``) unless ``XLA_PYTHON_CLIENT_PREALLOCATE`` is already set. The
    persistent compilation cache is off, so that a test run neither reads nor writes the user's
    cache directory.

    Args:
        env: The session's environment (usually ``os.environ``).
        prefix: The project's variable prefix, e.g. ``"SUBSTRAX_TEST_"``.
        cuda_plugin_available: Whether a CUDA plugin for jax is installed.
        default_cpu_devices: The device count when nothing else says (``0`` for none).

    Returns:
        The runtime to apply before jax is imported.

    Raises:
        ValueError: ``{prefix}DEVICE_COUNT`` is not a non-negative integer.
        RuntimeConfigurationError: cuda is asked for and no CUDA plugin is installed.

    Example:
        >>> from substrax.runtime import resolve_test_runtime
        >>> resolve_test_runtime({}, prefix="T_", cuda_plugin_available=False)
        JaxRuntime(platforms=('cpu',), cpu_devices=8, enable_x64=None, matmul_precision=None, compilation_cache_dir=None, compilation_cache=False, xla_flags=(), preallocate=False, memory_fraction=None, debug_nans=None, log_compiles=None, persistent_cache_min_compile_time_secs=None)
    """
    check_int("default_cpu_devices", default_cpu_devices, minimum=0)
    platforms_var = f"{prefix}JAX_PLATFORMS"
    names = [name.strip() for name in env.get(platforms_var, "").split(",") if name.strip()]
    requested = tuple(_KNOWN_PLATFORMS.get(name.lower(), name) for name in names)
    preallocate = False if "XLA_PYTHON_CLIENT_PREALLOCATE" not in env else None
    if any(name != "cpu" for name in requested):
        if not cuda_plugin_available and _CUDA_NAMES.intersection(requested):
            raise RuntimeConfigurationError(
                f"{platforms_var}={env[platforms_var]!r} asks for cuda, but no jax CUDA plugin "
                "is installed; install jax[cuda12] (the substrax-runtime[cuda12] extra) or unset it"
            )
        return JaxRuntime(platforms=requested, compilation_cache=False, preallocate=preallocate)
    return JaxRuntime(
        platforms=("cpu",),
        cpu_devices=_cpu_device_count(env, prefix, default_cpu_devices),
        compilation_cache=False,
        preallocate=preallocate,
    )


def _cpu_device_count(env: Mapping[str, str], prefix: str, default: int) -> int | None:
    count_var = f"{prefix}DEVICE_COUNT"
    raw = env.get(count_var)
    if raw is not None:
        text = raw.strip()
        if not text.isdecimal():
            raise ValueError(
                f"{count_var}={raw!r} must be a non-negative integer (0 turns emulation off)"
            )
        return int(text) or None
    if "JAX_NUM_CPU_DEVICES" in env:
        return None
    if _HOST_DEVICE_COUNT_FLAG in parse_xla_flags(env.get("XLA_FLAGS", "")):
        return None
    return default or None
