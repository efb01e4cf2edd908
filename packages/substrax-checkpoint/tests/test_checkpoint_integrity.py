"""Integrity from each step's manifest: written after orbax commits, checked by restore and verify."""

import logging
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.checkpoint import CheckpointCorruptError, OrbaxCheckpointStore
from substrax.checkpoint._cli import main
from substrax.checkpoint._manifest import MANIFEST_FILE


# a restore checks the files while orbax reads them: orbax's read of a damaged file may leave
# coroutines of its asyncio loop unawaited when it fails; these tests check the store's error
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _state(step: int = 3) -> dict[str, object]:
    mesh = jax.make_mesh((8,), ("x",))
    return {
        "dense": jnp.arange(4096, dtype=jnp.float32).reshape(64, 64) * step,
        "sharded": jax.device_put(
            jnp.arange(8192, dtype=jnp.float32).reshape(128, 64),
            jax.NamedSharding(mesh, jax.P("x")),
        ),
        "host": np.arange(1000, dtype=np.int64) + step,
        "scalar": 2.5,
    }


def _save(directory: Path, step: int = 3, **options: bool) -> dict[str, object]:
    """Save step ``step``, by default one directory per array (OCDBT's files name no array)."""
    options = {"use_ocdbt": False, **options}
    state = _state(step)
    with OrbaxCheckpointStore(directory, async_save=False, max_to_keep=None, **options) as store:
        store.save(step, {"model": state, "rng": jax.random.key(4)})
    return state


def _flip_a_byte(path: Path) -> Path:
    data = bytearray(path.read_bytes())
    data[len(data) // 3] ^= 0x08
    path.write_bytes(bytes(data))
    return path


def _chunk(array_dir: Path) -> Path:
    chunks = sorted(p for p in array_dir.rglob("*") if p.is_file() and p.name != "zarr.json")
    return chunks[len(chunks) // 2]


@pytest.mark.parametrize("asynchronous", [False, True])
def test_every_committed_step_gets_a_manifest_and_restores_verified(store_dir, asynchronous):
    state = _state()
    with OrbaxCheckpointStore(store_dir, async_save=asynchronous) as store:
        store.save(1, {"model": state})
        store.save(2, {"model": state})
        assert (store_dir / "1" / MANIFEST_FILE).is_file()
        checkpoint = store.restore(2)
        assert checkpoint.verified
    assert (store_dir / "2" / MANIFEST_FILE).is_file()
    restored = checkpoint.items["model"]
    for name in ("dense", "sharded", "host"):
        np.testing.assert_array_equal(np.asarray(restored[name]), np.asarray(state[name]))
    assert restored["scalar"] == 2.5


@pytest.mark.parametrize("leaf", ["dense", "sharded", "host", "scalar"])
@pytest.mark.parametrize("templated", [True, False])
def test_a_flipped_byte_is_refused_naming_step_item_file_and_leaf(store_dir, leaf, templated):
    state = _save(store_dir)
    chunk = _flip_a_byte(_chunk(store_dir / "3" / "model" / f"tree.{leaf}"))
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        with pytest.raises(CheckpointCorruptError) as caught:
            store.restore(3, templates={"model": state} if templated else None)
        # the other items of the step still restore, verified
        assert store.restore(3, items=("rng",)).verified
    error = caught.value
    assert (error.step, error.item, error.leaf) == (3, "model", leaf)
    assert error.directory == store_dir.resolve()
    assert error.path == chunk.resolve()
    assert "CRC-32C" in error.detail
    assert "restore an earlier step" in str(error)
    assert isinstance(error, ValueError)


def test_a_corrupted_prng_key_is_refused(store_dir):
    _save(store_dir)
    _flip_a_byte(_chunk(store_dir / "3" / "rng" / "tree"))
    with (
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
        pytest.raises(CheckpointCorruptError) as caught,
    ):
        store.restore(3, templates={"rng": jax.random.key(0)}, items=("rng",))
    assert (caught.value.item, caught.value.leaf) == ("rng", "<root>")


@pytest.mark.parametrize(
    "options",
    [{"use_ocdbt": True}, {"use_compression": True}, {"use_zarr3": False}],
    ids=["ocdbt", "zstd", "zarr2"],
)
def test_every_layout_refuses_corrupted_bytes(store_dir, options):
    state = _save(store_dir, **options)
    files = sorted(p for p in (store_dir / "3" / "model").rglob("*") if p.is_file())
    _flip_a_byte(max(files, key=lambda p: p.stat().st_size))  # the largest: array data
    with (
        OrbaxCheckpointStore(store_dir, read_only=True, **options) as store,
        pytest.raises(CheckpointCorruptError) as caught,
    ):
        store.restore(3, templates={"model": state})
    assert (caught.value.step, caught.value.item) == (3, "model")


@pytest.mark.parametrize(
    "damaged", ["_CHECKPOINT_METADATA", "model/_METADATA", "model/_sharding", "metadata/metadata"]
)
def test_a_damaged_metadata_file_is_refused_naming_it(store_dir, damaged):
    """Finding 13: the checks cover the step's metadata files, not only array chunks."""
    _save(store_dir)
    path = store_dir / "3" / damaged
    path.write_bytes(path.read_bytes()[:-3] + b"}}}")
    with (
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
        pytest.raises(CheckpointCorruptError) as caught,
    ):
        store.restore(3)
    assert caught.value.path == path.resolve()
    assert main(["verify", str(store_dir)]) == 1


def test_a_chunk_copied_from_another_step_is_refused(store_dir):
    """Finding 13: a chunk file that is valid, but another step's, fails the manifest."""
    _save(store_dir, step=3)
    _save(store_dir, step=4)
    source = _chunk(store_dir / "3" / "model" / "tree.dense")
    target = store_dir / "4" / source.relative_to(store_dir / "3")
    assert source.read_bytes() != target.read_bytes()
    shutil.copyfile(source, target)  # a whole, valid chunk: step 3's values
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        with pytest.raises(CheckpointCorruptError) as caught:
            store.restore(4)
        assert caught.value.path == target.resolve()
        assert store.restore(4, items=("rng",)).verified


def test_a_step_without_a_manifest_restores_unverified_with_a_warning(store_dir, caplog):
    """A crash between orbax's commit and the manifest, a step older than manifests, or a
    manifest deleted (a hostile review: its restore was silent)."""
    state = _save(store_dir)
    (store_dir / "3" / MANIFEST_FILE).unlink()
    with (
        caplog.at_level(logging.INFO, logger="substrax.checkpoint._reads"),
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
    ):
        checkpoint = store.restore(3, templates={"model": state})
    assert not checkpoint.verified
    # a warning, not a note: checksums were asked for and none could be checked
    [warned] = [r for r in caplog.records if "restored unverified" in r.getMessage()]
    assert warned.levelno == logging.WARNING
    assert "step 3" in warned.getMessage()
    np.testing.assert_array_equal(checkpoint.items["model"]["dense"], state["dense"])
    assert main(["verify", str(store_dir), "--json"]) == 0


def test_a_manifest_listing_no_files_is_damaged_never_trusted(store_dir, capsys):
    _save(store_dir)
    (store_dir / "3" / MANIFEST_FILE).write_text(
        '{"format": 1, "algorithm": "crc32c", "files": {}}'
    )
    with (
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
        pytest.raises(CheckpointCorruptError, match="lists no files") as refused,
    ):
        store.restore(3)
    assert refused.value.path == store_dir.resolve() / "3" / MANIFEST_FILE
    capsys.readouterr()
    assert main(["verify", str(store_dir)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "lists no files" in out


def test_use_checksums_false_writes_and_checks_no_manifest(store_dir):
    state = _save(store_dir, use_checksums=False)
    assert not (store_dir / "3" / MANIFEST_FILE).exists()
    _save(store_dir, step=4)
    _flip_a_byte(_chunk(store_dir / "4" / "model" / "tree.host"))
    with OrbaxCheckpointStore(store_dir, read_only=True, use_checksums=False) as store:
        checkpoint = store.restore(3, templates={"model": state})
        assert not checkpoint.verified
        store.restore(4)  # the damaged bytes are not checked: they come back
    with (
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
        pytest.raises(CheckpointCorruptError),
    ):
        store.restore(4)


def test_verify_names_the_damaged_step_item_file_and_leaf(store_dir, capsys):
    _save(store_dir, step=3)
    _save(store_dir, step=4)
    chunk = _flip_a_byte(_chunk(store_dir / "4" / "model" / "tree.sharded"))
    capsys.readouterr()
    assert main(["verify", str(store_dir)]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out
    assert "sharded" in out
    assert str(chunk.resolve()) in out.replace("\n", "")
    lines = [line for line in out.splitlines() if line.startswith("3 ")]
    assert lines
    assert "ok" in lines[0]


def test_a_manifest_write_that_fails_leaves_the_step_committed_and_unverified(
    store_dir, monkeypatch, caplog
):
    from substrax.checkpoint import _save as save_module

    def full_disk(step_dir: Path) -> None:
        raise OSError(28, "No space left on device", str(step_dir))

    monkeypatch.setattr(save_module, "write_manifest", full_disk)
    with caplog.at_level(logging.WARNING), OrbaxCheckpointStore(store_dir) as store:
        store.save(1, {"model": {"w": jnp.ones(3)}})
        store.wait()
        checkpoint = store.restore(1)
    assert not checkpoint.verified
    assert "its manifest could not be written" in caplog.text


@pytest.mark.parametrize("manifest", [True, False])
def test_items_given_as_one_string_is_refused_naming_the_fix(store_dir, manifest):
    _save(store_dir)
    if not manifest:
        (store_dir / "3" / MANIFEST_FILE).unlink()
    with (
        OrbaxCheckpointStore(store_dir, read_only=True) as store,
        pytest.raises(TypeError, match=r"\('model',\)|\['model'\]"),
    ):
        store.restore(3, items="model")
