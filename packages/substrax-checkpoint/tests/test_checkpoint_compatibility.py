"""Steps stay readable both ways: the store reads what 0.2.0 wrote, plain orbax reads what it writes."""

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.checkpoint._cli import main


# tests/data/store-0.2.0: written by substrax-checkpoint 0.2.0 (zarr3 chunks with a crc32c codec,
# steps 2 and 3 written from step 1's files, no manifest), default layout and OCDBT
RELEASED = Path(__file__).parent / "data" / "store-0.2.0"


@pytest.fixture
def released(tmp_path: Path) -> Path:
    copy = tmp_path / "store-0.2.0"
    shutil.copytree(RELEASED, copy)
    return copy


def _expected(step: int) -> dict[str, object]:
    return {
        "w": np.arange(12, dtype=np.float32).reshape(4, 3) * step,
        "b": np.arange(3, dtype=np.float32) + step,
        "count": step,
        "mu": np.full((4, 3), 0.5 * step, np.float32),
    }


@pytest.mark.parametrize(("layout", "steps"), [("default", [1, 2, 3]), ("ocdbt", [5])])
def test_steps_written_by_0_2_0_restore_unverified(released, layout, steps):
    with OrbaxCheckpointStore(released / layout, read_only=True) as store:
        assert store.list_steps() == steps
        for step in steps:
            checkpoint = store.restore(step)
            expected = _expected(step)
            model, optimizer = checkpoint.items["model"], checkpoint.items["optimizer"]
            np.testing.assert_array_equal(np.asarray(model["w"]), expected["w"])
            assert model["b"].dtype == jnp.bfloat16
            np.testing.assert_array_equal(np.asarray(model["b"], np.float32), expected["b"])
            assert int(optimizer["count"]) == expected["count"]
            np.testing.assert_array_equal(np.asarray(optimizer["mu"]["w"]), expected["mu"])
            assert jax.random.key_data(checkpoint.items["rng"]).tolist() == (
                jax.random.key_data(jax.random.key(step)).tolist()
            )
            assert not checkpoint.verified
            assert checkpoint.metadata.metrics["loss"] == pytest.approx(
                0.2 if layout == "ocdbt" else 1.0 / step
            )


@pytest.mark.parametrize("unwrapped", [False, True], ids=["as-written", "no-array-metadata"])
@pytest.mark.parametrize("abstract", [False, True], ids=["key", "eval_shape"])
def test_a_0_2_0_key_recorded_as_uint32_restores_into_a_key_template(released, abstract, unwrapped):
    if unwrapped:  # orbax keeps a key's implementation there: without it, it reads key data
        shutil.rmtree(released / "default" / "2" / "rng" / "array_metadatas")
    template = jax.eval_shape(jax.random.key, 0) if abstract else jax.random.key(0)
    with OrbaxCheckpointStore(released / "default", read_only=True) as store:
        key = store.restore(2, templates={"rng": template}).items["rng"]
        with pytest.raises(ValueError, match="'' holds PRNG key data of shape"):
            store.restore(2, templates={"rng": jax.random.key(0, impl="rbg")})
    assert key.dtype == jax.random.key(0).dtype
    assert jax.random.key_data(key).tolist() == jax.random.key_data(jax.random.key(2)).tolist()


def test_a_0_2_0_store_verifies_unverified_and_takes_new_steps(released, capsys):
    directory = released / "default"
    assert main(["verify", str(directory), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [entry["status"] for entry in report] == ["unverified"] * 3
    with OrbaxCheckpointStore(directory, max_to_keep=None) as store:
        store.save(4, {"model": {"w": jnp.ones(3)}})
        store.wait()
        assert store.restore(4).verified
        assert store.restore(3).items["model"]["w"].shape == (4, 3)
        assert store.best_step("loss") == 3


PLAIN_ORBAX = textwrap.dedent(
    """
    import json, sys
    sys.modules["substrax"] = None  # plain orbax: importing substrax fails
    import numpy as np
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(sys.argv[1], options=ocp.CheckpointManagerOptions(read_only=True))
    step = manager.latest_step()
    restored = manager.restore(
        step,
        args=ocp.args.Composite(
            model=ocp.args.PyTreeRestore(),
            optimizer=ocp.args.PyTreeRestore(),
            metadata=ocp.args.JsonRestore(),
        ),
    )
    model = restored["model"]["tree"]
    print(json.dumps({
        "step": step,
        "w": np.asarray(model["w"]).tolist(),
        "count": int(np.asarray(restored["optimizer"]["tree"]["count"])),
        "metadata_step": restored["metadata"]["step"],
    }))
    """
)


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("options", [{}, {"use_ocdbt": True}], ids=["default", "ocdbt"])
def test_plain_orbax_restores_what_the_store_writes(store_dir, options):
    with OrbaxCheckpointStore(store_dir, **options) as store:
        for step in (1, 2):
            store.save(
                step,
                {
                    "model": {"w": jnp.full((2, 3), float(step))},
                    "optimizer": {"count": np.int32(step)},
                },
            )
    result = subprocess.run(
        [sys.executable, "-c", PLAIN_ORBAX, str(store_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    read = json.loads(result.stdout.strip().splitlines()[-1])
    assert read == {"step": 2, "w": [[2.0] * 3] * 2, "count": 2, "metadata_step": 2}
