"""Two real ``jax.distributed`` processes (127.0.0.1, 4 CPU devices each): preemption agreement
and host-local arrays in a collective save; plus the single-process handler's contract."""

import ctypes
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from substrax.checkpoint import OrbaxCheckpointStore, PreemptionHandler
from substrax.testing import free_port, json_objects


WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    pid, port, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    import jax
    jax.distributed.initialize(f"127.0.0.1:{port}", 2, pid, initialization_timeout=60)
    import jax.numpy as jnp, numpy as np
    from flax import nnx
    from substrax.checkpoint import CheckpointLockedError, OrbaxCheckpointStore, PreemptionHandler
    from substrax.checkpoint._lock import read_holder

    # host-local leaves: a key made here, nnx state never placed on the global mesh, an array
    # on a mesh of this process's devices only
    key = jax.random.key(7)
    model = nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
    local_mesh = jax.make_mesh((4,), ("x",), devices=jax.local_devices())
    sharded = jax.device_put(jnp.arange(8.0), jax.NamedSharding(local_mesh, jax.P("x")))
    items = {"rng": key, "model": model, "extensions": {"sharded": sharded}}
    with OrbaxCheckpointStore(f"{root}/local", async_save=False) as store:
        store.save(0, items)
        templates = {"rng": jax.random.key(0), "model": nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(1))),
                     "extensions": {"sharded": jnp.zeros(8)}}
        restored = store.restore(0, templates=templates).items
        holder = read_holder(store.directory).pid  # the job is one writer: process 0 holds it
    try:  # the test process writes this store: every process of the job is refused
        OrbaxCheckpointStore(f"{root}/held")
        refused = None
    except CheckpointLockedError as error:
        refused = error.pid
    host_local = {
        "rng": bool(np.array_equal(jax.random.key_data(restored["rng"]), jax.random.key_data(key))),
        "kernel": bool(np.array_equal(restored["model"]["kernel"][...], model["kernel"][...])),
        "sharded": np.asarray(restored["extensions"]["sharded"]).tolist(),
    }

    stops = {}
    for every in (1, 3):
        store = OrbaxCheckpointStore(f"{root}/every-{every}")
        try:
            with PreemptionHandler(store, check_every=every) as preemption:
                for step in range(50):
                    if pid == 1 and step == 4:  # only process 1 is preempted
                        os.kill(os.getpid(), signal.SIGTERM)
                    preemption.check(step, lambda: {"model": {"w": np.full(2, step, np.float32)}})
        except SystemExit as stop:
            stops[every] = {"step": step, "code": stop.code, "requested": preemption.requested}
    lock = {"pid": os.getpid(), "holder": holder, "refused": refused}

    # retention by metrics process 0 alone passes, or each process computes on its own shard:
    # process 0's record decides on every process (they hung, or kept different steps)
    retained = {}
    for mode in ("process 0 only", "each its own"):
        losses = [0.9, 0.5, 0.7, 0.8] if pid == 0 else [0.4, 0.6, 0.9, 0.8]
        with OrbaxCheckpointStore(f"{root}/best-{mode}", max_to_keep=1, keep_best=1,
                                  best_metric="val_loss") as store:
            for step in range(1, 5):
                given = {"val_loss": losses[step - 1]}
                metrics = given if pid == 0 or mode == "each its own" else None
                store.save(step, {"model": {"w": np.full(2, step, np.float32)}}, metrics=metrics)
            store.wait()
            retained[mode] = {"steps": store.list_steps(), "best": store.best_step("val_loss"),
                              "epoch_1": store.read_metadata(store.list_steps()[0]).metrics}
    with OrbaxCheckpointStore(f"{root}/steps") as store:
        try:
            store.save(7 + pid, {"model": {"w": np.zeros(2, np.float32)}})
            mismatch = None
        except ValueError as error:
            mismatch = str(error)
        retained["steps after"] = store.list_steps()

    # saves whose trees differ between the processes: refused on each, naming the leaves (a
    # global leaf on one process hung in orbax's barriers; an item or NumPy leaf that process 1
    # alone had was dropped silently); a NumPy leaf's value may differ (process 0's is saved)
    mesh = jax.make_mesh((8,), ("data",))
    def g(value, dtype=np.float32):
        sharding = jax.NamedSharding(mesh, jax.P("data"))
        return jax.make_array_from_callback((8,), sharding, lambda i: np.full(8, value, dtype)[i])
    trees = {
        "global leaf on 0": ({"model": {"w": g(2.0), "z": g(7.0)}}, {"model": {"w": g(2.0)}}),
        "item on 1": ({"model": {"w": g(2.0)}},
                      {"model": {"w": g(2.0)}, "extensions": {"callbacks": np.arange(3)}}),
        "numpy leaf on 1": ({"model": {"w": g(2.0)}}, {"model": {"w": g(2.0), "dbg": np.ones(2)}}),
        # each process's shards of one global array in its own dtype: saved, restored as garbage
        "dtype": ({"model": {"w": g(2.0)}}, {"model": {"w": g(2, np.int32)}}),
    }
    differing = {}
    with OrbaxCheckpointStore(f"{root}/trees") as store:
        for name, given in trees.items():
            try:
                store.save(1, given[pid])
                store.wait()
                differing[name] = None
            except ValueError as error:
                differing[name] = str(error)
        store.save(1, {"model": {"w": g(2.0)}, "data_iterator": {"order": np.arange(3) + 10 * pid}})
        store.wait()
        kept = store.restore(1).items
        differing["kept"] = {"steps": store.list_steps(), "items": sorted(kept),
                             "order": kept["data_iterator"]["order"].tolist()}
    # a writer another store of its process took over restores as stored, on every process
    superseded = OrbaxCheckpointStore(f"{root}/superseded", async_save=False)
    superseded.save(1, {"model": {"w": g(2.0)}})
    newer = OrbaxCheckpointStore(f"{root}/superseded", async_save=False)
    reads = {"superseded": superseded.restore(1).items["model"]["w"].sharding == g(2.0).sharding}
    newer.close()
    superseded.close()
    # per-node output directories (the local compute backend's): the job hung at the first save
    try:
        with OrbaxCheckpointStore(f"{root}/node-{pid}/store") as store:
            store.save(1, {"model": {"w": g(1.0)}})
        differing["apart"] = None
    except ValueError as error:
        differing["apart"] = str(error)

    import substrax.checkpoint._lock as lock_module
    lock_module.TIMEOUT_MS = 3000  # the wait for a process that never saves, shortened
    alone = deleted_alone = None
    with OrbaxCheckpointStore(f"{root}/alone") as store:
        store.save(1, {"model": {"w": np.zeros(2, np.float32)}})  # both
        store.wait()
        if pid == 0:  # process 0 alone: a delete hung in orbax's barrier
            try:
                store.delete(1)
            except Exception as error:
                deleted_alone = f"{type(error).__name__}: {error}"
            try:
                store.save(3, {"model": {"w": np.zeros(2, np.float32)}})
            except Exception as error:
                alone = f"{type(error).__name__}: {error}"

    # a reader on process 0 alone (an evaluation on the main process) waited for process 1 and
    # failed on gloo's timeout; readers on every process still restore into global templates
    if pid == 0:
        with OrbaxCheckpointStore(f"{root}/trees", read_only=True) as reader:
            reads["alone"] = reader.restore(None).items["data_iterator"]["order"].tolist()
            # no template: a global array it cannot fill comes to this process's device, whole
            w = reader.restore(1, items=["model"]).items["model"]["w"]
            reads["as_stored"] = [w.is_fully_addressable, np.asarray(w).tolist()]
    with OrbaxCheckpointStore(f"{root}/trees", read_only=True) as reader:
        w = reader.restore(1, templates={"model": {"w": g(0.0)}}, items=["model"]).items["model"]["w"]
        reads["global"] = [w.sharding == g(0.0).sharding, np.asarray(w.addressable_shards[0].data).tolist()]
    print(json.dumps({"host_local": host_local, "stops": stops, "lock": lock,
                      "retained": retained, "mismatch": mismatch, "alone": alone,
                      "deleted_alone": deleted_alone,
                      "differing": differing, "reads": reads}))
    """
)


@pytest.fixture(scope="module")
def two_processes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict]]:
    root = tmp_path_factory.mktemp("multihost")
    script = root / "worker.py"
    script.write_text(WORKER)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="4")
    port = str(free_port())
    held = OrbaxCheckpointStore(root / "held")  # another writer of a store the job opens
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(pid), port, str(root)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for pid in range(2)
    ]
    results = []
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=180)
            assert proc.returncode == 0, err[-3000:]
            results.append(json_objects(out)[0])  # gloo prints its notes on stdout too
    finally:
        held.close()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return root, results


def test_the_job_is_one_writer(two_processes):
    _, results = two_processes
    first = results[0]["lock"]["pid"]
    for result in results:
        assert result["lock"]["holder"] == first  # only process 0 took the lock
        assert result["lock"]["refused"] == os.getpid()  # process 0's refusal, on every process


def test_host_local_arrays_are_saved_by_a_collective_save(two_processes):
    _, results = two_processes
    for result in results:
        assert result["host_local"] == {
            "rng": True,
            "kernel": True,
            "sharded": list(np.arange(8.0)),
        }


def test_process_0s_metrics_decide_retention_on_every_process(two_processes):
    """Hostile finding: keep_best with metrics on process 0 alone hung the job (the processes'
    retention deleted different steps); metrics computed per shard kept different steps."""
    _, results = two_processes
    for result in results:
        for mode in ("process 0 only", "each its own"):
            assert result["retained"][mode] == {
                "steps": [2, 4],  # process 0's best (0.5) and the newest
                "best": 2,
                "epoch_1": {"val_loss": 0.5},
            }


def test_processes_that_save_different_steps_all_raise_naming_them(two_processes):
    _, results = two_processes
    for result in results:
        assert result["mismatch"].startswith(
            "the processes of this job save different steps (process 0: 7, process 1: 8)"
        )
        assert result["retained"]["steps after"] == []


def test_saves_whose_trees_differ_are_refused_on_every_process_naming_the_leaves(two_processes):
    """Hostile findings: a global leaf on process 0 alone hung the job in orbax's barriers; an
    item or a NumPy leaf on process 1 alone was dropped without a word; one global array in
    another dtype on each process was saved, and restored as garbage on process 1."""
    _, results = two_processes
    differs = "the processes of this job save different trees at step 1 ("
    for result in results:
        differing = result["differing"]
        assert differing["global leaf on 0"].startswith(
            f"{differs}model/z: process 0: global jax.Array float32[8], process 1: absent)"
        )
        assert differing["dtype"].startswith(
            f"{differs}model/w: process 0: global jax.Array float32[8], process 1: global "
            "jax.Array int32[8])"
        )
        assert differing["item on 1"].startswith(
            f"{differs}extensions: process 0: absent, process 1: item; extensions/callbacks: "
            "process 0: absent, process 1: NumPy array)"
        )
        assert differing["numpy leaf on 1"].startswith(
            f"{differs}model/dbg: process 0: absent, process 1: NumPy array)"
        )
        # the same tree, a NumPy leaf's value differing: saved, as process 0's value
        assert differing["kept"] == {
            "steps": [1],
            "items": ["data_iterator", "model"],
            "order": [0, 1, 2],
        }
    assert results[0]["differing"] == results[1]["differing"]


def test_processes_that_open_different_directories_are_refused_at_the_first_save(two_processes):
    """Hostile finding: per-node output directories made a store per process; the job hung."""
    root, results = two_processes
    for result in results:
        assert result["differing"]["apart"] == (
            "the processes of this job opened different checkpoint stores: process 0 writes "
            f"{root / 'node-0' / 'store'}, and its writer lock is not in the directory of "
            f"process 1: {root / 'node-1' / 'store'}; every process opens the same store, on "
            "storage all of them share (a multi-node substrax-compute job gives each node its "
            "own output directory: pass the store a path every node sees)"
        )
    assert not (root / "node-0" / "store" / "1").exists()


def test_a_reader_needs_no_other_process(two_processes):
    """Hostile finding: a read-only store restored on process 0 alone failed after 30 s on
    gloo's DEADLINE_EXCEEDED (orbax synced every process); readers on all still restore."""
    _, results = two_processes
    assert results[0]["reads"] == {
        "alone": [0, 1, 2],
        "as_stored": [True, [2.0] * 8],  # a spec review: it came back on both processes' devices
        "global": [True, [2.0]],
        "superseded": True,  # a second-pass review: it came to one device too
    }
    assert results[1]["reads"] == {"global": [True, [2.0]], "superseded": True}


def test_a_save_or_delete_on_process_0_alone_fails_naming_the_process_that_never_came(
    two_processes,
):
    _, results = two_processes
    assert results[0]["alone"].startswith("CheckpointWriteError: checkpoint step 3 in ")
    assert "was not committed: process 1 did not call save within 3 s" in results[0]["alone"]
    assert results[1]["alone"] is None
    assert results[0]["deleted_alone"].startswith("ValueError: delete(1) on ")
    assert (
        "process 1 did not call it within 3 s, and the step was left" in results[0]["deleted_alone"]
    )


@pytest.mark.parametrize(("every", "expected"), [(1, 4), (3, 6)])
def test_one_signalled_process_stops_every_process_at_one_step(two_processes, every, expected):
    root, results = two_processes
    stops = [result["stops"][str(every)] for result in results]
    assert stops == [
        {"step": expected, "code": 0, "requested": False},
        {"step": expected, "code": 0, "requested": True},
    ]
    with OrbaxCheckpointStore(root / f"every-{every}") as store:
        assert store.list_steps() == [expected]
        checkpoint = store.restore(expected)
    assert checkpoint.metadata.extra == {"preempted": True}
    assert checkpoint.items["model"]["w"].tolist() == [expected, expected]


def _train(handler: PreemptionHandler, signal_at: int) -> None:
    for step in range(10):
        if step == signal_at:
            os.kill(os.getpid(), signal.SIGTERM)
        handler.check(step, lambda: {"model": {"w": np.zeros(1, np.float32)}})


def test_single_process_stops_at_the_first_check_after_the_signal(store_dir):
    store = OrbaxCheckpointStore(store_dir, async_save=False)
    with pytest.raises(SystemExit) as stopped, PreemptionHandler(store, check_every=5) as handler:
        _train(handler, signal_at=2)
    assert stopped.value.code == 0
    assert handler.requested
    assert OrbaxCheckpointStore(store_dir).list_steps() == [2]  # check_every is multi-process only


def test_signals_after_the_save_are_absorbed_and_handlers_restored_otherwise(store_dir):
    before = signal.getsignal(signal.SIGTERM)
    with PreemptionHandler(OrbaxCheckpointStore(store_dir)):
        assert signal.getsignal(signal.SIGTERM) != before
    assert signal.getsignal(signal.SIGTERM) == before
    try:
        with pytest.raises(SystemExit), PreemptionHandler(OrbaxCheckpointStore(store_dir)) as h:
            _train(h, signal_at=0)
        os.kill(os.getpid(), signal.SIGTERM)  # a late signal on the way out does not kill
        assert signal.getsignal(signal.SIGTERM) not in (before, signal.SIG_DFL)
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_handler_installed_from_c_is_reinstalled_on_exit(store_dir):
    # jax.distributed installs its preemption notifier's SIGTERM handler from C, where Python's
    # signal module does not see it; SIG_IGN set from C stands in for it (SIGUSR2: no notifier)
    libc = ctypes.CDLL(None)
    libc.signal.restype = ctypes.c_void_p
    libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
    before = signal.getsignal(signal.SIGUSR2)
    libc.signal(signal.SIGUSR2, 1)  # SIG_IGN, from C
    try:
        assert signal.getsignal(signal.SIGUSR2) == before  # Python does not know
        with PreemptionHandler(OrbaxCheckpointStore(store_dir), signals=(signal.SIGUSR2,)):
            assert signal.getsignal(signal.SIGUSR2) not in (before, signal.SIG_IGN)
    finally:
        previous = libc.signal(signal.SIGUSR2, 0)  # back to SIG_DFL
        signal.signal(signal.SIGUSR2, before)
    assert previous == 1  # SIG_IGN was there again, not the SIG_DFL Python remembered


@pytest.mark.parametrize(
    ("every", "error_type"),
    [(0, ValueError), (-1, ValueError), (1.5, TypeError), (True, TypeError)],
)
def test_check_every_is_validated(store_dir, every, error_type):
    with pytest.raises(error_type, match=r"check_every=.* must be an integer >= 1") as error:
        PreemptionHandler(OrbaxCheckpointStore(store_dir), check_every=every)
    assert repr(every) in str(error.value)


@pytest.mark.parametrize("value", [float("inf"), float("nan"), "diverged"])
def test_a_preemption_save_never_fails_because_of_a_metric(store_dir, value):
    store = OrbaxCheckpointStore(store_dir, async_save=False)
    metrics = {"loss": value, "acc": 0.5}
    with PreemptionHandler(store) as handler:
        os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(SystemExit) as stopped:
            handler.check(3, lambda: {"model": {"w": np.ones(1, np.float32)}}, metrics=metrics)
    assert stopped.value.code == 0
    with OrbaxCheckpointStore(store_dir, read_only=True) as reader:
        assert reader.list_steps() == [3]
        record = reader.read_metadata(3)
    assert record.metrics == {"acc": 0.5}
    assert record.extra["preempted"] is True
    if isinstance(value, float):
        assert [*record.nonfinite_metrics] == ["loss"]
