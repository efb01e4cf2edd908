"""The writer lock: one writing process per store, shared within a process, freed at death."""

import gc
import json
import os
import select
import socket
import subprocess
import sys
import textwrap
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from substrax.checkpoint import (
    CheckpointLockedError,
    CheckpointStoreSupersededError,
    OrbaxCheckpointStore,
)
from substrax.checkpoint._lock import LOCK_FILE, read_holder
from substrax.runtime import JaxRuntime, child_environment


# a second process, one for the module, tries to open the store named by each line it reads (a
# JSON [directory, mode]): it closes the store again, then prints what happened as one JSON line
OPENER = textwrap.dedent(
    """
    import json, sys, traceback
    from substrax.checkpoint import CheckpointLockedError, OrbaxCheckpointStore
    for line in sys.stdin:
        directory, mode = json.loads(line)
        try:
            store = OrbaxCheckpointStore(directory, read_only=mode == "read")
        except CheckpointLockedError as error:
            answer = {"locked": True, "host": error.host, "pid": error.pid,
                      "since": error.since, "message": str(error)}
        except Exception:
            answer = {"error": traceback.format_exc()}
        else:
            answer = {"locked": False, "steps": store.list_steps()}
            store.close()
        print(json.dumps(answer), flush=True)
    """
)


@pytest.fixture(scope="module")
def open_elsewhere(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., dict]]:
    """``open_elsewhere(directory, mode="write")``: what another process saw opening the store."""
    errors = tmp_path_factory.mktemp("opener") / "stderr"
    with errors.open("w") as stderr:
        opener = subprocess.Popen(
            [sys.executable, "-c", OPENER],
            env=child_environment(JaxRuntime(platforms=("cpu",), preallocate=False)),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    assert opener.stdin is not None
    assert opener.stdout is not None

    def open_it(directory: Path, mode: str = "write") -> dict:
        opener.stdin.write(json.dumps([str(directory), mode]) + "\n")
        opener.stdin.flush()
        answered, _, _ = select.select([opener.stdout], [], [], 120)
        line = opener.stdout.readline() if answered else ""
        assert line, f"the opener did not answer:\n{errors.read_text()[-3000:]}"
        answer = json.loads(line)
        assert "error" not in answer, answer["error"]
        return answer

    try:
        yield open_it
    finally:
        try:
            opener.communicate(timeout=30)  # its input closed, it ends
        except subprocess.TimeoutExpired:
            opener.kill()
            opener.communicate()


@pytest.mark.usefixtures("child_processes")
def test_a_second_writer_process_is_refused_and_a_reader_is_not(store_dir, open_elsewhere):
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"model": {"w": np.ones(2, np.float32)}})
        refused = open_elsewhere(store_dir)
        assert refused["locked"] is True
        assert refused["pid"] == os.getpid()
        assert refused["host"] == socket.gethostname()
        assert refused["since"] == json.loads((store_dir / LOCK_FILE).read_text())["since"]
        assert str(store_dir) in refused["message"]
        assert "read_only=True" in refused["message"]
        assert f"pid {os.getpid()}" in refused["message"]
        assert open_elsewhere(store_dir, "read") == {"locked": False, "steps": [1]}
        store.save(2, {"model": {"w": np.ones(2, np.float32)}})  # the refusal cost no save
    assert open_elsewhere(store_dir) == {"locked": False, "steps": [1, 2]}


@pytest.mark.usefixtures("child_processes")
def test_stores_of_one_process_share_the_lock_until_the_last_closes(store_dir, open_elsewhere):
    first = OrbaxCheckpointStore(store_dir)
    second = OrbaxCheckpointStore(store_dir)  # a re-run notebook cell: not refused
    first.close()
    assert open_elsewhere(store_dir)["locked"] is True
    second.close()
    assert open_elsewhere(store_dir)["locked"] is False


@pytest.mark.usefixtures("child_processes")
def test_a_store_nobody_closed_releases_the_lock_when_collected(store_dir, open_elsewhere):
    store = OrbaxCheckpointStore(store_dir)
    store.save(1, {"model": {"w": np.zeros(4, np.float32)}})  # an asynchronous save in flight
    collected = weakref.ref(store)
    del store
    deadline = time.monotonic() + 60
    while collected() is not None and time.monotonic() < deadline:
        gc.collect()  # collectable once orbax's thread lets go of the store
        time.sleep(0.05)
    assert collected() is None
    assert open_elsewhere(store_dir) == {"locked": False, "steps": [1]}


@pytest.mark.usefixtures("child_processes")
def test_a_killed_holder_frees_the_lock(store_dir, writer_elsewhere):
    with writer_elsewhere(store_dir) as holder:  # SIGKILLed when the block ends
        with pytest.raises(CheckpointLockedError) as refused:
            OrbaxCheckpointStore(store_dir)
        assert refused.value.pid == holder.pid
    with OrbaxCheckpointStore(store_dir) as store:
        assert read_holder(store_dir).pid == os.getpid()
        assert store.list_steps() == []


@pytest.mark.usefixtures("child_processes")
def test_a_forked_child_does_not_inherit_the_lock(store_dir):
    code = textwrap.dedent(
        """
        import os, sys
        from substrax.checkpoint import CheckpointLockedError, OrbaxCheckpointStore
        store = OrbaxCheckpointStore(sys.argv[1])
        child = os.fork()
        if child == 0:
            try:
                OrbaxCheckpointStore(sys.argv[1])
            except CheckpointLockedError as error:
                os._exit(0 if error.pid == os.getppid() else 3)
            os._exit(4)  # the child shared its parent's lock
        _, status = os.waitpid(child, 0)
        sys.exit(os.waitstatus_to_exitcode(status))
        """
    )
    result = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", code, str(store_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_only_a_fresh_holder_removes_partial_steps(store_dir):
    partial = store_dir / "5.orbax-checkpoint-tmp-1700000000"
    with OrbaxCheckpointStore(store_dir):
        partial.mkdir()  # as if this process's first store were writing step 5
        with OrbaxCheckpointStore(store_dir):  # shares the lock: must not touch it
            pass
        assert partial.is_dir()
        with OrbaxCheckpointStore(store_dir, read_only=True):
            pass
        assert partial.is_dir()
    with OrbaxCheckpointStore(store_dir):  # a fresh holder: no live writer owns it
        assert not partial.exists()


def test_the_holder_record_is_json_naming_the_process(store_dir):
    with OrbaxCheckpointStore(store_dir):
        holder = read_holder(store_dir)
    assert (holder.host, holder.pid) == (socket.gethostname(), os.getpid())
    assert holder.since is not None
    assert holder.since.endswith("+00:00")
    (store_dir / LOCK_FILE).write_text("{half a rec")
    assert read_holder(store_dir).pid is None


@pytest.mark.usefixtures("child_processes")
def test_a_second_writer_store_of_the_process_takes_over_and_the_first_only_reads(
    store_dir, open_elsewhere
):
    # a notebook re-runs its cell: a second store opens the directory while the first one, never
    # closed, still has a save in flight; with keep_best=1 they must not delete each other's best
    state = {"model": {"w": np.ones(2, np.float32)}}
    policy = {"max_to_keep": 1, "keep_best": 1, "best_metric": "loss"}
    first = OrbaxCheckpointStore(store_dir, **policy)
    first.save(1, state, metrics={"loss": 0.5})
    first.save(2, state, metrics={"loss": 0.9})  # in flight when the second store opens
    second = OrbaxCheckpointStore(store_dir, **policy)
    assert second.list_steps() == [1, 2]  # the first store's write was finished first
    second.save(3, state, metrics={"loss": 0.1})
    with pytest.raises(CheckpointStoreSupersededError) as refused:
        first.save(4, state, metrics={"loss": 0.05})
    assert isinstance(refused.value, RuntimeError)
    assert (refused.value.directory, refused.value.operation) == (store_dir, "save")
    assert str(store_dir) in str(refused.value)
    assert "another OrbaxCheckpointStore" in str(refused.value)
    for writes in (lambda: first.delete(3), first.prune):
        with pytest.raises(CheckpointStoreSupersededError):
            writes()
    second.save(4, state, metrics={"loss": 0.8})
    second.wait()
    for store in (first, second):  # the first store's reads follow what the second one writes
        assert store.list_steps() == [3, 4]
        assert store.best_step("loss") == 3
        assert store.restore(store.best_step("loss")).metadata.metrics == {"loss": 0.1}
    first.close()
    assert open_elsewhere(store_dir)["locked"] is True  # the second store still writes
    second.save(5, state, metrics={"loss": 0.7})
    second.close()
    assert open_elsewhere(store_dir) == {"locked": False, "steps": [3, 5]}
