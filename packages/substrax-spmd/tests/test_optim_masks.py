"""Weight-decay filters on variable types: decided once from the model, applied at every update."""

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from flax import nnx

from substrax.optim import (
    EXCLUDE_BIAS_AND_NORM_SCALE,
    OptimizerConfig,
    create_optimizer,
    mask_callable,
    weight_decay_mask,
)


class Decayed(nnx.Param):
    """A parameter type a filter can pick out."""


class TypedNet(nnx.Module):
    def __init__(self):
        self.kernel = Decayed(jnp.full((2, 2), 2.0))
        self.bias = nnx.Param(jnp.full((2,), 3.0))
        self.count = nnx.BatchStat(jnp.zeros(()))  # not a Param: never updated


FILTERS = {
    "Param": (nnx.Param, {"kernel": True, "bias": True}),
    "OfType(Param)": (nnx.OfType(nnx.Param), {"kernel": True, "bias": True}),
    "OfType(Decayed)": (nnx.OfType(Decayed), {"kernel": True, "bias": False}),
    "Decayed": (Decayed, {"kernel": True, "bias": False}),
    "All(Param, kernel)": (
        nnx.All(nnx.Param, nnx.PathContains("kernel")),
        {"kernel": True, "bias": False},
    ),
    "Not(Decayed)": (nnx.Not(Decayed), {"kernel": False, "bias": True}),
    "path kernel": (nnx.PathContains("kernel"), {"kernel": True, "bias": False}),
}


def _config(kind, filter_):
    return OptimizerConfig(
        optimizer_type=kind, learning_rate=0.1, weight_decay=0.5, weight_decay_filter=filter_
    )


def _zero_grad_update(model, optimizer, *, jit):
    zero = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))

    def update(model, optimizer, grads):
        optimizer.update(model, grads)

    (nnx.jit(update) if jit else update)(model, optimizer, zero)


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("name", list(FILTERS))
def test_a_type_filter_decays_what_weight_decay_mask_reports(name, jit):
    filter_, expected = FILTERS[name]
    model = TypedNet()
    config = _config("adamw", filter_)
    assert weight_decay_mask(model, config) == expected
    optimizer = create_optimizer(model, config)
    _zero_grad_update(model, optimizer, jit=jit)
    # zero gradient: only the decay moves a parameter, by lr * weight_decay = 5%
    for field, start in (("kernel", 2.0), ("bias", 3.0)):
        factor = 1 - 0.1 * 0.5 if expected[field] else 1.0
        np.testing.assert_allclose(
            np.asarray(getattr(model, field).get_value()), start * factor, rtol=1e-6, err_msg=field
        )


@pytest.mark.parametrize("name", ["Decayed", "All(Param, kernel)"])
def test_lamb_honours_a_type_filter(name):
    filter_, _ = FILTERS[name]
    model = TypedNet()
    optimizer = create_optimizer(model, _config("lamb", filter_))
    _zero_grad_update(model, optimizer, jit=False)
    # lamb's trust ratio scales the decay step to lr * |p|: the kernel moves, the bias does not
    np.testing.assert_allclose(np.asarray(model.kernel.get_value()), 2.0 * 0.9, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(model.bias.get_value()), 3.0)


@pytest.mark.parametrize("kind", ["adamw", "lamb"])
def test_the_state_tree_is_the_same_for_type_and_path_filters(kind, tmp_path):
    def build(filter_):
        model = TypedNet()
        return model, create_optimizer(model, _config(kind, filter_))

    states = {name: nnx.as_pure(build(f)[1].opt_state) for name, (f, _) in FILTERS.items()}
    states["none"] = nnx.as_pure(build(None)[1].opt_state)
    states["no bias or scale"] = nnx.as_pure(build(EXCLUDE_BIAS_AND_NORM_SCALE)[1].opt_state)
    structures = {name: jax.tree.structure(state) for name, state in states.items()}
    assert len(set(structures.values())) == 1, structures
    # a checkpoint of the unfiltered state restores into a type-filtered optimizer, which runs
    model, optimizer = build(Decayed)
    with ocp.StandardCheckpointer() as checkpointer:
        checkpointer.save(tmp_path / "state", states["none"])
        checkpointer.wait_until_finished()
        restored = checkpointer.restore(tmp_path / "state", nnx.as_pure(optimizer.opt_state))
    slots = jax.tree.leaves(optimizer.opt_state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    for slot, value in zip(slots, jax.tree.leaves(restored), strict=True):
        slot.set_value(value)
    _zero_grad_update(model, optimizer, jit=True)
    np.testing.assert_allclose(np.asarray(model.bias.get_value()), 3.0)
    assert float(model.kernel.get_value()[0, 0]) < 2.0


def test_the_model_mask_is_returned_by_path_for_plain_arrays():
    model = TypedNet()
    mask = mask_callable(_config("adamw", Decayed), model)
    arrays = {"bias": jnp.ones(2), "kernel": jnp.ones((2, 2))}
    assert mask(arrays) == {"bias": False, "kernel": True}
    assert mask(nnx.state(model, nnx.Param)) == nnx.State({"bias": False, "kernel": True})
    with pytest.raises(ValueError, match=r"have no 'embedding'.*create_transformation\(model"):
        mask({"embedding": jnp.ones(2)})
