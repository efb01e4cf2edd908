import doctest
import importlib

import jax
import jax.numpy as jnp
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import substrax.optim
import substrax.spmd


SPMD = [
    "substrax.spmd",
    *(f"substrax.spmd.{m}" for m in ("_placement", "_reductions", "_step", "_train_step")),
]
OPTIM = [
    "substrax.optim",
    *(f"substrax.optim.{m}" for m in ("_config", "_masks", "_build", "_line_search")),
]


@pytest.mark.parametrize("name", SPMD + OPTIM)
def test_docstring_examples_run(name):
    module = importlib.import_module(name)
    names = {
        **vars(substrax.spmd),
        **vars(substrax.optim),
        "jax": jax,
        "jnp": jnp,
        "nnx": nnx,
        "optax": optax,
        "P": P,
    }
    result = doctest.testmod(module, extraglobs=names, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0
