"""The pytest plugin's runtime for a jax imported before the plugin configured it.

Importing jax does not start its backends: until a jax computation (or ``jax.devices()``)
starts them, the platforms and the number of CPU devices can still be set through jax's config.

Importing this module imports no jax.
"""

import sys
from typing import TYPE_CHECKING

import pytest


if TYPE_CHECKING:
    from substrax.runtime import JaxRuntime

STARTED = (
    "jax's backends started before the substrax plugin configured them (a conftest or plugin "
    "ran a jax computation at import); move that work into a fixture"
)


def backends_started() -> bool:
    """Whether an imported jax has started its backends (jax refuses a new CPU device count)."""
    import jax  # noqa: PLC0415 - only once jax is imported

    count = jax.config.jax_num_cpu_devices
    try:
        jax.config.update("jax_num_cpu_devices", 2 if count == 1 else 1)
    except RuntimeError:
        return True
    jax.config.update("jax_num_cpu_devices", count)
    return False


def apply_test_runtime(runtime: "JaxRuntime") -> bool:
    """``apply_runtime(runtime)``, also when jax is imported but has not started its backends.

    Returns whether it was applied through jax's config (jax was imported): the environment
    variables then say what jax read at import, not what the session runs under, but for a
    compilation cache the runtime turns off (``apply_runtime`` writes
    ``JAX_ENABLE_COMPILATION_CACHE=false``, so that the session's child processes keep it off).

    Raises:
        pytest.UsageError: The runtime cannot be applied: the settings are invalid, or jax's
            backends started under other settings.
    """
    from substrax.runtime import (  # noqa: PLC0415 - keep the plugin's import light
        RuntimeConfigurationError,
        apply_runtime,
    )

    started = "jax" in sys.modules and backends_started()
    if "jax" in sys.modules and not started and runtime.platforms is not None:
        import jax  # noqa: PLC0415 - already imported

        jax.config.update("jax_platforms", ",".join(runtime.platforms))  # read at backend start
    try:
        apply_runtime(runtime)
    except (ValueError, RuntimeConfigurationError) as error:
        prefix = f"{STARTED}: " if started else ""
        raise pytest.UsageError(f"substrax test runtime: {prefix}{error}") from error
    return "jax" in sys.modules


def configured_settings() -> str:
    """The platforms, CPU device count and 64-bit mode in jax's config, as their variables."""
    import jax  # noqa: PLC0415 - only once jax is imported; reading the config starts nothing

    count = jax.config.jax_num_cpu_devices  # -1: not set
    values = {
        "JAX_PLATFORMS": jax.config.jax_platforms or None,
        "JAX_NUM_CPU_DEVICES": count if count > 0 else None,
        "JAX_ENABLE_X64": "1" if jax.config.jax_enable_x64 else None,
    }
    return " ".join(f"{name}={value}" for name, value in values.items() if value is not None)
