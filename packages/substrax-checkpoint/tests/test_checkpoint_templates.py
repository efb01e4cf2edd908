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
