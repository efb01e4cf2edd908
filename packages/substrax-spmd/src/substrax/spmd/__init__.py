"""Data-parallel placement, the SPMD train step, a fast compiled step, and collectives.

Importing this package imports nothing else, not even jax: each name is loaded from its module
when first used (PEP 562).

Example:
    >>> import jax, numpy as np, optax
    >>> from flax import nnx
    >>> from substrax.mesh import DeviceMeshManager
    >>> from substrax.spmd import TrainStep, create_data_parallel_sharding, place_batch_on_shards
    >>> mesh = DeviceMeshManager.create_device_mesh({"data": 2})
    >>> sharding = create_data_parallel_sharding(mesh)
    >>> model = nnx.Linear(3, 1, rngs=nnx.Rngs(0))
    >>> optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)
    >>> step = TrainStep(model, optimizer, lambda m, b: ((m(b["x"]) - b["y"]) ** 2).mean(), mesh=mesh)
    >>> batch = place_batch_on_shards({"x": np.ones((8, 3)), "y": np.zeros((8, 1))}, sharding)
    >>> loss = step(batch)
    >>> step.model.kernel.get_value().shape
    (3, 1)
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read);
# each loads from its module on first use (PEP 562), then is kept here.
lazy_exports(__name__)
