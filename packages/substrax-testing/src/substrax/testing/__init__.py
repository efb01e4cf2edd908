"""substrax.testing: fresh-interpreter runs, trace and compile counting, and a pytest plugin.

Importing this package imports no jax: each name is loaded from its module when first used
(PEP 562), and the helpers that need jax import it when called, so a test can still choose the
JAX settings of its process. The pytest plugin is opt-in, from a
``conftest.py``: ``pytest_plugins = ["substrax.testing.pytest_plugin"]``.

Example:
    >>> import jax
    >>> import jax.numpy as jnp
    >>> from substrax.runtime import JaxRuntime
    >>> from substrax.testing import TraceCounter, expect_compiles, run_python
    >>> program = "import json, jax; print(json.dumps(jax.device_count()))"
    >>> run_python(program, runtime=JaxRuntime(cpu_devices=8), timeout=120).check().last_json()
    8
    >>> counter = TraceCounter()
    >>> step, x = jax.jit(counter.wrap(lambda x: x * 2)), jnp.ones(3)
    >>> with counter.expect(new_traces=1), expect_compiles(1):
    ...     for _ in range(3):
    ...         x = step(x)
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read);
# each loads from its module on first use (PEP 562), then is kept here.
lazy_exports(__name__)
