import hashlib
import pickle
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from substrax.rng import MissingRngStreamError, fold_in_name, key_from, rngs_from_seed, split_key
from substrax.testing import run_python


def data(key):
    return jax.random.key_data(key).tolist()


def test_key_from_a_typed_key():
    key = jax.random.key(3)
    assert data(key_from(key, streams=("params",), context="t")) == data(key)


def test_key_from_a_raw_key():
    raw = jax.random.PRNGKey(3)
    assert key_from(raw, streams=("params",), context="t").tolist() == raw.tolist()
    assert key_from(np.asarray(raw), streams=("params",), context="t").shape == (2,)


@pytest.mark.parametrize(
    "bad",
    [0, 3.0, None, "key", jnp.zeros((2,), jnp.int32), jnp.zeros((3,), jnp.uint32), "batch"],
)
def test_key_from_refuses_anything_else(bad):
    if isinstance(bad, str) and bad == "batch":
        bad = jax.random.split(jax.random.key(0), 2)
    with pytest.raises(TypeError, match="no default seed"):
        key_from(bad, streams=("params",), context="layer")


def test_key_from_rngs_takes_the_first_held_stream():
    rngs = nnx.Rngs(dropout=jax.random.key(1), default=jax.random.key(2))
    expected = nnx.Rngs(dropout=jax.random.key(1)).dropout()
    got = key_from(rngs, streams=("noise", "dropout", "default"), context="t")
    assert data(got) == data(expected)


def test_key_from_rngs_without_the_stream():
    rngs = nnx.Rngs(params=jax.random.key(1))
    with pytest.raises(MissingRngStreamError) as info:
        key_from(rngs, streams=("dropout",), context="Dropout layer")
    assert info.value.context == "Dropout layer"
    assert info.value.streams == ("dropout",)
    assert isinstance(info.value, ValueError)
    assert "nnx.Rngs(dropout=...)" in str(info.value)
    copy = pickle.loads(pickle.dumps(info.value))  # noqa: S301 - our own error, round-tripped
    assert (copy.context, copy.streams) == ("Dropout layer", ("dropout",))


def test_streams_must_be_names():
    with pytest.raises(TypeError, match="streams"):
        key_from(jax.random.key(0), streams="params", context="t")


def test_rngs_from_seed_streams_are_independent_of_each_other():
    a = rngs_from_seed(7, ("params", "dropout"))
    b = rngs_from_seed(7, ("dropout", "sample", "params"))
    assert data(a.params()) == data(b.params())
    assert data(a.dropout()) == data(b.dropout())
    root = jax.random.key(7)
    assert data(rngs_from_seed(7).default()) == data(
        nnx.Rngs(default=fold_in_name(root, "default")).default()
    )


@pytest.mark.parametrize(("seed", "error"), [(True, TypeError), (1.0, TypeError), (-1, ValueError)])
def test_rngs_from_seed_seed_checks(seed, error):
    with pytest.raises(error, match="seed"):
        rngs_from_seed(seed)


def test_a_seed_past_what_jax_takes_is_refused_not_folded_onto_a_small_one():
    # with x64 off, jax.random.key(2**32) gave seed 0's keys; 2**63 raised a bare OverflowError
    for seed in (2**32, 2**40):
        with pytest.raises(ValueError, match=rf"seed={seed} is past 4294967295.*x64 off"):
            rngs_from_seed(seed)
    assert data(rngs_from_seed(2**32 - 1).default()) != data(rngs_from_seed(0).default())
    with jax.enable_x64(True):
        assert data(rngs_from_seed(2**32).default()) != data(rngs_from_seed(0).default())
        with pytest.raises(
            ValueError, match=r"seed=9223372036854775808 is past 9223372036854775807"
        ):
            rngs_from_seed(2**63)


def test_rngs_from_seed_takes_a_numpy_integer_seed():
    assert data(rngs_from_seed(np.int64(7)).default()) == data(rngs_from_seed(7).default())


def test_rngs_from_seed_stream_checks():
    with pytest.raises(ValueError, match="at least one stream"):
        rngs_from_seed(0, ())
    with pytest.raises(ValueError, match="repeated: a"):
        rngs_from_seed(0, ("a", "b", "a"))
    with pytest.raises(TypeError, match="streams"):
        rngs_from_seed(0, ("a", ""))


def test_names_that_derive_the_same_key_are_refused_naming_both():
    # 32 bits of BLAKE2b: these two names fold in the same bits, so the same key, from any seed
    key = jax.random.key(0)
    assert data(fold_in_name(key, "layer_76135")) == data(fold_in_name(key, "layer_76334"))
    with pytest.raises(ValueError, match="'layer_76135' and 'layer_76334' derive the same key"):
        rngs_from_seed(0, ("params", "layer_76135", "layer_76334"))
    # each alone keeps its stream: the derivation is unchanged
    alone = rngs_from_seed(0, ("layer_76135", "params"))
    expected = nnx.Rngs(layer_76135=fold_in_name(key, "layer_76135"))
    assert data(alone.layer_76135()) == data(expected.layer_76135())


def test_split_key():
    keys = split_key(jax.random.key(0), 3)
    assert keys.shape == (3,)
    assert split_key(jax.random.key(0)).shape == (2,)
    with pytest.raises(ValueError, match="split_key num=0 must be an integer >= 1"):
        split_key(jax.random.key(0), 0)
    with pytest.raises(TypeError, match="split_key num=True must be an integer >= 1, not bool"):
        split_key(jax.random.key(0), True)


@pytest.mark.parametrize("derive", [fold_in_name, split_key], ids=["fold_in_name", "split_key"])
@pytest.mark.parametrize(
    ("key", "described"),
    [
        (0, "0"),
        (np.zeros(3, np.uint32), "dtype uint32 and shape (3,)"),
        (jax.random.split(jax.random.key(0), 2), "shape (2,)"),
    ],
    ids=["int", "raw-of-three", "two-keys"],
)
def test_a_value_that_is_not_one_key_is_refused_naming_it(derive, key, described):
    who = derive.__name__
    with pytest.raises(TypeError, match=rf"{who} needs one PRNG key .*{re.escape(described)}"):
        derive(key, "params") if derive is fold_in_name else derive(key)


def test_a_raw_uint32_key_is_one_key():
    raw = jax.random.PRNGKey(0)
    assert fold_in_name(raw, "params").shape == (2,)
    assert split_key(raw).shape == (2, 2)


@pytest.mark.usefixtures("child_processes")
def test_fold_in_name_is_stable_across_interpreters():
    program = (
        "import json, jax\n"
        "from substrax.rng import fold_in_name\n"
        "print(json.dumps(jax.random.key_data(fold_in_name(jax.random.key(5), 'params')).tolist()))\n"
    )
    # another hash seed than this interpreter's: the key must not depend on str hashing
    child = run_python(program, timeout=120, env={"PYTHONHASHSEED": "123"}).check()
    here = data(fold_in_name(jax.random.key(5), "params"))
    assert child.last_json() == here
    assert here != data(fold_in_name(jax.random.key(5), "dropout"))


def test_fold_in_name_needs_a_name():
    with pytest.raises(ValueError, match="non-empty name"):
        fold_in_name(jax.random.key(0), "")


def test_fold_in_name_folds_in_the_derivation_0_1_22_documents():
    # the first 4 bytes of BLAKE2b-512 of the UTF-8 name, big-endian: pinned, so that a change of
    # derivation (a digest size, a byte order, an encoding) changes every seeded stream loudly
    assert int.from_bytes(hashlib.blake2b(b"params").digest()[:4], "big") == 1405647464
    key = jax.random.key(0)
    assert data(fold_in_name(key, "params")) == data(jax.random.fold_in(key, 1405647464))
    assert data(fold_in_name(key, "params")) == [1056175915, 4064216867]
    name = "décodeur"
    folded = int.from_bytes(hashlib.blake2b(name.encode("utf-8")).digest()[:4], "big")
    assert data(fold_in_name(key, name)) == data(jax.random.fold_in(key, folded))
    # rngs_from_seed's streams are these keys
    assert data(rngs_from_seed(0, ("params",)).params()) == data(
        nnx.Rngs(params=fold_in_name(key, "params")).params()
    )


def test_fold_in_name_refuses_a_name_that_is_no_str_as_a_type_error():
    with pytest.raises(TypeError, match="needs a name"):
        fold_in_name(jax.random.key(0), 3)
    with pytest.raises(ValueError, match="non-empty"):
        fold_in_name(jax.random.key(0), "")


def test_key_from_needs_a_stream_name():
    with pytest.raises(ValueError, match="demo: key_from needs at least one stream name"):
        key_from(nnx.Rngs(0), streams=(), context="demo")


def test_streams_may_be_a_generator():
    rngs = rngs_from_seed(0, (s for s in ["a", "b"]))
    assert data(rngs.b()) == data(rngs_from_seed(0, ("b",)).b())
    key = key_from(nnx.Rngs(b=0), streams=(s for s in ["a", "b"]), context="t")
    assert key.shape == ()
    with pytest.raises(TypeError, match="streams must be a sequence of non-empty names"):
        rngs_from_seed(0, 3)  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match=r"got \('a', ''\)"):
        key_from(jax.random.key(0), streams=(s for s in ["a", ""]), context="t")


def test_a_name_with_a_lone_surrogate_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"the name 'a\\ud800' is not valid Unicode text"):
        fold_in_name(jax.random.key(0), "a\ud800")
    with pytest.raises(ValueError, match=r"'\\udc00'.*not valid Unicode text"):
        rngs_from_seed(0, ("params", "\udc00"))


def test_split_key_takes_a_numpy_integer_as_rngs_from_seed_does():
    assert split_key(jax.random.key(0), np.int64(3)).shape == (3,)  # pyright: ignore[reportArgumentType]
    assert data(split_key(jax.random.key(0), np.uint8(2))) == data(split_key(jax.random.key(0)))  # pyright: ignore[reportArgumentType]
    with pytest.raises(ValueError, match="split_key num=0 must be an integer >= 1"):
        split_key(jax.random.key(0), np.int32(0))  # pyright: ignore[reportArgumentType]
    with pytest.raises(TypeError, match="must be an integer >= 1, not bool"):
        split_key(jax.random.key(0), np.bool_(True))  # pyright: ignore[reportArgumentType]
