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
def host_batches():
    rng = np.random.default_rng(0)
    return [
        {
            "x": rng.normal(size=(16, 8)).astype(np.float32),
            "y": rng.normal(size=(16, 1)).astype(np.float32),
        }
        for _ in range(3)
    ]
