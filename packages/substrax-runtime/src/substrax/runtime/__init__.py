r"""substrax.runtime: the settings a JAX process starts with. Importing it imports no jax.

``JaxRuntime`` declares backends, emulated CPU devices, 64-bit types, matmul precision, the
compilation cache, XLA flags and accelerator memory. ``runtime_environment`` renders them for a
process that has not imported jax, ``child_environment`` builds a child's whole environment, and
``apply_runtime`` applies them to this process, refusing any setting jax would no longer read.
``initialize_distributed`` starts ``jax.distributed`` from arguments or a launcher's environment.

Example:
    >>> import os, subprocess, sys
    >>> from substrax.runtime import JaxRuntime, child_environment
    >>> runtime = JaxRuntime(platforms=("cpu",), cpu_devices=4)
    >>> env = child_environment(runtime)
    >>> program = "import jax; print(jax.device_count())"
    >>> subprocess.run([sys.executable, "-c", program], env=env, capture_output=True,
    ...                text=True, check=True).stdout  # doctest: +SKIP
    '4\n'
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read).
# The settings and their rendering load now; the rest on first use (PEP 562): they bring
# logging, ipaddress and re, which a process that only renders or applies settings before
# starting jax never needs.
lazy_exports(
    __name__,
    eager=(
        "._apply",
        "._cache",
        "._config",
        "._environment",
        "._errors",
        "._test_runtime",
        "._xla_flags",
    ),
)
