"""Checksums on stored arrays: written with every zarr3 chunk, checked by restore and ``verify``."""

import json
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.checkpoint import CheckpointCorruptError, OrbaxCheckpointStore
from substrax.checkpoint._checksums import with_checksum
from substrax.checkpoint._cli import main


def _state() -> dict[str, object]:
    mesh = jax.make_mesh((8,), ("x",))
    return {
        "dense": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64),
        "sharded": jax.device_put(
            jnp.arange(8192, dtype=jnp.float32).reshape(128, 64),
            jax.NamedSharding(mesh, jax.P("x")),
        ),
        "host": np.arange(1000, dtype=np.int64),
        "scalar": 2.5,
    }


def _save(directory: Path, **options: bool) -> dict[str, object]:
    state = _state()
    with OrbaxCheckpointStore(directory, async_save=False, **options) as store:
        store.save(3, {"model": state, "rng": jax.random.key(4)})
    return state


def _chunk_codecs(array_dir: Path) -> list[str]:
    metadata = json.loads((array_dir / "zarr.json").read_text())
    codecs = metadata["codecs"]
    if codecs[0]["name"] == "sharding_indexed":
        codecs = codecs[0]["configuration"]["codecs"]
    return [codec["name"] for codec in codecs]


def _flip_a_bit(array_dir: Path) -> Path:
    """Flip one bit in the middle of the middle chunk file of an array (zarr3, no OCDBT)."""
    chunks = sorted(p for p in array_dir.rglob("*") if p.is_file() and p.name != "zarr.json")
    chunk = chunks[len(chunks) // 2]
    data = bytearray(chunk.read_bytes())
    data[len(data) // 3] ^= 0x08  # the chunk's bytes come first, its index last
    chunk.write_bytes(bytes(data))
    return chunk


@pytest.mark.parametrize("compression", [False, True])
def test_every_array_is_written_with_a_crc32c_codec(store_dir, compression):
    _save(store_dir, use_compression=compression)
    arrays = [*(store_dir / "3" / "model").glob("tree.*"), store_dir / "3" / "rng" / "tree"]
    assert len(arrays) == 5
    for array_dir in arrays:
        codecs = _chunk_codecs(array_dir)
        assert codecs[-1] == "crc32c", (array_dir.name, codecs)
        assert ("zstd" in codecs) == compression


@pytest.mark.parametrize("leaf", ["dense", "sharded", "host", "scalar"])
@pytest.mark.parametrize("templated", [True, False])
def test_a_flipped_bit_is_refused_naming_step_item_and_leaf(store_dir, leaf, templated):
    state = _save(store_dir)
    chunk = _flip_a_bit(store_dir / "3" / "model" / f"tree.{leaf}")
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        with pytest.raises(CheckpointCorruptError) as caught:
            store.restore(3, templates={"model": state} if templated else None)
        # the other items of the step still restore
        assert store.restore(3, items=("rng",)).items["rng"].dtype == jax.random.key(0).dtype
    error = caught.value
    assert (error.step, error.item, error.leaf) == (3, "model", leaf)
    assert error.directory == store_dir.resolve()
    assert str(error.path).startswith(str(store_dir.resolve() / "3" / "model" / f"tree.{leaf}"))
    assert str(chunk.resolve()) == str(error.path) or error.path.is_dir()
    assert "restore an earlier step" in str(error)
    assert isinstance(error, ValueError)


def test_a_corrupted_prng_key_is_refused(store_dir):
    _save(store_dir)
    _flip_a_bit(store_dir / "3" / "rng" / "tree")
    with (
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
        pytest.raises(CheckpointCorruptError) as caught,
    ):
        store.restore(3, templates={"rng": jax.random.key(0)}, items=("rng",))
    assert (caught.value.item, caught.value.leaf) == ("rng", "<root>")


@pytest.mark.parametrize(
    "options", [{"use_ocdbt": True}, {"use_compression": True}], ids=["ocdbt", "zstd"]
)
def test_other_zarr3_layouts_refuse_corrupted_bytes(store_dir, options):
    state = _save(store_dir, **options)
    if options.get("use_ocdbt"):
        files = sorted(p for p in (store_dir / "3" / "model").rglob("d/*") if p.is_file())
        target = max(files, key=lambda p: p.stat().st_size)  # the arrays' data file
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x08
        target.write_bytes(bytes(data))
    else:
        _flip_a_bit(store_dir / "3" / "model" / "tree.sharded")
    with (
        OrbaxCheckpointStore(store_dir, read_only=True, **options) as store,
        pytest.raises(CheckpointCorruptError) as caught,
    ):
        store.restore(3, templates={"model": state})
    assert (caught.value.step, caught.value.item) == (3, "model")
    assert caught.value.leaf in state


def test_a_clean_checksummed_store_restores_exact_values(store_dir):
    state = _save(store_dir)
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        restored = store.restore(3).items["model"]
    for name in ("dense", "sharded", "host"):
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(state[name]))
    assert restored["scalar"] == 2.5


def test_arrays_saved_without_checksums_still_restore(store_dir):
    state = _save(store_dir, use_checksums=False)
    assert "crc32c" not in _chunk_codecs(store_dir / "3" / "model" / "tree.dense")
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        restored = store.restore(3, templates={"model": state}).items["model"]
    np.testing.assert_array_equal(np.asarray(restored["sharded"]), np.asarray(state["sharded"]))
    assert main(["verify", str(store_dir)]) == 0


def test_the_zarr2_layout_is_written_and_read_without_checksums(store_dir):
    state = _save(store_dir, use_zarr3=False)
    assert not list((store_dir / "3" / "model").rglob("zarr.json"))
    with OrbaxCheckpointStore(store_dir, read_only=True, use_zarr3=False) as store:
        restored = store.restore(3, templates={"model": state}).items["model"]
    np.testing.assert_array_equal(np.asarray(restored["dense"]), np.asarray(state["dense"]))


def test_verify_names_the_corrupted_step_item_and_leaf(store_dir, capsys):
    with OrbaxCheckpointStore(store_dir, async_save=False, max_to_keep=None) as store:
        for step in (1, 2, 3):
            store.save(step, {"model": {"w": np.full((64, 64), step, np.float32)}})
    assert main(["verify", "--json", str(store_dir)]) == 0
    assert all(row["ok"] for row in json.loads(capsys.readouterr().out))
    _flip_a_bit(store_dir / "2" / "model" / "tree.w")
    assert main(["verify", "--json", str(store_dir)]) == 1
    rows = {row["step"]: row for row in json.loads(capsys.readouterr().out)}
    assert [step for step, row in rows.items() if not row["ok"]] == [2]
    assert (rows[2]["item"], rows[2]["leaf"]) == ("model", "w")
    assert "CheckpointCorruptError" not in rows[2]["error"]  # the error's own words, not its type
    assert "fails its checksum" in rows[2]["error"]
    assert main(["verify", str(store_dir)]) == 1
    table = capsys.readouterr().out
    failed = [line for line in table.splitlines() if "FAILED" in line]
    assert len(failed) == 1
    assert failed[0].split()[:4] == ["2", "FAILED", "model", "w"]


def test_with_checksum_extends_zarr3_specs_only_once():
    sharded = {
        "driver": "zarr3",
        "metadata": {
            "codecs": [
                {
                    "name": "sharding_indexed",
                    "configuration": {"codecs": [{"name": "bytes"}, {"name": "zstd"}]},
                }
            ]
        },
    }
    cast = {"driver": "cast", "dtype": "float32", "base": sharded}
    with_checksum(with_checksum(cast))
    inner = sharded["metadata"]["codecs"][0]["configuration"]["codecs"]
    assert [codec["name"] for codec in inner] == ["bytes", "zstd", "crc32c"]
    zarr2 = {"driver": "zarr", "metadata": {"compressor": None}}
    assert with_checksum(zarr2) == {"driver": "zarr", "metadata": {"compressor": None}}


def test_a_flip_anywhere_in_an_ocdbt_database_is_refused_or_harmless(tmp_path):
    source = tmp_path / "source"
    state = _save(source, use_ocdbt=True)
    files = sorted(p.relative_to(source) for p in (source / "3" / "model" / "d").iterdir())
    refused: list[CheckpointCorruptError] = []
    for i, name in enumerate(files):
        copy = tmp_path / f"copy{i}"
        shutil.copytree(source, copy)
        data = bytearray((copy / name).read_bytes())
        data[len(data) // 2] ^= 0x10
        (copy / name).write_bytes(bytes(data))
        with OrbaxCheckpointStore(copy, read_only=True, use_ocdbt=True) as store:
            try:
                restored = store.restore(3, templates={"model": state}).items["model"]
            except CheckpointCorruptError as error:
                refused.append(error)
                continue
        for leaf in ("dense", "sharded", "host"):  # a b-tree node no read reaches: values intact
            np.testing.assert_array_equal(np.asarray(restored[leaf]), np.asarray(state[leaf]))
    assert refused  # the arrays' data file at least
    assert {(error.step, error.item) for error in refused} == {(3, "model")}


def test_a_large_array_is_checksummed_in_chunks_of_at_most_16_mib(store_dir):
    big = jax.random.normal(jax.random.key(0), (8192, 1024))  # 32 MiB
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"big": big}})
    metadata = json.loads((store_dir / "1" / "model" / "tree.big" / "zarr.json").read_text())
    inner = metadata["codecs"][0]["configuration"]
    assert int(np.prod(inner["chunk_shape"])) * 4 <= 16 << 20
    assert inner["codecs"][-1]["name"] == "crc32c"
    _flip_a_bit(store_dir / "1" / "model" / "tree.big")
    with (
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
        pytest.raises(CheckpointCorruptError) as caught,
    ):
        store.restore(1, templates={"model": {"big": big}})
    assert caught.value.leaf == "big"
