import numpy as np
import pytest


@pytest.fixture(scope="session")
def new_mlp():
    """Build the 8-32-1 MLP the step tests train, seeded with 0: ``new_mlp(param_dtype=...)``.

    jax is imported here, not at the conftest's import: the plugin must set the emulated
    devices before jax starts.
    """
    import jax
    import jax.numpy as jnp
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs: nnx.Rngs, param_dtype: jnp.dtype) -> None:
            self.up = nnx.Linear(8, 32, rngs=rngs, param_dtype=param_dtype)
            self.down = nnx.Linear(32, 1, rngs=rngs, param_dtype=param_dtype)

        def __call__(self, x: jax.Array) -> jax.Array:
            return self.down(jax.nn.relu(self.up(x)))

    def build(param_dtype: jnp.dtype = jnp.float32) -> MLP:
        return MLP(nnx.Rngs(0), param_dtype)

    return build


@pytest.fixture(scope="session")
def new_train_step(new_mlp):
    """Build a TrainStep on a fresh ``new_mlp()`` with Adam(1e-2): ``new_train_step(mesh, ...)``.

    The loss is the mean squared error unless ``loss_fn=`` says otherwise, and the optimizer
    Adam unless ``optimizer=`` (an optax transformation) does; with a mesh the batch rows are
    split over its ``data`` axis. Other keyword arguments go to ``TrainStep``.
    """
    import optax
    from flax import nnx

    from substrax.spmd import TrainStep, create_data_parallel_sharding

    def mse(model, batch):
        return ((model(batch["x"]) - batch["y"]) ** 2).mean()

    def build(mesh=None, *, loss_fn=mse, optimizer=None, **options):
        model = new_mlp()
        return TrainStep(
            model,
            nnx.Optimizer(
                model, optax.adam(1e-2) if optimizer is None else optimizer, wrt=nnx.Param
            ),
            loss_fn,
            mesh=mesh,
            batch_sharding=None if mesh is None else create_data_parallel_sharding(mesh),
            **options,
        )

    return build


@pytest.fixture(scope="session")
def new_stateful():
    """Build a small model with batch statistics and dropout, seeded with 0: ``new_stateful()``.

    Linear 8-8, BatchNorm, Dropout(0.5), Linear 8-1: a step advances its statistics and its
    dropout RNG count.
    """
    from flax import nnx

    class Stateful(nnx.Module):
        def __init__(self, rngs: nnx.Rngs) -> None:
            self.dense = nnx.Linear(8, 8, rngs=rngs)
            self.norm = nnx.BatchNorm(8, rngs=rngs)
            self.drop = nnx.Dropout(0.5, rngs=rngs)
            self.out = nnx.Linear(8, 1, rngs=rngs)

        def __call__(self, x):
            return self.out(self.drop(self.norm(self.dense(x))))

    def build() -> Stateful:
        return Stateful(nnx.Rngs(0))

    return build


@pytest.fixture(scope="session")
def host_batches():
    rng = np.random.default_rng(0)
    return [
        {
            "x": rng.normal(size=(16, 8)).astype(np.float32),
            "y": rng.normal(size=(16, 1)).astype(np.float32),
        }
        for _ in range(3)
    ]
