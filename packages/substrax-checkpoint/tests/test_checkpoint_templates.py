"""Templates (``_restore``): the first leaf that does not fit named, dtype changes listed,
abstract meshes made concrete, PRNG keys restored as the template's. Restores onto templates end
to end are in test_checkpoint_reads and tests-integration/test_checkpoint_topology.py."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from substrax.checkpoint import CheckpointCorruptError, DtypeMismatch, OrbaxCheckpointStore
from substrax.checkpoint._restore import (
    check_template,
    dtype_mismatches,
    resolve_shardings,
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
        resolve_shardings(template, None)
    other = jax.make_mesh((2, 4), ("a", "b"))
    with pytest.raises(ValueError, match=r"the mesh given has the shape \{'a': 2, 'b': 4\}"):
        resolve_shardings(template, other)  # a hostile finding: it did not say so
    resolved = resolve_shardings(template, mesh)["w"]
    assert resolved.sharding == jax.sharding.NamedSharding(mesh, spec)
    with jax.set_mesh(mesh):
        assert resolve_shardings(template, None)["w"].sharding.mesh == mesh


def test_a_shape_dtype_struct_without_a_sharding_gets_the_default_device_s():
    template = {"w": jax.ShapeDtypeStruct((2,), jnp.float32), "n": jax.ShapeDtypeStruct((), "i4")}
    resolved = resolve_shardings(template, None, host={"n"})
    assert resolved["w"].sharding == jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    assert resolved["n"].sharding is None  # saved as NumPy: restored as NumPy
    with jax.default_device(jax.local_devices()[-1]):
        placed = resolve_shardings(template, None)["w"].sharding
    assert placed == jax.sharding.SingleDeviceSharding(jax.local_devices()[-1])


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


def test_a_python_number_s_kind_is_its_dtype_in_a_template():
    saved = {"lr": "float64", "n": "int64", "big": "uint64", "h": "float32", "flag": "bool"}
    template = {"lr": 0, "n": 0, "big": 0, "h": 0.0, "flag": False}
    assert dtype_mismatches("d", saved, template) == [
        DtypeMismatch(item="d", leaf="lr", saved="float64", restored="int")
    ]
    assert dtype_mismatches("d", {"n": "int64"}, {"n": jnp.zeros((), jnp.int32)}) == [
        DtypeMismatch(item="d", leaf="n", saved="int64", restored="int32")
    ]
    assert dtype_mismatches("d", {"n": "int64", "f": "bfloat16"}, {"n": 0.0, "f": 0}) == [
        DtypeMismatch(item="d", leaf="f", saved="bfloat16", restored="int"),
        DtypeMismatch(item="d", leaf="n", saved="int64", restored="float"),
    ]


def test_python_numbers_restore_into_another_type_only_with_cast_dtypes(tmp_path):
    # it used to be silent: position came back as Array(5, int32), lr as 0
    from substrax.checkpoint import CheckpointDtypeMismatchError, OrbaxCheckpointStore

    saved = {"position": 2**33 + 5, "lr": 0.1, "seen": 7}
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(0, {"data_iterator": saved})
        template = {"position": jnp.array(0), "lr": 0, "seen": 0}
        with pytest.raises(CheckpointDtypeMismatchError, match="cast_dtypes=True") as error:
            store.restore(0, templates={"data_iterator": template})
        assert {(m.leaf, m.saved, m.restored) for m in error.value.mismatches} == {
            ("lr", "float64", "int"),
            ("position", "int64", str(jnp.array(0).dtype)),
        }
        for wrong in (jnp.zeros(()), np.float32(0), 0.0):
            with pytest.raises(
                CheckpointDtypeMismatchError, match="data_iterator:position int64 -> "
            ):
                store.restore(0, templates={"data_iterator": {**template, "position": wrong}})
        same = {"position": 0, "lr": 0.0, "seen": np.int64(0)}
        restored = store.restore(0, templates={"data_iterator": same}).items["data_iterator"]
        assert restored == saved
        assert type(restored["position"]) is int
        assert type(restored["lr"]) is float
        cast = store.restore(0, templates={"data_iterator": template}, cast_dtypes=True)
        assert cast.items["data_iterator"]["lr"] == 0  # asked for


KEY = jax.random.key(0, impl="rbg")


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (
            {"model": {"w": 0.0, "n": 0}},
            "'w' is a float64 array of shape (3,) in the checkpoint "
            "but the Python float 0.0 in the template",
        ),
        (
            {"model": {"w": np.zeros(3), "n": "x"}},
            "'n' is a Python number (int64) in the checkpoint but a str in the template",
        ),
        ({"model": {"w": np.zeros(3), "n": 0, "s": 0}}, "'s' is not stored"),
        ({"model": {"w": np.zeros(3)}}, "'n' is stored but missing from the template"),
        (
            {"rng": {"key": jax.random.key(0)}},
            "'key' is a key<rbg> PRNG key in the checkpoint but a key<fry> PRNG key in the "
            "template",
        ),
        (
            {"rng": {"key": jax.random.split(jax.random.key(0, impl="rbg"), 3)}},
            "'key' has shape (3,) in the template but () in the checkpoint",
        ),
    ],
    ids=[
        "float-for-array",
        "str-for-int",
        "unstored",
        "missing-python-leaf",
        "threefry-for-rbg",
        "split-keys",
    ],
)
def test_a_template_that_does_not_fit_is_a_mismatch_naming_the_leaf_never_corruption(
    tmp_path, template, message
):
    # it used to be CheckpointCorruptError ("step 0 ... is corrupted"), whose recovery (the
    # guide's) restores an older step instead
    from substrax.checkpoint import CheckpointCorruptError, OrbaxCheckpointStore

    stored = {"model": {"w": np.arange(3.0), "n": 7}, "rng": {"key": KEY}}
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(0, stored)
        with pytest.raises(ValueError, match=r"template for item .* do not match") as error:
            store.restore(0, templates=template)
        assert not isinstance(error.value, CheckpointCorruptError)
        assert message in str(error.value)
        fitting = {
            "model": {"w": np.zeros(3), "n": 0},
            "rng": {"key": jax.random.key(1, impl="rbg")},
        }
        restored = store.restore(0, templates=fitting).items
        assert restored["model"]["n"] == 7
        np.testing.assert_array_equal(
            jax.random.key_data(restored["rng"]["key"]), jax.random.key_data(KEY)
        )


def test_a_template_with_a_dict_where_a_list_was_saved_is_a_mismatch_never_corruption(tmp_path):
    """Hostile finding: orbax's structure error was reported as a corrupted step, whose recovery
    (the guide's) restores an older step, while verify called the step intact."""
    from substrax.checkpoint import CheckpointCorruptError, OrbaxCheckpointStore

    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(1, {"model": {"a": np.ones(3), "c": [np.ones(2), np.zeros(2)]}})
        template = {"model": {"a": np.ones(3), "c": {"0": np.ones(2), "1": np.ones(2)}}}
        with pytest.raises(ValueError, match="do not match the containers of step 1") as error:
            store.restore(1, templates=template)
        assert not isinstance(error.value, CheckpointCorruptError)
        assert "tree.c" in str(error.value)  # orbax names the container that differs


class _Model(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.linear = nnx.Linear(4, 3, rngs=rngs)
        self.rngs = rngs


def _data(leaf: jax.Array) -> np.ndarray:
    return np.asarray(
        jax.random.key_data(leaf)
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key)
        else leaf
    )


def test_an_nnx_eval_shape_template_without_a_mesh_restores_jax_arrays_and_typed_keys(tmp_path):
    # its ShapeDtypeStructs have no sharding: they came back as NumPy, the key as its uint32 data
    model = _Model(nnx.Rngs(0))
    model.rngs()  # the key stream moves on
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(0, {"model": nnx.state(model)})
        abstract = nnx.eval_shape(lambda: _Model(nnx.Rngs(1)))
        restored = store.restore(0, templates={"model": nnx.state(abstract)}).items["model"]
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    pairs = zip(jax.tree.leaves(restored), jax.tree.leaves(nnx.state(model)), strict=True)
    for leaf, saved in pairs:
        assert isinstance(leaf, jax.Array)
        assert (leaf.dtype, leaf.shape, leaf.sharding) == (saved.dtype, saved.shape, default)
        np.testing.assert_array_equal(_data(leaf), _data(saved))
    merged = nnx.merge(nnx.graphdef(abstract), restored)
    assert isinstance(merged.linear.kernel.get_value(), jax.Array)
    np.testing.assert_array_equal(_data(merged.rngs()), _data(model.rngs()))


def test_a_jax_eval_shape_template_restores_typed_keys_and_numpy_leaves_as_saved(tmp_path):
    def state(seed: int) -> dict[str, object]:
        return {
            "fry": jax.random.key(seed),
            "rbg": jax.random.split(jax.random.key(seed, impl="rbg"), 2),
            "w": jnp.arange(3.0) + seed,
            "position": np.arange(2, dtype=np.int32) + seed,
            "seen": np.float32(seed),
        }

    saved = state(3)
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(0, {"rng": saved})
        restored = store.restore(0, templates={"rng": jax.eval_shape(lambda: state(0))}).items
    restored = restored["rng"]
    for name in ("fry", "rbg"):
        assert restored[name].dtype == saved[name].dtype  # key<fry>, key<rbg>: typed keys
        assert restored[name].shape == saved[name].shape
        np.testing.assert_array_equal(_data(restored[name]), _data(saved[name]))
    assert isinstance(restored["w"], jax.Array)
    assert isinstance(restored["position"], np.ndarray)  # saved as NumPy, restored as NumPy
    assert type(restored["seen"]) is np.float32
    np.testing.assert_array_equal(restored["position"], saved["position"])


@pytest.mark.parametrize("cast_dtypes", [False, True], ids=["exact", "cast"])
@pytest.mark.parametrize("abstract", [False, True], ids=["key", "eval_shape"])
def test_a_key_of_another_implementation_is_refused_though_its_data_fits(
    tmp_path, abstract, cast_dtypes
):
    # rbg and unsafe_rbg keys hold uint32[4]: the stored rbg key came back for an unsafe_rbg one
    template = {"key": jax.random.key(0, impl="unsafe_rbg")}
    template = jax.eval_shape(lambda: template) if abstract else template
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(0, {"rng": {"key": KEY}})
        message = (
            "leaf 'key' is a key<rbg> PRNG key in the checkpoint but a key<urbg> PRNG key in the "
            "template (cast_dtypes changes no key's implementation); give the template a key of "
            "the implementation the step was saved with (dtype key<rbg>)"
        )
        with pytest.raises(ValueError, match=re.escape(message)):
            store.restore(0, templates={"rng": template}, cast_dtypes=cast_dtypes)
        with pytest.raises(ValueError, match=re.escape("a key<rbg> PRNG key in the checkpoint")):
            store.restore(0, templates={"rng": {"key": jnp.zeros((), jnp.uint32)}})


@pytest.mark.parametrize("python_leaf", [3, "text", None], ids=["int", "str", "arrays-only"])
def test_a_uint32_array_is_refused_for_a_key_template_beside_any_python_leaf(tmp_path, python_leaf):
    """Hostile finding: beside a Python scalar or str the check fell back to orbax's metadata,
    where uint32 fits any key (a record from before keys were named), and [3, 9] came back as
    a key<fry> of shape ()."""
    saved = {"counts": jnp.array([3, 9], jnp.uint32)}
    saved |= {} if python_leaf is None else {"epoch": python_leaf}
    template = {**saved, "counts": jax.random.key(0)}
    message = (
        "leaf 'counts' is a uint32 value in the checkpoint but a key<fry> PRNG key in the template"
    )
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(0, {"rng": saved})
        with pytest.raises(ValueError, match=re.escape(message) + "|has shape"):
            store.restore(0, templates={"rng": template})
        store.save(1, {"rng": {**saved, "counts": jax.random.key(9)}})
        key = store.restore(1, templates={"rng": template}).items["rng"]["counts"]
    np.testing.assert_array_equal(_data(key), _data(jax.random.key(9)))


def test_a_template_whose_sharding_cannot_split_a_leaf_is_named_not_taken_for_corruption(
    tmp_path,
):
    """Hostile finding: an (8, 8) leaf templated over 3 devices raised CheckpointCorruptError,
    and the guide's recipe then falls back to older, equally intact, steps."""
    from jax.sharding import NamedSharding, PartitionSpec

    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(1, {"model": {"w": np.ones((8, 8), np.float32)}})
        mesh = jax.make_mesh((3,), ("x",), devices=jax.devices()[:3])
        sharding = NamedSharding(mesh, PartitionSpec("x"))
        template = {"model": {"w": jax.ShapeDtypeStruct((8, 8), jnp.float32, sharding=sharding)}}
        with pytest.raises(
            ValueError, match=r"leaf 'w' of shape \(8, 8\) cannot be split"
        ) as error:
            store.restore(1, templates=template)
        assert not isinstance(error.value, CheckpointCorruptError)


def test_an_abstract_mesh_given_as_mesh_is_refused_as_the_argument_not_taken_for_corruption(
    tmp_path,
):
    """Hostile finding: restore(mesh=<an AbstractMesh>) raised CheckpointCorruptError for an
    intact step (orbax failed reading it), and the guide's recipe falls back to older steps."""
    from jax.sharding import NamedSharding, PartitionSpec

    mesh = jax.make_mesh((2, 4), ("data", "model"))
    sharding = NamedSharding(mesh.abstract_mesh, PartitionSpec("model"))
    template = {"model": {"w": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=sharding)}}
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(1, {"model": {"w": np.arange(8, dtype=np.float32)}})
        for templates in (template, None):
            with pytest.raises(TypeError, match=r"mesh= must be a concrete jax.sharding.Mesh"):
                store.restore(1, templates=templates, mesh=mesh.abstract_mesh)
        restored = store.restore(1, templates=template, mesh=mesh).items["model"]["w"]
        assert restored.sharding == NamedSharding(mesh, PartitionSpec("model"))
        np.testing.assert_array_equal(restored, np.arange(8))


@pytest.mark.parametrize(
    ("saved", "template", "message"),
    [
        ({"ema": None}, {}, "leaf 'ema' is stored as None or an empty container but missing"),
        ({"extra": {}}, {}, "leaf 'extra' is stored as None or an empty container but missing"),
        ({}, {"ema": None}, "leaf 'ema' is None or an empty container in the template but not"),
        ({}, {"extra": {"a": []}}, "leaf 'extra/a' is None or an empty container in the template"),
    ],
)
def test_a_none_or_empty_container_that_differs_is_named(tmp_path, saved, template, message):
    """A hostile review: orbax's "Source: MISSING / Target: MISSING" came out, with its advice to
    pass partial_restore=True, which restore does not take."""
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(0, {"model": {"w": np.ones(2), **saved}})
        with pytest.raises(ValueError, match=re.escape(message)) as caught:
            store.restore(0, templates={"model": {"w": np.zeros(2), **template}})
    assert "partial_restore" not in str(caught.value)


def test_the_same_none_and_empty_containers_restore(tmp_path):
    empties = {"n": None, "e": {}, "l": [], "t": (), "x": {"y": None}}
    with OrbaxCheckpointStore(tmp_path, async_save=False) as store:
        store.save(0, {"model": {"w": np.ones(2), **empties}})
        restored = store.restore(0, templates={"model": {"w": np.zeros(2), **empties}})
    model = restored.items["model"]
    np.testing.assert_array_equal(model.pop("w"), np.ones(2))
    assert model == empties
