"""Importing a part loads none of the heavy libraries; each public name loads them on first use.

``benchmarks/import_time.py`` measures the cost; these tests hold the mechanism in place: every
part's package ``__init__`` loads its names from their private modules on first use (PEP 562),
and ``__all__``, ``dir()`` and ``from part import *`` still see every public name.
"""

import json
import subprocess
import sys

import pytest

import substrax.mesh


HEAVY = ("jax", "flax", "optax", "orbax", "pydantic")
PARTS = [
    "substrax.devices",
    "substrax.mesh",
    "substrax.spmd",
    "substrax.optim",
    "substrax.checkpoint",
    "substrax.testing",
    "substrax.records",
    "substrax.compute",
    "substrax.tracking",
]

# Imports the part, then reports what that loaded, what dir() lists and what a star import binds.
SURFACE = """
import json, sys
import {part} as part
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))
names = {{}}
exec("from {part} import *", names)
print(json.dumps({{
    "loaded": loaded,
    "all": sorted(part.__all__),
    "dir": dir(part),
    "star": sorted(n for n in names if n != "__builtins__"),
}}))
"""

# Uses the names in `statement`, then reports which heavy libraries are loaded.
LOADED_BY = """
import json, sys
{statement}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({heavy!r}))))
"""


def _child(program: str) -> object:
    result = subprocess.run(
        [sys.executable, "-c", program],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("part", PARTS)
def test_importing_a_part_loads_no_heavy_library_and_shows_every_name(part: str) -> None:
    out = _child(SURFACE.format(part=part, heavy=HEAVY))
    assert isinstance(out, dict)
    assert out["loaded"] == []
    assert out["all"], "a part exports names"
    assert set(out["all"]) <= set(out["dir"])
    assert out["star"] == out["all"]


@pytest.mark.parametrize(
    ("statement", "expected"),
    [
        # the device kinds, the batch-size table and its verdicts need nothing heavy; reading
        # the devices or placing a batch starts jax
        (
            "from substrax.devices import BATCH_SIZE_TABLE, DeviceKind, HardwareType, "
            "batch_size_verdict; batch_size_verdict(16, 8, hardware_type=HardwareType.CPU)",
            [],
        ),
        ("from substrax.devices import detect_devices; detect_devices()", ["jax"]),
        ("from substrax.devices import distribute_batch", []),  # jax once it is called
        # meshes and rules need jax only; the logical-axis functions bring flax
        ("from substrax.mesh import DeviceMeshManager, fsdp_rules", ["jax"]),
        ("from substrax.mesh import shard_model", ["flax", "jax", "optax"]),
        # an error class needs nothing heavy
        ("from substrax.spmd import BatchPlacementError", []),
        ("from substrax.optim import OptimizerConfigError", []),
        # the checkpoint errors, records and policies need neither jax nor orbax; the store both
        (
            "from substrax.checkpoint import CheckpointMetadata, CheckpointNotFoundError, Mode, "
            "RetentionPolicy",
            [],
        ),
        ("from substrax.checkpoint import OrbaxCheckpointStore", ["jax", "orbax"]),
        # records load pydantic when one is read, not before
        ("from substrax.records import UNKNOWN_FIELDS_REFUSED, read_record", []),
        ("from substrax.records import read_record; read_record(int, 3)", ["pydantic"]),
    ],
)
def test_a_name_loads_only_what_it_needs(statement: str, expected: list[str]) -> None:
    assert _child(LOADED_BY.format(statement=statement, heavy=HEAVY)) == expected


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        substrax.mesh.no_such_name  # noqa: B018 - the access is the test
