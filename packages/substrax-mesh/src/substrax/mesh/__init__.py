"""Device meshes with Auto axes, logical-axis rules and sharding strategies.

Three layers, low to high: meshes (:class:`DeviceMeshManager`, :func:`create_device_mesh`,
:func:`create_multihost_mesh`), rules that map logical dimension names onto mesh axes
(:class:`MeshRules`, :class:`LogicalAxisRules`, and :func:`shard_model` /
:func:`create_sharded_model`, which place a flax model annotated with
``nnx.with_partitioning``), and the strategies that choose a spec per tensor.

Importing this package imports nothing else, not even jax: each name is loaded from its module
when first used (PEP 562). Flax comes only with the logical-axis functions
(:func:`logical_to_mesh_spec`, :func:`state_shardings`, :func:`shard_model`,
:func:`create_sharded_model`).

Example:
    >>> import jax
    >>> from flax import nnx
    >>> from substrax.mesh import DeviceMeshManager, fsdp_rules, shard_model
    >>> mesh = DeviceMeshManager.create_device_mesh({"data": 1, "model": 2})
    >>> with nnx.use_eager_sharding(False):
    ...     layer = nnx.Linear(8, 8, rngs=nnx.Rngs(0),
    ...                        kernel_init=nnx.with_partitioning(nnx.initializers.ones, ("embed", "mlp")))
    >>> layer = shard_model(layer, mesh, fsdp_rules())
    >>> layer.kernel.get_value().addressable_shards[0].data.shape
    (4, 8)
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read);
# each loads from its module on first use (PEP 562), then is kept here.
lazy_exports(__name__)
