"""Shared fixtures for the substrax-checkpoint tests: a fresh store directory and tiny states."""

import contextlib
import gc
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def orbax_leftovers_collected() -> Iterator[None]:
    """Collect, after the test, what orbax's failed reads of damaged files leave unawaited.

    Its coroutines warn "never awaited" whenever the garbage collector finds them, which could
    be in any later test of the worker (seen on CI in another package's test): collected after
    every test of this package (damaged steps, steps deleted under a read), with that warning
    (and only it) ignored.
    """
    yield
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="coroutine .* was never awaited", category=RuntimeWarning
        )
        gc.collect()


@pytest.fixture
def store_dir(tmp_path: Path) -> Path:
    return tmp_path / "store"


_HOLDER = (
    "import sys, time\n"
    "from substrax.checkpoint import OrbaxCheckpointStore\n"
    "store = OrbaxCheckpointStore(sys.argv[1])\n"
    "print('open', flush=True)\n"
    "time.sleep(600)\n"
)


@contextlib.contextmanager
def _writer_elsewhere(directory: Path) -> Iterator["subprocess.Popen[str]"]:
    """Another process holding ``directory`` open as its writer; SIGKILLed when the block ends."""
    writer = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(directory)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert writer.stdout is not None
        assert writer.stdout.readline().strip() == "open"
        yield writer
    finally:
        writer.kill()
        writer.wait(timeout=30)
        if writer.stdout is not None:
            writer.stdout.close()


@pytest.fixture
def writer_elsewhere() -> Callable[[Path], contextlib.AbstractContextManager[Any]]:
    """``with writer_elsewhere(directory) as process:``: another process writing the store."""
    return _writer_elsewhere


def _run_where_file_modes_apply(argv: list[str]) -> "subprocess.CompletedProcess[str]":
    """Run ``argv`` to its end, output captured; as root, without the capabilities that skip modes."""
    if os.geteuid() == 0:
        argv = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *argv]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def run_where_file_modes_apply() -> Callable[[list[str]], "subprocess.CompletedProcess[str]"]:
    """``run_where_file_modes_apply(argv)``: a child that a chmod refuses, even when run as root."""
    return _run_where_file_modes_apply


def write_format2_step(root: Path, step: int, payload: Any, sidecar: dict[str, Any]) -> Path:
    """Write one step in the 0.1.0-0.1.9 "format 2" layout with orbax directly.

    ``<step>/model/`` is a PyTreeSave of the payload (no wrapper node) and
    ``<step>/metadata/metadata`` the JSON sidecar stamped ``checkpoint_version: "2.0"``.
    """
    # orbax (and with it jax) is imported here, not at the top: pytest loads the conftest of a
    # directory named on its command line before the substrax plugin sets the device count
    import orbax.checkpoint as ocp

    sidecar = {"step": step, "checkpoint_version": "2.0", **sidecar}
    options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
    with ocp.CheckpointManager(root, options=options) as manager:
        manager.save(
            step,
            args=ocp.args.Composite(
                model=ocp.args.PyTreeSave(payload), metadata=ocp.args.JsonSave(sidecar)
            ),
        )
    assert json.loads((root / str(step) / "metadata" / "metadata").read_text()) == sidecar
    return root / str(step)


@pytest.fixture
def format2_store(tmp_path: Path) -> Path:
    root = tmp_path / "format2"
    payload = {"params": {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3)}}
    write_format2_step(
        root,
        7,
        payload,
        {
            "timestamp": 1_700_000_000.0,
            "model_type": "dict",
            "model_class": "dict",
            "loss": 0.125,
            "physics_metadata": {"pde": "darcy"},
        },
    )
    return root


@pytest.fixture
def format2_writer() -> Any:
    return write_format2_step
