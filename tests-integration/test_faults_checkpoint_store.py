"""Faults of a store shared between processes: readers beside a live writer, a writer killed
mid-save, a full disk, two writers racing, an evaluator following a run, and bad paths.

Every process here is real (``sys.executable`` children), every file is on disk.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from substrax.checkpoint import (
    CheckpointNotFoundError,
    CheckpointStoreNotFoundError,
    OrbaxCheckpointStore,
    upgrade_checkpoints,
)


ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "1"}
WORDS = 1 << 20  # float32 words per array: a state of two 4 MB arrays is 8 MB
SAVES = 20  # beside the reader, which polls ~100 times a save (the reproduction: 40)

# saves STEPS states of 8 MB, one every EVERY seconds, asynchronously, keeping the newest KEEP
# (0: all); prints "open", waits for the file GO if one is named (a sixth argument), then prints
# each step once save() returned, then "done" and waits for a line on stdin before closing
WRITER = textwrap.dedent(
    f"""
    import json, os, sys, time
    import numpy as np
    from substrax.checkpoint import CheckpointWriteError, OrbaxCheckpointStore
    directory, steps, every, keep = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
    go = sys.argv[5] if len(sys.argv) > 5 else None
    failed = []
    store = OrbaxCheckpointStore(directory, max_to_keep=keep or None)
    print("open", flush=True)
    while go is not None and not os.path.exists(go):
        time.sleep(0.01)
    for step in range(1, steps + 1):
        state = {{"model": {{"w": np.full({WORDS}, step, np.float32)}},
                 "optimizer": {{"mu": np.full({WORDS}, -step, np.float32)}},
                 "data_iterator": {{"i": step}}}}
        for _ in range(2):  # a save refused for an earlier step's failure is saved again
            try:
                store.save(step, state, metrics={{"loss": 1.0 / step}})
                break
            except CheckpointWriteError as error:
                failed.append(error.step)
        print(step, flush=True)
        time.sleep(every)
    try:
        store.wait()
    except CheckpointWriteError as error:
        failed.append(error.step)
    print("done", flush=True)
    sys.stdin.readline()
    store.close()
    print(json.dumps({{"failed": failed}}), flush=True)
    """
)

# polls the store until the stop file exists: read_only opens (a listed step holds all its
# items, unless retention took it away since: then it is no longer listed) and, with "plain", a
# plain open too (a second writer: refused while one writes)
READER = textwrap.dedent(
    """
    import json, os, sys
    from collections import Counter
    from substrax.checkpoint import OrbaxCheckpointStore
    directory, stop, plain = sys.argv[1], sys.argv[2], sys.argv[3] == "plain"
    outcomes, broken, seen, polls = Counter(), [], set(), 0
    while not os.path.exists(stop):
        polls += 1
        if plain:
            try:
                store = OrbaxCheckpointStore(directory)
                store.list_steps()
                store.close()
                outcomes["opened"] += 1
            except Exception as error:
                outcomes[type(error).__name__] += 1
        reader = OrbaxCheckpointStore(directory, read_only=True)
        for step in reader.list_steps():
            if step in seen:
                continue
            seen.add(step)
            try:
                items = reader.read_metadata(step).items
                missing = [n for n in items if not os.path.isdir(f"{directory}/{step}/{n}")]
            except Exception as error:
                missing = [repr(error)]
            if missing and step in reader.list_steps():
                broken.append([step, missing])
        reader.close()
        if polls == 1:
            print("polling", flush=True)
    print(json.dumps({"polls": polls, "outcomes": outcomes, "broken": broken,
                      "seen": sorted(seen)}), flush=True)
    """
)


def _start(code: str, *args: object, stdin: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        env=ENV,
        stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _line(process: subprocess.Popen[str]) -> str:
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, f"the child ended early:\n{process.communicate(timeout=30)[1][-3000:]}"
    return line.strip()


def _finish(process: subprocess.Popen[str], timeout: float = 60) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.splitlines()[-1])


@contextlib.contextmanager
def _reaped(*processes: subprocess.Popen[str], deadline: float = 120) -> Iterator[None]:
    """Kill the children at the end, or after ``deadline`` seconds: a hung child fails the test."""
    watchdog = threading.Timer(deadline, lambda: [process.kill() for process in processes])
    watchdog.start()
    try:
        yield
    finally:
        watchdog.cancel()
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.communicate(timeout=30)


def _check_step(store: OrbaxCheckpointStore, step: int) -> None:
    checkpoint = store.restore(step)
    assert checkpoint.metadata.items == ("model", "optimizer", "data_iterator")
    w, mu = checkpoint.items["model"]["w"], checkpoint.items["optimizer"]["mu"]
    assert w.shape == mu.shape == (WORDS,)
    assert float(np.min(w)) == float(np.max(w)) == step
    assert float(np.min(mu)) == float(np.max(mu)) == -step
    assert int(checkpoint.items["data_iterator"]["i"]) == step


def test_readers_beside_a_live_writer_cost_it_no_save(tmp_path: Path) -> None:
    """The reproduction, shortened (it made 40 saves every 0.15 s): 20 saves of 8 MB every 0.05 s
    while another process opens and lists, all the while."""
    directory, stop, go = tmp_path / "store", tmp_path / "stop", tmp_path / "go"
    writer = _start(WRITER, directory, SAVES, 0.05, 0, go, stdin=True)
    with _reaped(writer):
        assert _line(writer) == "open"
        reader = _start(READER, directory, stop, "plain")
        with _reaped(reader):
            assert _line(reader) == "polling"  # the saves start once the reader is at work
            go.touch()
            while _line(writer) != "done":
                pass
            stop.touch()
            polled = _finish(reader)
        assert writer.stdin is not None
        writer.stdin.write("\n")
        writer.stdin.flush()
        assert _finish(writer) == {"failed": []}
    assert polled["polls"] >= 3
    assert polled["broken"] == []
    # every plain open was refused: none could clean a partial step the writer owned
    assert polled["outcomes"] == {"CheckpointLockedError": polled["polls"]}
    with OrbaxCheckpointStore(directory, read_only=True) as store:
        assert store.list_steps() == list(range(1, SAVES + 1))
        for step in store.list_steps():
            _check_step(store, step)


def test_a_writer_killed_mid_save_leaves_readers_only_whole_steps(tmp_path: Path) -> None:
    directory, stop = tmp_path / "store", tmp_path / "stop"
    writer = _start(WRITER, directory, 1000, 0.05, 2, stdin=True)  # retention deletes as it goes
    with _reaped(writer):
        assert _line(writer) == "open"
        readers = [_start(READER, directory, stop, "read_only") for _ in range(2)]
        with _reaped(*readers):
            assert [_line(reader) for reader in readers] == ["polling", "polling"]
            last = int(_line(writer)) + 8
            while int(_line(writer)) < last:
                pass
            writer.send_signal(
                signal.SIGKILL
            )  # this step's save() returned: its write is in flight
            writer.wait(timeout=30)
            time.sleep(0.3)  # the readers go on polling the dead writer's directory
            stop.touch()
            polled = [_finish(reader) for reader in readers]
    for result in polled:
        assert result["broken"] == []
        assert result["seen"]
    with OrbaxCheckpointStore(directory) as store:  # the kernel freed the dead writer's lock
        assert not [path.name for path in directory.iterdir() if "tmp" in path.name]
        assert not list((directory / ".substrax-deleted").glob("*"))
        assert len(store.list_steps()) <= 3
        latest = store.latest_step()
        assert latest is not None
        assert latest >= 3
        _check_step(store, latest)


FULL_DISK_WRITER = textwrap.dedent(
    """
    import contextlib, json, os, resource, signal, sys
    import numpy as np
    from substrax.checkpoint import CheckpointWriteError, OrbaxCheckpointStore
    directory, limit = sys.argv[1], int(sys.argv[2])
    if limit:  # no tmpfs here: the kernel refuses writes past this file size instead (EFBIG)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    result = {}
    ballast = os.path.join(os.path.dirname(directory), "ballast")
    with OrbaxCheckpointStore(directory) as store:
        store.save(1, {"model": {"w": np.full(1 << 18, 1.0, np.float32)}})  # 1 MB
        store.wait()
        if not limit:  # the disk filled up before the save (its write fails at once)
            with open(ballast, "wb") as file, contextlib.suppress(OSError):
                while True:
                    file.write(bytes(1 << 16))
                    file.flush()
        store.save(2, {"model": {"w": np.full(1 << 23, 2.0, np.float32)}})  # 32 MB
        try:
            store.wait()
        except CheckpointWriteError as error:
            result = {"error": type(error).__name__, "step": error.step, "message": str(error)}
        result["steps"] = store.list_steps()
        with contextlib.suppress(FileNotFoundError):
            os.remove(ballast)  # room again
        # the retry the error asks for: orbax keeps the failed write's error, raised once only
        store.save(2, {"model": {"w": np.full(8, 2.0, np.float32)}})
        store.wait()
        result["retried"] = store.list_steps()
    print(json.dumps(result), flush=True)
    """
)


@contextlib.contextmanager
def _small_disk(path: Path) -> Iterator[bool]:
    """A 16 MB tmpfs at ``path`` where this process may mount one; yields whether it did."""
    path.mkdir()
    mounted = (
        os.geteuid() == 0
        and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(path)],
            capture_output=True,
            check=False,
            timeout=30,
        ).returncode
        == 0
    )
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=True, timeout=30)


def test_a_full_disk_fails_the_save_and_keeps_the_previous_step(tmp_path: Path) -> None:
    with _small_disk(tmp_path / "disk") as mounted:
        directory = tmp_path / "disk" / "store"
        limit = 0 if mounted else 8 << 20
        writer = _start(FULL_DISK_WRITER, directory, limit)
        with _reaped(writer):
            result = _finish(writer)
        assert result["error"] == "CheckpointWriteError"
        assert result["step"] == 2
        assert str(directory) in result["message"]
        assert result["steps"] == [1]
        assert result["retried"] == [1, 2]  # hostile finding: the retry raised orbax's OSError
        with OrbaxCheckpointStore(directory, async_save=False) as store:
            assert store.list_steps() == [1, 2]
            assert not [path.name for path in directory.iterdir() if "tmp" in path.name]
            w = store.restore(1).items["model"]["w"]
            assert w.shape == (1 << 18,)
            assert float(np.min(w)) == float(np.max(w)) == 1.0
            assert store.restore(2).items["model"]["w"].tolist() == [2.0] * 8


RACER = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    from substrax.checkpoint import CheckpointLockedError, OrbaxCheckpointStore
    directory, go = sys.argv[1], sys.argv[2]
    print("ready", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        store = OrbaxCheckpointStore(directory, max_to_keep=None)
    except CheckpointLockedError as error:
        print(json.dumps({"role": "refused", "holder": error.pid, "message": str(error)}))
        sys.exit(0)
    for step in range(1, 6):
        store.save(step, {"model": {"w": np.full(4, step, np.float32)}})
    store.wait()
    print(json.dumps({"role": "writer", "pid": os.getpid()}), flush=True)
    sys.stdin.readline()  # hold the lock until the refused one has reported
    store.close()
    """
)


def test_two_writers_racing_for_one_directory(tmp_path: Path) -> None:
    directory, go = tmp_path / "store", tmp_path / "go"
    racers = [_start(RACER, directory, go, stdin=True) for _ in range(2)]
    with _reaped(*racers):
        assert [_line(racer) for racer in racers] == ["ready", "ready"]
        go.touch()  # both have imported jax and substrax and spin on the start file
        reports = {racer.pid: json.loads(_line(racer)) for racer in racers}
        for racer in racers:
            _, err = racer.communicate("\n", timeout=60)  # the writer may close now
            assert racer.returncode == 0, err[-3000:]
    roles = sorted(report["role"] for report in reports.values())
    assert roles == ["refused", "writer"]
    winner = next(pid for pid, report in reports.items() if report["role"] == "writer")
    refused = next(report for report in reports.values() if report["role"] == "refused")
    assert reports[winner]["pid"] == winner
    assert refused["holder"] == winner
    assert f"pid {winner}" in refused["message"]
    with OrbaxCheckpointStore(directory, read_only=True) as store:
        assert store.list_steps() == [1, 2, 3, 4, 5]
        for step in store.list_steps():
            assert store.restore(step).items["model"]["w"].tolist() == [float(step)] * 4


FOLLOWER = textwrap.dedent(
    """
    import json, sys
    from substrax.checkpoint import CheckpointWaitTimeoutError, OrbaxCheckpointStore
    store = OrbaxCheckpointStore(sys.argv[1], read_only=True)
    print("ready", flush=True)
    seen, step = [], None
    while step != 5:
        step = store.wait_for_step(after=step, timeout=60, poll_interval=0.02)
        w = store.restore(step).items["model"]["w"].tolist()
        seen.append([step, w])
    try:
        store.wait_for_step(after=5, timeout=0.5)
        timed_out = None
    except CheckpointWaitTimeoutError as error:
        timed_out = {"after": error.after, "latest": error.latest_step, "message": str(error)}
    print(json.dumps({"seen": seen, "timed_out": timed_out}), flush=True)
    """
)


def test_an_evaluator_follows_a_live_writer(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    with OrbaxCheckpointStore(directory, max_to_keep=None) as store:
        follower = _start(FOLLOWER, directory)
        with _reaped(follower):
            assert _line(follower) == "ready"
            for step in range(1, 6):
                store.save(step, {"model": {"w": np.full(2, step, np.float32)}})
                time.sleep(0.2)
            store.wait()
            result = _finish(follower)
    steps = [step for step, _ in result["seen"]]
    assert steps == sorted(set(steps))
    assert steps[-1] == 5
    assert all(w == [float(step)] * 2 for step, w in result["seen"])
    assert result["timed_out"]["after"] == 5
    assert result["timed_out"]["latest"] == 5
    assert str(directory) in result["timed_out"]["message"]


@pytest.mark.parametrize("command", ["ls", "verify"])
def test_the_command_line_names_a_bad_path(tmp_path: Path, command: str) -> None:
    path = tmp_path / "no" / "such"
    if command == "verify":
        path = tmp_path / "a-file"
        path.write_text("not a store")
    result = subprocess.run(
        [sys.executable, "-m", "substrax.checkpoint", command, str(path)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert str(path) in result.stderr
    assert result.stdout == ""
    assert result.stderr.startswith("python -m substrax.checkpoint: error: ")
    assert "Traceback" not in result.stderr


def test_a_typo_or_an_empty_store_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointStoreNotFoundError, match="typo"):
        OrbaxCheckpointStore(tmp_path / "typo", read_only=True)
    store = OrbaxCheckpointStore(tmp_path / "empty")
    with pytest.raises(CheckpointNotFoundError, match="is empty"):
        store.restore(store.latest_step())
    store.close()


UPGRADER = (
    "import sys\n"
    "from substrax.checkpoint import upgrade_checkpoints\n"
    "upgrade_checkpoints(sys.argv[1], sys.argv[2])\n"
)


def test_an_upgrade_killed_part_way_leaves_no_store_that_looks_whole(tmp_path: Path) -> None:
    """Hostile finding: a kill -9 during `upgrade` left a destination that opened, listed and
    restored as a whole store of the steps copied so far; a job pointed at it resumed from them."""
    source, destination = tmp_path / "source", tmp_path / "upgraded"
    with OrbaxCheckpointStore(source, max_to_keep=None, async_save=False) as store:
        for step in range(1, 41):
            store.save(step, {"model": {"w": np.full(1 << 14, step, np.float32)}})
    upgrader = _start(UPGRADER, source, destination)
    with _reaped(upgrader):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and upgrader.poll() is None:
            staged = list(tmp_path.glob(".upgraded.upgrading-*/2"))  # two steps copied
            if staged:
                break
            time.sleep(0.01)
        assert upgrader.poll() is None, "the upgrade ended before it could be killed"
        upgrader.kill()
        upgrader.wait(timeout=30)
    assert not destination.exists()  # nothing a job could take for the upgraded store
    assert [path.name for path in tmp_path.glob(".upgraded.upgrading-*")] == [
        f".upgraded.upgrading-{upgrader.pid}"
    ]
    assert upgrade_checkpoints(source, destination) == list(range(1, 41))  # a retry: whole
    with OrbaxCheckpointStore(destination, read_only=True) as store:
        assert store.restore(40).items["model"]["w"][0] == 40
