"""counted_calls, by_package and per_iteration on real jax programs."""

import copy
import functools
import json
import sys
import threading
from collections import Counter

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from substrax.testing import (
    CallCounts,
    CountingFailedError,
    ToolIdsInUseError,
    TooManyCallsError,
    UnevenCountError,
    by_package,
    counted_calls,
    per_iteration,
    run_python,
    started,
)
from substrax.testing.jax_calls import ALIASES, JAX_CALL_WEIGHTS, KINDS


HERE = by_package(__name__)


def test_each_kind_is_counted_and_attributed_to_the_calling_module():
    double = jax.jit(lambda x: x * 2)
    host, device = np.arange(4.0, dtype=np.float32), jnp.ones(2)
    with counted_calls(HERE) as calls:
        x = jax.device_put({"a": host, "b": host, "c": device})  # two host leaves
        y = double(x["a"])  # compiles, then runs
        y = double(y)  # cached: runs only
        first = float(y[0])  # two eager ops (slice, squeeze), one read
        again = np.asarray(y)  # a read (on CPU through the buffer protocol)
        listed = y.tolist()  # a read
    assert first == 0.0
    assert again.tolist() == listed
    assert calls.of("host_to_device") == 2
    assert calls.of("dispatch") == 4
    assert calls.of("device_to_host") == 3
    assert calls.of("compile") >= 1  # the jit, and the eager slice/squeeze if not yet cached
    assert set(calls.packages("compile")) == {__name__}
    assert {package for _, package in calls} == {__name__}


def test_calls_made_while_tracing_are_not_dispatches():
    inner = jax.jit(lambda x: jnp.sin(x) + 1)
    outer = jax.jit(lambda x: inner(jnp.cos(x)) * inner(x))
    x = jnp.ones(3)
    outer(x)
    with counted_calls() as calls:
        jax.block_until_ready(outer(x))
    assert calls.kinds() == {"dispatch": 1, "host_to_device": 0, "device_to_host": 0, "compile": 0}


def test_a_first_call_compiles_and_a_new_shape_compiles_again():
    step = jax.jit(lambda x: x - 1)
    five, six = jnp.ones(5), jnp.ones(6)
    with counted_calls(HERE) as calls:
        step(five)
        step(five)
        step(six)
    assert calls.kinds() == {"dispatch": 3, "host_to_device": 0, "device_to_host": 0, "compile": 2}


def test_other_threads_are_not_counted():
    step, x = jax.jit(lambda x: x + 2), jnp.ones(3)
    step(x)
    with counted_calls() as calls:
        worker = threading.Thread(target=lambda: [float(step(x)[0]) for _ in range(5)])
        worker.start()
        worker.join()
        step(x)
    assert calls.kinds()["dispatch"] == 1
    assert calls.kinds()["device_to_host"] == 0


def test_default_keys_name_the_first_package_outside_jax():
    x = jnp.ones(3)
    with counted_calls() as calls:
        np.asarray(x + 1)
    top = __name__.partition(".")[0]
    assert calls.packages("dispatch") == {top: 1}
    assert calls.packages("device_to_host") == {top: 1}


def test_weights_choose_and_scale_the_kinds():
    step, x = jax.jit(lambda x: x * 3), jnp.ones(2)
    step(x)
    with counted_calls(HERE, weights={"dispatch": 2}) as calls:
        float(step(x).sum())
    assert calls.kinds() == {"dispatch": 4, "host_to_device": 0, "device_to_host": 0, "compile": 0}
    assert dict(JAX_CALL_WEIGHTS) == dict.fromkeys(KINDS, 1)


@pytest.mark.parametrize(
    ("weights", "error", "match"),
    [
        ({"dispatches": 1}, ValueError, "unknown call kind 'dispatches'"),
        ({"compile": -1}, ValueError, "compile"),
        ({"compile": 1.5}, TypeError, "compile"),
        # a hostile finding: it was "unknown call kind 'calls'"
        ({"calls": None}, TypeError, r"weights\['calls'\] must be a weight function .* None"),
        (
            {"jit_dispatch": 1, "dispatch": 5},
            ValueError,
            "two weights: jit_dispatch=1 and dispatch=5",
        ),
    ],
)
def test_bad_weights_are_refused_before_counting(weights, error, match):
    before = [sys.monitoring.get_tool(tool) for tool in range(6)]
    with pytest.raises(error, match=match), counted_calls(weights=weights):
        raise AssertionError("the block must not run")
    assert [sys.monitoring.get_tool(tool) for tool in range(6)] == before


def test_a_failing_keys_function_stops_counting_and_is_raised_at_exit():
    def keys(frame):
        raise KeyError(frame.f_code.co_name)

    x = jnp.ones(2)
    failed = pytest.raises(CountingFailedError, match="keys function failed on a dispatch")
    with failed as info, counted_calls(keys):
        x + 1
    assert (info.value.kind, info.value.culprit) == ("dispatch", "keys")
    assert isinstance(info.value.__cause__, KeyError)


def test_a_keys_function_must_return_a_str():
    x = jnp.ones(2)
    with (
        pytest.raises(CountingFailedError, match="returned 3, not a str"),
        counted_calls(lambda _: 3),
    ):
        x + 1


def test_the_tool_id_is_released_and_blocks_nest():
    before = [sys.monitoring.get_tool(tool) for tool in range(6)]
    x = jnp.ones(2)
    with counted_calls() as outer:
        with counted_calls() as inner:
            x + 1
        x * 2
    assert (outer.of("dispatch"), inner.of("dispatch")) == (2, 1)
    assert [sys.monitoring.get_tool(tool) for tool in range(6)] == before


def test_no_free_tool_id_is_an_error_naming_the_holders():
    taken = [tool for tool in range(6) if sys.monitoring.get_tool(tool) is None]
    for tool in taken:
        sys.monitoring.use_tool_id(tool, f"holder{tool}")
    try:
        refused = pytest.raises(ToolIdsInUseError, match=r"every sys\.monitoring tool id")
        with refused as info, counted_calls():
            raise AssertionError("the block must not run")
        assert {f"holder{tool}" for tool in taken} <= set(info.value.in_use)
        assert all(f"holder{tool}" in str(info.value) for tool in taken)
    finally:
        for tool in taken:
            sys.monitoring.free_tool_id(tool)


def _looping(body):
    def count(n):
        with counted_calls(HERE) as calls:
            for i in range(n):
                body(i)
        return calls

    return count


def test_per_iteration_subtracts_what_both_runs_share():
    step, state = jax.jit(lambda x: x * 0.5), {"x": jnp.ones(4)}
    step(state["x"])

    def body(i):
        state["x"] = step(state["x"])

    def count(n):
        with counted_calls(HERE) as calls:
            np.asarray(state["x"])  # once per run: cancels out
            for i in range(n):
                body(i)
        return calls

    per = per_iteration(count, short=1, long=4, at_most={"dispatch": 1, "device_to_host": 0})
    assert per == CallCounts({("dispatch", __name__): 1})


def test_a_host_read_every_iteration_is_too_many():
    step, state = jax.jit(lambda x: x + 1), {"x": jnp.zeros(())}
    step(state["x"])

    def body(i):
        state["x"] = step(state["x"])
        float(state["x"])

    with pytest.raises(TooManyCallsError) as info:
        per_iteration(_looping(body), short=2, long=4, at_most={"device_to_host": 0})
    assert (info.value.kind, info.value.limit, info.value.observed) == ("device_to_host", 0, 1)
    assert info.value.packages == ((__name__, 1),)
    assert "read on the host every step" in str(info.value)


def test_work_on_some_iterations_only_is_uneven():
    step, x = jax.jit(lambda x: x + 1), jnp.zeros(())
    step(x)

    def body(i):
        y = step(x)
        if i % 3 == 2:
            float(y)

    with pytest.raises(UnevenCountError) as info:
        per_iteration(_looping(body), short=1, long=3)
    assert (info.value.kind, info.value.short_count, info.value.long_count) == (
        "device_to_host",
        0,
        1,
    )


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"short": 3, "long": 3}, "must be more than"),
        ({"short": -1, "long": 2}, "short"),
    ],
)
def test_per_iteration_refuses_bad_arguments(kwargs, match):
    def count(n):
        raise AssertionError("must not run")

    with pytest.raises(ValueError, match=match):
        per_iteration(count, **kwargs)


def test_call_counts_views():
    counts = CallCounts({("dispatch", "a"): 2, ("compile", "b"): 1})
    assert counts.kinds() == {"dispatch": 2, "host_to_device": 0, "device_to_host": 0, "compile": 1}
    assert counts.packages("compile") == {"b": 1}
    with pytest.raises(ValueError, match="unknown call kind 'compiles'"):
        counts.of("compiles")


def test_an_unknown_kind_in_at_most_is_refused_once_the_counts_name_their_kinds():
    with pytest.raises(ValueError, match="unknown call kind 'transfers'"):
        per_iteration(lambda _: CallCounts(), short=1, long=2, at_most={"transfers": 0})


def _helper(n):
    return [json.dumps(i) for i in range(n)]


def test_started_functions_are_counted_by_package_and_by_name():
    keys = by_package("json", named=(f"{__name__}._helper", "json.dumps"))
    with counted_calls(keys, weights={"calls": started("json", f"{__name__}._helper")}) as calls:
        _helper(3)
    assert calls.custom_kinds == ("calls",)
    # the nearest named function on the stack wins: dumps' own starts and its encoder's
    assert calls.packages("calls")["json.dumps"] >= 6
    assert calls.of("calls", f"{__name__}._helper") == 1
    assert calls.of("calls", "json") == 0  # each json function started under dumps
    assert calls.kinds()["calls"] == calls.of("calls")
    assert calls.of("dispatch") == 0  # only the kinds weighted are counted


_DOUBLE = jax.jit(lambda x: x * 2)


def _forward(x):  # a helper of _train_step, in the same module (a listed package)
    return _DOUBLE(x)


def _train_step(x):
    return _forward(_DOUBLE(x))  # one call made directly, one through the helper


def test_a_named_function_counts_every_call_made_under_it_through_a_package():
    """Hostile finding: the helper's call was counted under the package, not the named step."""
    x = jnp.ones(3)
    _train_step(x)
    keys = by_package(__name__, named=(f"{__name__}._train_step",))
    with counted_calls(keys) as calls:
        _train_step(x)
        _forward(x)  # not under the named function: its package's
    assert calls.packages("dispatch") == {f"{__name__}._train_step": 2, __name__: 1}


@jax.jit
def _jitted_step(x):
    return x + 1


@nnx.jit
def _nnx_step(x):
    return x * 3


def test_a_named_jitted_function_counts_its_dispatches_under_its_name():
    """Hostile finding: a jax.jit function's dispatches counted as 'other', its name unseen."""
    x = jnp.ones(3)
    _jitted_step(x)
    _nnx_step(x)
    named = (f"{__name__}._jitted_step", f"{__name__}._train_step", f"{__name__}._nnx_step")
    with counted_calls(by_package("json", named=named)) as calls:
        _jitted_step(x)
        _nnx_step(x)  # it was counted under flax
        functools.partial(_jitted_step)(x)
        _train_step(x)  # not the jitted one: under the named function it was made in
        _DOUBLE(x)  # a jitted lambda not named: other
    assert calls.packages("dispatch") == {
        f"{__name__}._jitted_step": 2,
        f"{__name__}._train_step": 2,
        f"{__name__}._nnx_step": 1,
        "other": 1,
    }


def test_a_weight_function_decides_how_much_each_start_counts():
    def leaves(frame):  # the leaves handed to jax.device_put, traced calls included
        if frame.f_code is not jax.device_put.__code__:
            return 0
        return len(jax.tree.leaves(frame.f_locals["x"]))

    with counted_calls(HERE, weights={"put_leaves": leaves}) as calls:
        jax.device_put({"a": np.ones(2), "b": (np.ones(1), jnp.ones(3))})
        jax.device_put(np.ones(2))
    assert calls == CallCounts({("put_leaves", __name__): 4}, custom_kinds=("put_leaves",))


def test_the_names_of_0_1_22_are_accepted():
    double = jax.jit(lambda x: x * 2)
    double(jnp.ones(2))
    weights = {"jit_dispatch": 1, "device_put": 1, "device_put_leaves": 1}
    with counted_calls(HERE, weights=weights) as calls:
        jax.device_put((np.ones(2), np.ones(3)))
        double(jnp.ones(2))
    assert ALIASES == {"jit_dispatch": "dispatch", "device_put_leaves": "host_to_device"}
    assert calls.of("device_put") == 1
    with counted_calls(HERE) as unweighted:
        jax.device_put(np.ones(2))
    assert unweighted.of("device_put") == 0  # counted only when weighted
    with pytest.raises(ValueError, match="at_most names device_put, which was not counted"):
        per_iteration(lambda _: CallCounts(), short=0, long=1, at_most={"device_put": 0})
    assert calls.of("device_put_leaves") == calls.of("host_to_device") == 2
    assert calls.of("jit_dispatch") == calls.of("dispatch") >= 2  # jnp.ones runs a program too


def test_a_limit_on_device_put_weighted_0_is_refused():
    def count(n):  # device_put weighted 0: not counted, as when left out
        with counted_calls(HERE, weights={"device_put": 0, "host_to_device": 1}) as calls:
            for _ in range(n):
                jax.device_put(np.ones(2))
        return calls

    assert count(1).of("device_put") == 0
    with pytest.raises(ValueError, match="at_most names device_put, which was not counted"):
        per_iteration(count, short=1, long=3, at_most={"device_put": 0})


def test_per_iteration_works_key_by_key_on_any_counter():
    counts = {1: Counter(steps=3, reads=1), 3: Counter(steps=7, reads=1)}
    assert per_iteration(counts.__getitem__, short=1, long=3) == {"steps": 2}
    with pytest.raises(TooManyCallsError) as too_many:
        per_iteration(counts.__getitem__, short=1, long=3, at_most={"steps": 1})
    assert (too_many.value.kind, too_many.value.observed) == ("steps", 2)
    uneven = {1: Counter(steps=3), 3: Counter(steps=6)}
    with pytest.raises(UnevenCountError) as info:
        per_iteration(uneven.__getitem__, short=1, long=3)
    assert (info.value.kind, info.value.short_count, info.value.long_count) == ("steps", 3, 6)


def test_per_iteration_limits_a_custom_kind():
    def count(n):
        with counted_calls(HERE, weights={"calls": started(f"{__name__}._helper")}) as calls:
            for _ in range(n):
                _helper(1)
                _helper(1)
        return calls

    per = per_iteration(count, short=1, long=3)
    assert per == CallCounts({("calls", __name__): 2}, custom_kinds=("calls",))
    with pytest.raises(TooManyCallsError) as info:
        per_iteration(count, short=1, long=3, at_most={"calls": 1})
    assert (info.value.kind, info.value.observed) == ("calls", 2)
    assert str(info.value) == (  # no hint of the built-in kinds', and no empty one
        "each iteration makes 2 call(s) of the kind 'calls', more than the 1 allowed "
        f"(by package: {__name__}: 2)"
    )
    with pytest.raises(
        ValueError, match=r"unknown call kind 'cals'.* of your own counted here: calls"
    ):
        per_iteration(count, short=1, long=3, at_most={"cals": 1})  # a misspelled kind of yours


@pytest.mark.parametrize(
    ("weight", "reason"),
    [
        (lambda _: 1 / 0, "ZeroDivisionError"),
        (lambda _: -1, "not an int >= 0"),
        (lambda _: "1", "not an int >= 0"),
        (lambda _: True, "it returned True, a bool, not an int"),
    ],
)
def test_a_failing_weight_function_stops_counting(weight, reason):
    refused = pytest.raises(CountingFailedError, match=reason)
    with refused as info, counted_calls(HERE, weights={"mine": weight}):
        _helper(1)
    assert (info.value.kind, info.value.culprit) == ("mine", "weight")
    assert "the weight function failed on a mine" in str(info.value)


def test_the_garbage_collector_is_paused_in_the_block_and_restored_after():
    import gc

    assert gc.isenabled()
    with counted_calls():
        assert not gc.isenabled()  # a finalizer run by a collection would add its calls
    assert gc.isenabled()
    gc.disable()
    try:
        with counted_calls():
            pass
        assert not gc.isenabled()  # left as it was found
    finally:
        gc.enable()


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: by_package("mylib", named=("",)), "named must be non-empty"),
        (lambda: by_package("mylib", named="mylib.f"), "named must be a sequence of names"),
        (lambda: by_package(excluded="jax"), "excluded must be a sequence of names"),
        (lambda: by_package("mylib", other=None), "other must be a non-empty str"),
        (started, "at least one"),
        (lambda: started("mylib", ""), "names must be non-empty"),
    ],
)
def test_bad_names_are_refused(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


@pytest.mark.parametrize(
    ("build", "error", "match"),
    [
        (lambda: by_package(excluded=[1]), TypeError, r"excluded must hold names \(str\), not 1"),
        (lambda: by_package(excluded=["jax", ""]), ValueError, "excluded must be non-empty .* ''"),
        (lambda: by_package(excluded=b"jax"), TypeError, "excluded .* not the bytes b'jax'"),
        (lambda: by_package(excluded=None), TypeError, "excluded must be a sequence .* None"),
        (lambda: by_package(named=None), TypeError, "named must be a sequence .* None"),
        (lambda: by_package(named=["a.b", 2]), TypeError, r"named must hold names \(str\), not 2"),
        (lambda: by_package(" "), ValueError, "packages must be non-empty .* ' '"),
        (lambda: by_package("mylib."), ValueError, "packages must be non-empty .* 'mylib.'"),
        (lambda: by_package("my lib"), ValueError, "packages must be non-empty .* 'my lib'"),
        (lambda: by_package(["mylib"]), TypeError, r"packages must hold names .* \['mylib'\]"),
        (lambda: started("mylib..train"), ValueError, "names must be non-empty .* 'mylib..train'"),
    ],
)
def test_each_bad_name_is_refused_naming_its_argument(build, error, match):
    with pytest.raises(error, match=match):
        build()


def test_excluded_and_named_may_be_any_iterable_of_names():
    keys = by_package(excluded=(name for name in ("jax", "numpy")), named=iter(["a.f"]))
    frame = eval("sys._getframe()", {"__name__": "jax.inner", "sys": sys})  # noqa: S307
    assert keys(frame) == keys(frame) == __name__.partition(".")[0]  # jax's frame looked through


def test_an_int_weight_for_an_unknown_kind_points_to_weight_functions():
    with pytest.raises(ValueError, match="weight function"), counted_calls(weights={"steps": 1}):
        raise AssertionError("the block must not run")


FIRST_BLOCK = """
import json
import jax, jax.numpy as jnp
from substrax.testing import counted_calls, per_iteration

traces = []
step = jax.jit(lambda x: traces.append(1) or x + 1)
x = step(jnp.ones(3))  # warm: traced and compiled once
with counted_calls() as calls:  # the process's first block
    x = step(x)
first = calls.kinds()


def count(n):  # per_iteration's docstring example
    global x
    with counted_calls() as calls:
        for _ in range(n):
            x = step(x)
    return calls


per = per_iteration(count, short=1, long=3, at_most={"device_to_host": 0}).kinds()
print(json.dumps({"first": first, "traces": len(traces), "per": per}))
"""


@pytest.mark.usefixtures("child_processes")
def test_a_first_block_in_a_process_leaves_warm_functions_warm():
    out = run_python(FIRST_BLOCK, timeout=120).check().last_json()
    quiet = {"dispatch": 1, "host_to_device": 0, "device_to_host": 0, "compile": 0}
    assert out == {"first": quiet, "traces": 1, "per": quiet}


def test_a_call_of_an_ahead_of_time_compiled_function_is_one_dispatch():
    x = jnp.ones(3)
    compiled = jax.jit(lambda x: x + 1).lower(x).compile()
    compiled(x)
    with counted_calls(HERE) as calls:
        for _ in range(3):
            compiled(x)
    assert calls == CallCounts({("dispatch", __name__): 3})


def test_a_limit_on_a_kind_the_weights_left_out_is_refused():
    step, state = jax.jit(lambda x: x * 2), {"x": jnp.ones(3)}
    step(state["x"])

    def count(n):
        with counted_calls(HERE, weights={"device_put": 1}) as calls:  # no built-in kind
            for _ in range(n):
                state["x"] = step(state["x"])
                float(state["x"].sum())
        return calls

    assert count(1).uncounted == KINDS
    for kind in ("device_to_host", "dispatch", "jit_dispatch"):
        with pytest.raises(ValueError, match=f"at_most names {kind}, which was not counted"):
            per_iteration(count, short=1, long=3, at_most={kind: 0})
    with counted_calls(HERE, weights={"compile": 1}) as calls:
        pass
    assert calls.uncounted == ("dispatch", "host_to_device", "device_to_host")


def test_per_iteration_copies_the_first_counts_before_the_second_run():
    shared = Counter()

    def count(n):  # the same counter both times, cleared for each run
        shared.clear()
        shared["steps"] += n
        return shared

    assert per_iteration(count, short=1, long=3) == {"steps": 1}
    with pytest.raises(TooManyCallsError):
        per_iteration(count, short=1, long=3, at_most={"steps": 0})
    with pytest.raises(TypeError, match="count_fn must return a mapping of counts"):
        per_iteration(lambda n: n, short=1, long=3)


def test_call_counts_copies_keep_their_kinds():
    counts = CallCounts({("steps", "a"): 1}, custom_kinds=("steps",), uncounted=("jit_dispatch",))
    for copied in (counts.copy(), copy.copy(counts), copy.deepcopy(counts)):  # __reduce__
        assert copied == counts
        assert (copied.custom_kinds, copied.uncounted) == (("steps",), ("dispatch",))


def _batches():
    yield from range(3)


def test_a_generator_counts_once_when_it_starts_not_at_each_resume():
    weights = {"calls": started(f"{__name__}._batches")}
    with counted_calls(HERE, weights=weights) as calls:
        assert list(_batches()) == [0, 1, 2]
    assert calls.of("calls") == 1
    running = _batches()
    next(running)
    with counted_calls(HERE, weights=weights) as calls:
        next(running)
    assert calls.of("calls") == 0  # started before the block


def test_a_kind_and_its_alias_may_repeat_one_weight():
    step, x = jax.jit(lambda x: x * 3), jnp.ones(2)
    step(x)
    with counted_calls(HERE, weights={**JAX_CALL_WEIGHTS, "jit_dispatch": 1}) as calls:
        step(x)
    assert calls.of("dispatch") == 1


def test_host_data_given_to_jnp_asarray_or_array_is_a_host_to_device_transfer():
    batch, device = np.ones((4, 3), np.float32), jnp.ones(3)
    jnp.asarray(batch), jnp.array([batch[0], batch[1]])  # warm up
    with counted_calls(HERE) as calls:
        for _ in range(3):
            jnp.asarray(batch)  # a NumPy batch copied to the device every step
        jnp.asarray(batch, dtype=jnp.float32)  # through jax.device_put: counted once
        jnp.array([batch[0], batch[1]])  # one array, one transfer
        list(map(jnp.asarray, [batch, batch]))  # started from C: seen all the same
        jnp.asarray(device), jnp.array([device, device])  # on the device already
        jax.jit(lambda x: jnp.asarray(batch) + x)(device)  # traced: a constant, not a transfer
    assert calls.packages("host_to_device") == {__name__: 7}


def _fresh(n):
    double = jax.jit(lambda x: x * 2)
    return jax.block_until_ready([double(jnp.full(3, float(i))) for i in range(n)])


@pytest.mark.parametrize(
    ("read", "n"),
    [
        (np.mean, 4),  # a list reaches np.asanyarray from NumPy's Python code
        (np.asarray, 2),
        (np.concatenate, 2),
        (np.sum, 3),  # np.add.reduce, a ufunc's method
        (lambda arrays: np.add(arrays[0], 1), 1),
        (lambda arrays: np.float32(arrays[0].sum()), 1),
        (lambda arrays: np.asarray([arrays[:1], (arrays[1],)]), 2),  # nested
    ],
)
def test_numpy_reads_of_arrays_in_lists_ufuncs_and_scalar_types_are_counted(read, n):
    arrays = _fresh(n)
    with counted_calls(HERE) as calls:
        read(arrays)
    assert calls.of("device_to_host") == n


def test_arrays_numpy_cannot_read_through_the_buffer_protocol_count_once():
    halves = [jnp.ones(2, jnp.bfloat16), jnp.zeros(2, jnp.bfloat16)]  # read through __array__
    with counted_calls(HERE) as calls:
        np.asarray(halves)
    assert calls.of("device_to_host") == 2


def test_a_bfloat16_array_given_to_numpy_alone_is_one_read():
    # NumPy reads it through __array__ and jax's host read, which its profiler wraps
    double = jax.jit(lambda x: x * 2)
    whole, scalar = jax.block_until_ready(
        (double(jnp.ones(3, jnp.bfloat16)), double(jnp.ones((), jnp.bfloat16)))
    )
    with counted_calls(HERE) as calls:
        np.asarray(whole)
    assert calls.of("device_to_host") == 1
    with counted_calls(HERE) as calls:
        np.float32(scalar)
    assert calls.of("device_to_host") == 1


def test_a_jitted_function_called_through_partial_dispatches_but_not_through_map():
    double, x = jax.jit(lambda x: x * 2), jnp.ones(3)
    double(x)
    with counted_calls(HERE) as calls:
        for _ in range(3):
            functools.partial(double)(x)
        list(map(double, [x, x]))  # called from C: not seen (a documented limit)
        [double(v) for v in [x, x]]  # the workaround: a call from Python
    assert calls.of("dispatch") == 5


def test_an_at_most_key_neither_run_holds_is_refused():
    with pytest.raises(ValueError, match=r"at_most names 'dispath'.*their keys: 'dispatch'"):
        per_iteration(lambda n: Counter(dispatch=5 * n), short=1, long=2, at_most={"dispath": 0})
    zero = per_iteration(
        lambda n: Counter(dispatch=n, reads=0), short=1, long=2, at_most={"reads": 0}
    )
    assert zero == {"dispatch": 1}  # a key returned with a 0 count is limited


def test_an_uneven_count_that_fell_says_so():
    # a longer run that counted fewer calls (the shorter one compiled) read "not a whole number"
    fell = str(UnevenCountError("compile", "substrax", 2, 3, 5, 1))
    assert "3 over 2 iteration(s) but 1 over 5, fewer in the longer run;" in fell
    uneven = str(UnevenCountError("compile", "substrax", 2, 1, 5, 3))
    assert "1 over 2 iteration(s) but 3 over 5, not a whole number per iteration;" in uneven
