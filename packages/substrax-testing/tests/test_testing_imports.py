"""The package root and the plugin import no jax: a process can still configure jax."""

import pytest

from substrax.testing import run_python


@pytest.mark.usefixtures("child_processes")
def test_importing_the_package_and_the_plugin_leaves_jax_unloaded():
    program = (
        "import json, sys\n"
        "import substrax.testing, substrax.testing.pytest_plugin\n"
        "import substrax.testing._compiles, substrax.testing._jax_config\n"
        "import substrax.testing.jax_calls, substrax.testing.gradients, substrax.testing._examples\n"
        "print(json.dumps(sorted(m for m in ('jax', 'jaxlib', 'flax') if m in sys.modules)))"
    )
    assert run_python(program, timeout=60).check().last_json() == []
