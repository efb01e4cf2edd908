"""TraceCounter and expect_compiles: a jitted step that compiles once is provable."""

import jax
import jax.numpy as jnp
import pytest

from substrax.testing import (
    CompileCountError,
    RetraceError,
    TraceCounter,
    compiled_programs,
    expect_compiles,
)


def _step_and_counter():
    counter = TraceCounter()

    def step(params, x):
        return params - 0.1 * jax.grad(lambda p: jnp.sum((p * x) ** 2))(params)

    return jax.jit(counter.wrap(step)), counter


def test_a_step_with_stable_inputs_traces_and_compiles_once():
    step, counter = _step_and_counter()
    params, x = jnp.ones(4), jnp.ones(4)
    with counter.expect(new_traces=1), expect_compiles(1) as names:
        for _ in range(3):
            params = step(params, x)
    assert counter.count == 1
    assert names == ["jit(step)"]
    zeros = jnp.zeros(4)
    with counter.expect(new_traces=0), expect_compiles(0):
        step(params, zeros)


def test_a_retrace_is_reported():
    step, counter = _step_and_counter()
    params = jnp.ones(4)

    def two_dtypes():
        with counter.expect(new_traces=1):
            step(params, jnp.ones(4))
            step(params, jnp.ones(4, dtype=jnp.int32))  # a new dtype retraces

    with pytest.raises(RetraceError) as caught:
        two_dtypes()
    assert (caught.value.expected, caught.value.observed) == (1, 2)
    assert "it retraced" in str(caught.value)


def test_compiling_twice_fails_and_names_the_programs():
    step, _ = _step_and_counter()
    four, five = jnp.ones(4), jnp.ones(5)

    def two_shapes():
        with expect_compiles(1):
            step(four, four)
            step(five, five)  # a new shape compiles again

    with pytest.raises(CompileCountError) as caught:
        two_shapes()
    assert caught.value.expected == 1
    assert caught.value.names == ("jit(step)", "jit(step)")
    assert "expected 1 compilation(s), observed 2: jit(step), jit(step)" in str(caught.value)


def test_compiled_programs_stops_listening_after_the_block():
    with compiled_programs() as names:
        jax.jit(lambda x: x * 7)(jnp.ones(3))
    seen = list(names)
    jax.jit(lambda x: x * 9)(jnp.ones(3))
    assert names == seen
    assert len(seen) >= 1


def test_an_exception_in_the_block_is_not_masked():
    counter = TraceCounter()
    with pytest.raises(KeyError), counter.expect(new_traces=3), expect_compiles(2):
        raise KeyError("boom")


def test_wrap_keeps_metadata_and_one_counter_wraps_several_functions():
    counter = TraceCounter()

    def first(x):
        """Doc."""
        return x

    wrapped = counter.wrap(first)
    assert wrapped.__name__ == "first"
    assert wrapped.__doc__ == "Doc."
    assert wrapped(3) == 3
    assert counter.wrap(lambda: 1)() == 1
    assert counter.count == 2


@pytest.mark.parametrize(
    ("value", "error"), [(-1, ValueError), (True, TypeError), (1.0, TypeError)]
)
def test_bad_expectations_are_refused(value, error):
    with pytest.raises(error), TraceCounter().expect(new_traces=value):
        pass
    with pytest.raises(error), expect_compiles(value):
        pass


@pytest.mark.parametrize("bad", [5, None, "step"])
def test_wrap_refuses_what_is_not_callable_naming_it(bad):
    with pytest.raises(
        TypeError, match=rf"fn={bad!r} must be a callable .*, not {type(bad).__name__}"
    ):
        TraceCounter().wrap(bad)


def test_the_0_1_22_module_path_holds_the_compile_count_error():
    # the reference lists CompileCountError with substrax.testing.compiles (a migrant's finding)
    from substrax.testing import CompileCountError, compiles

    assert compiles.CompileCountError is CompileCountError
    assert "CompileCountError" in compiles.__all__
