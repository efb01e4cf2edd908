"""check_array_variables: Variables holding a jax.Ref or hijax values refused by path, others pass."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from substrax.support import check_array_variables


def linear(**kinds: bool) -> nnx.Linear:
    """An ``nnx.Linear`` whose Variables flax makes as ``kinds`` say (``ref=True``, ``hijax=True``)."""
    with nnx.var_defaults(ref=kinds.get("ref", False), hijax=kinds.get("hijax", False)):
        return nnx.Linear(3, 2, rngs=nnx.Rngs(0))


def test_arrays_numbers_and_plain_variables_pass() -> None:
    check_array_variables(nnx.state(linear()), "TrainStep")
    check_array_variables({"w": jnp.ones(2), "n": 3, "s": "text", "none": None}, "save")
    check_array_variables(nnx.state(nnx.eval_shape(linear)), "create_sharded_model")


@pytest.mark.parametrize(
    ("tree", "kind"),
    [
        (lambda: nnx.state(linear(ref=True)), "a jax.Ref (a Variable made with ref=True)"),
        (lambda: nnx.state(linear(hijax=True)), "a hijax value (a Variable made with hijax=True)"),
        (lambda: nnx.state(nnx.eval_shape(lambda: linear(ref=True))), "a jax.Ref"),
        (lambda: {"model": nnx.state(linear(ref=True))}, "a jax.Ref"),
    ],
    ids=["ref", "hijax", "abstract ref", "nested"],
)
def test_a_ref_or_hijax_variable_is_refused_naming_its_path_and_the_way_back(tree, kind) -> None:
    with pytest.raises(TypeError) as info:
        check_array_variables(tree(), "TrainStep")
    message = str(info.value)
    assert message.startswith("TrainStep takes Variables that hold arrays; ")
    assert "bias holds " + kind in message
    assert "nnx.with_vars(model, ref=False, hijax=False)" in message


def test_a_bare_ref_leaf_is_refused_and_hijax_may_be_let_through() -> None:
    with pytest.raises(TypeError, match=r"^save takes .*; layer/w holds a jax\.Ref"):
        check_array_variables({"layer": {"w": jax.new_ref(jnp.ones(2))}}, "save")
    check_array_variables(nnx.state(linear(hijax=True)), "create_optimizer", hijax=False)
    with pytest.raises(TypeError, match=r"bias holds a jax\.Ref"):
        check_array_variables(nnx.state(linear(ref=True)), "create_optimizer", hijax=False)


def test_the_converted_model_passes() -> None:
    for kinds in ({"ref": True}, {"hijax": True}):
        converted = nnx.with_vars(linear(**kinds), ref=False, hijax=False)
        check_array_variables(nnx.state(converted), "TrainStep")
