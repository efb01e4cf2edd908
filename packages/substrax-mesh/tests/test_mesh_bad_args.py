"""Arguments a hostile review found accepted or refused wrongly."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.mesh import (
    DataParallelStrategy,
    FSDPStrategy,
    LogicalAxisRules,
    MeshShapeError,
    TensorParallelStrategy,
    create_device_mesh,
)


def test_a_device_given_twice_is_refused():
    d = jax.devices()[0]
    with pytest.raises(MeshShapeError, match="twice"):
        create_device_mesh({"data": 2}, devices=[d, d])


def test_numpy_integer_sizes_are_accepted():
    mesh = create_device_mesh({"data": np.int64(1)})
    assert dict(mesh.shape) == {"data": 1}


def test_a_rule_naming_a_mesh_axis_twice_is_refused():
    with pytest.raises(ValueError, match="twice"):
        LogicalAxisRules({"a": ("data", "data")})


@pytest.mark.parametrize("make", [DataParallelStrategy, FSDPStrategy, TensorParallelStrategy])
def test_a_mesh_axis_index_that_is_not_the_axis_is_refused_where_the_mesh_is_known(make):
    mesh = create_device_mesh({"data": 1})
    with pytest.raises(ValueError, match=r"mesh_axis=5 but 'data' is axis 0"):
        make("data", 5).apply_sharding(jnp.ones((8, 8)), mesh)
    assert make("data", 0).apply_sharding(jnp.ones((8, 8)), mesh).shape == (8, 8)
