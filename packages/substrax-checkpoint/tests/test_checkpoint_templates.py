"""Templates (``_restore``): the first leaf that does not fit named, dtype changes listed,
abstract meshes made concrete. Restores onto templates end to end are in test_checkpoint_reads
and tests-integration/test_checkpoint_topology.py."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.checkpoint import DtypeMismatch
from substrax.checkpoint._restore import (
    check_template,
    dtype_mismatches,
    resolve_abstract_meshes,
)


STORED = {
    "w": jax.ShapeDtypeStruct((2, 3), jnp.float32),
    "b": jax.ShapeDtypeStruct((3,), jnp.int32),
}


@pytest.mark.parametrize(
    ("template", "message"),
    [
        ({"w": np.zeros((2, 4)), "b": np.zeros(3)}, "leaf 'w' has shape (2, 4) in the template"),
        ({"w": np.zeros((2, 3)), "b": np.zeros(3), "c": np.zeros(1)}, "leaf 'c' is not stored"),
        ({"w": np.zeros((2, 3))}, "leaf 'b' is stored but missing from the template"),
    ],
)
def test_a_template_that_does_not_fit_names_the_leaf(template, message):
    with pytest.raises(ValueError, match=f"template for item 'model' .*{re.escape(message)}"):
        check_template("model", STORED, template)


def test_a_fitting_template_passes():
    check_template("model", STORED, {"w": np.zeros((2, 3)), "b": np.zeros(3, np.int32)})


def test_dtype_changes_are_listed_leaf_by_leaf():
    saved = {"w": "float32", "b": "int32"}
    template = {"w": jnp.zeros((2, 3), jnp.bfloat16), "b": jnp.zeros(3, jnp.int32), "n": 3}
    assert dtype_mismatches("model", saved, template) == [
        DtypeMismatch(item="model", leaf="w", saved="float32", restored="bfloat16")
    ]


def test_an_abstract_mesh_needs_a_concrete_one_of_its_shape():
    mesh = jax.make_mesh((len(jax.devices()),), ("data",))
    spec = jax.sharding.PartitionSpec("data")
    sharding = jax.sharding.NamedSharding(mesh.abstract_mesh, spec)
    template = {"w": jax.ShapeDtypeStruct((16,), jnp.float32, sharding=sharding)}
    with pytest.raises(
        ValueError, match=r"abstract mesh \{'data': 8\}.*restore\(\.\.\., mesh=mesh\)"
    ):
        resolve_abstract_meshes(template, None)
    other = jax.make_mesh((2, 4), ("a", "b"))
    with pytest.raises(ValueError, match="abstract mesh"):
        resolve_abstract_meshes(template, other)
    resolved = resolve_abstract_meshes(template, mesh)["w"]
    assert resolved.sharding == jax.sharding.NamedSharding(mesh, spec)
    with jax.set_mesh(mesh):
        assert resolve_abstract_meshes(template, None)["w"].sharding.mesh == mesh


def test_a_templated_restore_checks_the_step_s_recorded_shapes_without_orbax_metadata(
    tmp_path, monkeypatch
):
    """The step's record holds every leaf's shape: orbax's metadata read (its restore reads it
    again) is skipped for a template of those leaves, and a wrong shape is still refused."""
    import orbax.checkpoint as ocp

    from substrax.checkpoint import OrbaxCheckpointStore

    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.float32)}
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(1, {"model": weights})

    def unread(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("orbax's item metadata was read")

    monkeypatch.setattr(ocp.CheckpointManager, "item_metadata", unread)
    with OrbaxCheckpointStore(tmp_path, read_only=True) as store:
        restored = store.restore(1, templates={"model": weights}).items["model"]
        np.testing.assert_array_equal(restored["w"], weights["w"])
        with pytest.raises(ValueError, match="shape"):
            store.restore(1, templates={"model": {**weights, "w": np.zeros((3, 2), np.float32)}})
        with pytest.raises(AssertionError, match="item metadata"):
            store.restore(1)  # no template: what orbax stored is read from its metadata
