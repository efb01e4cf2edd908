import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from substrax.mesh import create_device_mesh
from substrax.spmd import (
    REDUCTIONS,
    UnknownReductionError,
    all_gather,
    collect_from_devices,
    reduce_custom,
    reduce_gradient_tree,
    reduce_max,
    reduce_mean,
    reduce_mean_collective,
    reduce_min,
    reduce_sum,
    reduce_sum_collective,
)


def test_reductions_reach_every_depth_and_pass_other_leaves():
    tree = {
        "grads": {"w": jnp.array([[1.0, 2.0], [3.0, 6.0]]), "b": [np.array([1.0, 5.0])]},
        "loss": jnp.float32(2.0),
        "name": "x",
    }
    mean = reduce_mean(tree)
    assert float(mean["grads"]["w"]) == 3.0
    assert float(mean["grads"]["b"][0]) == 3.0
    assert mean["loss"] is tree["loss"]  # a scalar passes through
    assert mean["name"] == "x"
    assert float(reduce_sum(tree)["grads"]["w"]) == 12.0
    assert float(reduce_max(tree)["grads"]["b"][0]) == 5.0
    assert float(reduce_min(tree)["grads"]["w"]) == 1.0
    assert REDUCTIONS == ("mean", "sum", "max", "min")


def test_reduce_mean_of_global_arrays_under_jit():
    mesh = create_device_mesh({"data": 8})
    x = jax.device_put(jnp.arange(16.0), NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):
        out = jax.jit(lambda t: reduce_mean({"loss": t}))(x)
    assert float(out["loss"]) == 7.5


def test_reduce_custom():
    metrics = {
        "loss": jnp.array([1.0, 3.0]),
        "accuracy": jnp.array([0.5, 1.0]),
        "step": jnp.array([3, 4]),
        "raw": jnp.array([1, 2]),
    }
    out = reduce_custom(metrics, {"loss": "mean", "step": "max", "raw": None})
    assert float(out["loss"]) == 2.0
    assert float(out["accuracy"]) == 0.75  # unnamed: mean
    assert int(out["step"]) == 4
    assert out["raw"] is metrics["raw"]
    assert float(reduce_custom(metrics)["loss"]) == 2.0


def test_reduce_custom_refuses_to_pass_a_metric_it_was_asked_to_reduce_through_unreduced():
    with pytest.raises(TypeError, match="reduce_fn asks 'sum' of metric 'a', a dict holding"):
        reduce_custom({"a": {"x": jnp.ones(2)}}, {"a": "sum"})
    # a second-pass review: a named list of numbers passed through unreduced
    for numbers in ([1.0, 2.0], (np.float32(1), np.float32(3)), [jnp.float32(1)]):
        with pytest.raises(TypeError, match="holding numbers: the metrics are a flat mapping"):
            reduce_custom({"l": numbers}, {"l": "sum"})
    assert reduce_custom({"n": 3, "f": np.float32(2.0)}, {"n": "sum", "f": "max"}) == {
        "n": 3,
        "f": np.float32(2.0),
    }


def test_reduce_custom_reduces_a_named_value_only_when_it_is_an_array():
    """The spec: "Each named value is reduced by its operation when it is an array"."""
    out = reduce_custom(
        {"loss": jnp.array([1.0, 3.0]), "name": "run", "none": None, "tags": ["a"]},
        {"loss": "mean", "name": "sum", "none": "max", "tags": "min"},
    )
    assert float(out["loss"]) == 2.0
    assert out["name"] == "run"
    assert out["none"] is None
    assert out["tags"] == ["a"]


def test_reduce_custom_refusals():
    with pytest.raises(
        UnknownReductionError, match="metric 'loss' asks for reduction 'median'"
    ) as info:
        reduce_custom({"loss": jnp.ones(2)}, {"loss": "median"})
    assert (info.value.name, info.value.reduction) == ("loss", "median")
    with pytest.raises(UnknownReductionError, match="reduce_fn names 'acc', which is not a metric"):
        reduce_custom({"loss": jnp.ones(2)}, {"acc": "mean"})


def test_reduce_gradient_tree_global_and_collective():
    grads = {"w": jnp.ones((2, 2))}
    assert reduce_gradient_tree(grads) is grads
    with pytest.raises(ValueError, match="reduce_type must be 'mean' or 'sum'"):
        reduce_gradient_tree(grads, "max")  # type: ignore[arg-type]
    mesh = create_device_mesh({"batch": 8})
    f = jax.shard_map(
        functools.partial(reduce_gradient_tree, reduce_type="sum", axis_name="batch"),
        mesh=mesh,
        in_specs=P("batch"),
        out_specs=P(),
    )
    assert np.asarray(f({"w": jnp.arange(8.0)})["w"]).tolist() == [28.0]


def test_collectives_inside_shard_map():
    mesh = create_device_mesh({"batch": 8})
    values = {"a": jnp.arange(8.0), "nested": [jnp.ones(8)]}

    def run(fn, out_specs, check_vma=True):
        return jax.shard_map(
            fn, mesh=mesh, in_specs=P("batch"), out_specs=out_specs, check_vma=check_vma
        )(values)

    mean = run(reduce_mean_collective, P())
    assert float(mean["a"][0]) == 3.5
    total = run(reduce_sum_collective, P())
    assert float(total["nested"][0][0]) == 8.0
    gathered = run(all_gather, P(), check_vma=False)  # all_gather leaves values device-varying
    assert np.asarray(gathered["a"]).reshape(-1).tolist() == list(range(8))


def test_collectives_inside_pmap():
    out = jax.pmap(lambda x: reduce_mean_collective({"x": x}, axis_name="i"), axis_name="i")(
        jnp.arange(8.0)
    )
    assert np.asarray(out["x"]).tolist() == [3.5] * 8


def test_collect_from_devices():
    out = collect_from_devices({"loss": jnp.array([1.0, 2.0, 3.0]), "epoch": 4})
    assert [float(v) for v in out["loss"]] == [1.0, 2.0, 3.0]
    assert out["epoch"] == 4


@pytest.mark.parametrize("bad", [None, "loss", [jnp.ones(2)]])
def test_collect_from_devices_refuses_what_is_not_a_mapping_naming_it(bad):
    with pytest.raises(TypeError, match=rf"metrics must be a mapping .*, not {type(bad).__name__}"):
        collect_from_devices(bad)
