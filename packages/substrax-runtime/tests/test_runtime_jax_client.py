"""Each reach into jax that _jax_client holds still finds what it reads: it fails here when jax moves it."""

import sys
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.runtime import array_read_code, distributed_state, top_level_check
from substrax.runtime._jax_client import backends_started, uncached_read_check


def test_the_distributed_state_has_no_client_in_one_process():
    assert distributed_state().client is None


def test_the_top_level_check_is_false_inside_every_trace():
    is_top_level, seen = top_level_check(), []

    def record(x):
        seen.append(is_top_level())
        return x

    jax.jit(record)(1.0)
    jax.vmap(record)(jnp.ones(2))
    jax.grad(record)(1.0)
    jax.eval_shape(record, jnp.ones(3))  # a new shape: traced anew
    assert (is_top_level(), seen) == (True, [False, False, False, False])


def test_the_top_level_check_holds_on_another_thread():
    is_top_level, seen = top_level_check(), []
    worker = threading.Thread(target=lambda: seen.append(is_top_level()))
    worker.start()
    worker.join()
    assert seen == [True]


WARM_AFTER_TOP_LEVEL_CHECK = """
import json, sys
import jax, jax.numpy as jnp
from substrax.runtime import top_level_check

traces = []
step = jax.jit(lambda x: traces.append(1) or x * 2)
y = step(jnp.ones(3))
loaded = set(sys.modules)
is_top_level = top_level_check()
top = is_top_level()
y = step(y)
new = sorted(name for name in set(sys.modules) - loaded if name.startswith("jax"))
print(json.dumps({"top": top, "traces": len(traces), "new": new}))
"""


def test_the_top_level_check_leaves_warm_jitted_functions_warm(child):
    # a jax module imported late can register a setting that is part of every jit cache key
    # (jax.extend.core imports pallas, which does): each warm function would retrace once
    out = child(WARM_AFTER_TOP_LEVEL_CHECK, env={"JAX_PLATFORMS": "cpu"})
    assert out == {"top": True, "traces": 1, "new": []}


def _codes_run(read):
    codes = set()

    def profile(frame, event, arg):
        if event == "call":
            codes.add(frame.f_code)

    sys.setprofile(profile)
    try:
        read()
    finally:
        sys.setprofile(None)
    return codes


def test_every_host_read_runs_the_read_code():
    code = array_read_code()  # np.asarray too, but on CPU it reads the buffer, not this code
    for read in (float, lambda x: x.tolist(), str, jax.device_get):
        x = jnp.ones(()) + 1  # a fresh array: nothing cached
        assert code in _codes_run(lambda: read(x)), read  # noqa: B023 - called at once


def test_a_fresh_array_is_uncached_and_host_values_never_are():
    uncached = uncached_read_check()
    x = jnp.arange(3.0) * 2
    assert uncached(x)
    assert not any(map(uncached, (np.ones(2), 1.0, [x], None)))
    np.asarray(x)
    if x.devices().pop().platform != "cpu":  # CPU reads copy nothing, so nothing is cached
        assert not uncached(x)


def test_a_leaked_config_override_is_read_apart_from_the_global_value_and_cleared():
    from substrax.runtime import NO_OVERRIDE, config_settings, set_config_override

    settings = config_settings()
    assert settings["jax_enable_x64"][0] is jax.config.jax_enable_x64
    assert any(local is NO_OVERRIDE for _, local in settings.values())  # a flag has none
    before = settings["jax_transfer_guard_host_to_device"][1]
    x = jnp.ones(2)
    jax.transfer_guard_host_to_device("disallow").__enter__()  # entered, never exited
    assert config_settings()["jax_transfer_guard_host_to_device"][1] == "disallow"
    with pytest.raises(Exception, match="host-to-device transfer"):
        _ = x + np.ones(2)
    set_config_override("jax_transfer_guard_host_to_device", before)
    assert config_settings()["jax_transfer_guard_host_to_device"][1] is before
    _ = x + np.ones(2)  # the guard is gone from jax's runtime too


def test_backends_started_is_false_after_the_import_and_true_after_a_device_query(child):
    program = (
        "import json, jax\n"
        "from substrax.runtime._jax_client import backends_started\n"
        "before = backends_started()\n"
        "jax.devices()\n"
        "print(json.dumps([before, backends_started()]))\n"
    )
    assert child(program, env={"JAX_PLATFORMS": "cpu"}) == [False, True]
    assert backends_started()  # this session's jax runs
