"""Checkpoint throughput: substrax's store against plain orbax and the disk's raw write speed.

Run: ``uv run python benchmarks/checkpoint.py [--mb 256] [--steps 1000]``. One run measures, side
by side on the same 256 MB state and disk:

* raw disk: the state's bytes written with ``open().write`` straight from the arrays' memory and
  ``os.fsync``-ed, as TensorStore under plain orbax syncs every array file it writes, then read
  back with ``np.fromfile``: the baseline of the "vs raw" columns. The same write without
  ``fsync`` (it stops in the page cache, at memory speed) is printed beside it;
* plain orbax: a ``CheckpointManager`` with its defaults (async, OCDBT), save+wait and restore;
* substrax: ``OrbaxCheckpointStore`` under each orbax setting it offers (OCDBT on/off, zarr3
  on/off), save+commit and restore onto templates, all through orbax's public API; the default
  settings once more without checksums (``use_checksums=False``), for the cost of the manifest
  (every file's size and CRC-32C, written once orbax committed the step, checked by a restore
  while orbax reads);

  a save is the second one of an open manager or store (what a training run repeats) on a
  flushed disk; a restore opens the manager or store and reads onto the state's shardings, with
  the files in the page cache (read once, untimed, just before), as for the raw read; the
  default settings with and without checksums also restore from disk (the files dropped from
  the page cache, as after a restart), where the check overlaps the disk's reads;
* the time ``save`` blocks the caller in async mode against a blocking save.

Goals: the store's default settings at least as fast as plain orbax on save and restore, and
the manifest adding at most 30% to a restore from the page cache;
* ``best_step`` over N stored steps, warm and after reopening, against reading every step's
  metadata (what the 0.1.22 store did).
"""

import argparse
import gc
import itertools
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import numpy as np
import orbax.checkpoint as ocp

from substrax.checkpoint import OrbaxCheckpointStore


def _state(megabytes: int) -> dict[str, jax.Array]:
    leaves = 8
    per_leaf = megabytes * (1 << 20) // 4 // leaves
    key = jax.random.key(0)
    return {
        f"layer{i}": jax.random.normal(jax.random.fold_in(key, i), (per_leaf // 1024, 1024))
        for i in range(leaves)
    }


def _nbytes(state: dict[str, jax.Array]) -> int:
    return sum(int(leaf.nbytes) for leaf in state.values())


def _verdict(met: bool) -> str:
    return "met" if met else "MISSED"


def _evict(root: Path) -> list[Path]:
    """Flush every file under ``root`` and drop it from the page cache; returns the files."""
    os.sync()
    files = [path for path in root.rglob("*") if path.is_file()]
    for path in files:
        with path.open("rb") as handle:
            os.posix_fadvise(handle.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    gc.collect()  # nor does a collection of the garbage others left land in the timed read
    return files


def _warm(root: Path) -> None:
    """Put every file under ``root`` in the page cache the same way, so reads compare fairly.

    The files are flushed, dropped from the cache and read once, untimed: every reader then
    starts from pages that a plain read brought in. Without this, a read soon after its own
    write finds the written pages still cached (faster than any read brings them in) or, on a
    machine that reclaims page cache proactively (this one runs DAMON, which evicts fresh
    pages within a second), already gone: the timing then measures the kernel, not the reader.
    """
    for path in _evict(root):
        path.read_bytes()


def _clear(root: Path) -> None:
    """Remove the previous write and flush the page cache's dirty pages, so no writer pays for
    the one measured before it."""
    shutil.rmtree(root, ignore_errors=True)
    os.sync()
    gc.collect()


type Timer = tuple[Callable[[], float], Callable[[], float]]
RAW = "raw disk (write + fsync / np.fromfile)"
ORBAX = "plain orbax CheckpointManager defaults"
_GOAL_MB = 256
_DEFAULT_LAYOUT = (True, True, False)  # OrbaxCheckpointStore's: OCDBT, zarr3, no zstd
UNCHECKED = "substrax default without checksums"


def _raw(state: dict[str, jax.Array], root: Path, *, sync: bool) -> Timer:
    host = {k: np.asarray(v) for k, v in state.items()}

    def write() -> float:
        _clear(root)
        root.mkdir(parents=True)
        start = time.perf_counter()
        for name, array in host.items():
            with (root / name).open("wb") as handle:
                handle.write(array.data)  # the array's own memory, no intermediate copy
                if sync:
                    handle.flush()
                    os.fsync(handle.fileno())
        return time.perf_counter() - start

    def read() -> float:
        _warm(root)
        start = time.perf_counter()
        for name in host:
            np.fromfile(root / name, np.float32)
        return time.perf_counter() - start

    return write, read


def _plain_orbax(state: dict[str, jax.Array], root: Path) -> Timer:
    def save() -> float:
        _clear(root)
        args = ocp.args.Composite(model=ocp.args.PyTreeSave(state))
        with ocp.CheckpointManager(root) as manager:
            manager.save(0, args=args)  # the first save of a manager is not what training repeats
            manager.wait_until_finished()
            os.sync()
            start = time.perf_counter()
            manager.save(1, args=args)
            manager.wait_until_finished()
            return time.perf_counter() - start

    def restore() -> float:
        args = ocp.checkpoint_utils.construct_restore_args(state)
        _warm(root)
        start = time.perf_counter()
        with ocp.CheckpointManager(root) as manager:
            restored = manager.restore(
                1,
                args=ocp.args.Composite(
                    model=ocp.args.PyTreeRestore(item=state, restore_args=args)
                ),
            )
            jax.block_until_ready(restored["model"])
        return time.perf_counter() - start

    return save, restore


def _store(state: dict[str, jax.Array], root: Path, **options: bool) -> Timer:
    def save() -> float:
        _clear(root)
        with OrbaxCheckpointStore(root, async_save=False, **options) as store:
            store.save(0, {"model": state})
            os.sync()
            start = time.perf_counter()
            store.save(1, {"model": state})
            return time.perf_counter() - start

    def restore() -> float:
        _warm(root)
        return _restore(state, root, **options)

    return save, restore


def _restore(state: dict[str, jax.Array], root: Path, **options: bool) -> float:
    start = time.perf_counter()
    with OrbaxCheckpointStore(root, **options) as store:
        restored = store.restore(1, templates={"model": state})
        jax.block_until_ready(restored.items["model"])
    return time.perf_counter() - start


def _from_disk(state: dict[str, jax.Array], root: Path, **options: bool) -> float:
    """A restore after a restart: the step's files dropped from the page cache, read from disk."""
    _evict(root)
    return _restore(state, root, **options)


def _async_blocking(state: dict[str, jax.Array], root: Path) -> tuple[float, float]:
    blocked: list[float] = []
    shutil.rmtree(root, ignore_errors=True)
    with OrbaxCheckpointStore(root, max_to_keep=2) as store:
        for step in range(4):
            store.wait()  # the previous write is not part of this save's blocking time
            start = time.perf_counter()
            store.save(step, {"model": state})
            blocked.append(time.perf_counter() - start)
    shutil.rmtree(root, ignore_errors=True)
    with OrbaxCheckpointStore(root, async_save=False, max_to_keep=2) as store:
        blocking = []
        for step in range(3):
            start = time.perf_counter()
            store.save(step, {"model": state})
            blocking.append(time.perf_counter() - start)
    return statistics.median(blocked[1:]), statistics.median(blocking)


def _best_step(root: Path, steps: int) -> tuple[float, float, float, float]:
    shutil.rmtree(root, ignore_errors=True)
    rng = np.random.default_rng(0)
    state = {"w": np.zeros(4, np.float32)}
    start = time.perf_counter()
    with OrbaxCheckpointStore(root, max_to_keep=None) as store:
        for step in range(steps):
            store.save(step, {"model": state}, metrics={"loss": float(rng.random())})
    fill = time.perf_counter() - start
    with OrbaxCheckpointStore(root, max_to_keep=None) as store:
        start = time.perf_counter()
        store.best_step("loss")
        cold = time.perf_counter() - start
        start = time.perf_counter()
        for _ in range(100):
            store.best_step("loss")
        warm = (time.perf_counter() - start) / 100
        start = time.perf_counter()
        every = [store.read_metadata(step).metrics["loss"] for step in store.list_steps()]
        read_all = time.perf_counter() - start
        assert len(every) == steps
    return cold, warm, read_all, fill


def _speed_goals(
    orbax: tuple[float, float], raw: tuple[float, float], default: tuple[float, float]
) -> None:
    """Print the default store against plain orbax (the goals) and the raw disk (beside)."""
    for what, ratio in (
        ("save vs plain orbax", orbax[0] / default[0]),
        ("restore vs plain orbax", orbax[1] / default[1]),
    ):
        print(f"  {what:24} {ratio:5.2f}x  (goal >= 1.0x: {_verdict(ratio >= 1.0)})")
    print(
        f"  save vs raw disk         {raw[0] / default[0]:5.2f}x, restore vs raw disk"
        f" {raw[1] / default[1]:5.2f}x (no goal: orbax's own reads and writes)"
    )


def _checksum_cost(
    size: float,
    checked: tuple[float, float],
    unchecked: tuple[float, float],
    from_disk: dict[bool, list[float]],
) -> None:
    """Print the throughput the CRC-32C costs, from the page cache and from disk."""
    print("checksum cost, default settings (time the manifest's CRC-32C adds, same rounds):")
    for what, with_check, without in (
        ("save", checked[0], unchecked[0]),
        ("restore", checked[1], unchecked[1]),
        (
            "restore from disk (page cache dropped, median)",
            *(statistics.median(from_disk[flag]) for flag in (True, False)),
        ),
    ):
        cost = with_check / without - 1.0
        print(
            f"  {what:8} {size / with_check:7.0f} MB/s with, {size / without:7.0f} MB/s without:"
            f" {cost:6.1%}  (goal <= 30%: {_verdict(cost <= 0.30)})"
        )
    print(
        "  (a save writes the manifest once orbax committed the step; a restore checks the files"
        f" while orbax reads them, on {os.cpu_count()} CPU(s) here)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=_GOAL_MB)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--dir", type=Path, default=None, help="where to write (default: a temp dir)"
    )
    args = parser.parse_args()
    base = Path(args.dir or tempfile.mkdtemp(prefix="substrax-ckpt-bench-"))
    state = _state(args.mb)
    jax.block_until_ready(state)
    size = _nbytes(state) / (1 << 20)
    print(
        f"state: {size:.0f} MB in {len(state)} arrays; {jax.device_count()} {jax.default_backend()} device(s); dir {base}"
    )

    layouts = sorted(
        itertools.product((False, True), repeat=3), key=lambda layout: layout != _DEFAULT_LAYOUT
    )  # the default first in the table
    settings = {
        f"substrax ocdbt={int(ocdbt)} zarr3={int(zarr3)} zstd={int(zstd)}"
        + (" (default)" if (ocdbt, zarr3, zstd) == _DEFAULT_LAYOUT else ""): {
            "use_ocdbt": ocdbt,
            "use_zarr3": zarr3,
            "use_compression": zstd,
        }
        for ocdbt, zarr3, zstd in layouts
    }
    timers: dict[str, Timer] = {
        RAW: _raw(state, base / "raw", sync=True),
        "page cache (write, no fsync / np.fromfile)": _raw(state, base / "cache", sync=False),
        ORBAX: _plain_orbax(state, base / "orbax"),
    }
    settings[UNCHECKED] = {"use_checksums": False}
    for name, options in settings.items():
        timers[name] = _store(state, base / "store", **options)
    rounds: dict[str, list[tuple[float, float]]] = {name: [] for name in timers}
    from_disk: dict[bool, list[float]] = {True: [], False: []}  # restores by use_checksums
    order = random.Random(0)  # noqa: S311 - an order of runs, not a secret
    for _ in range(args.repeats):
        # rounds interleave the writers, so load drifts hit all alike, each round in another
        # order: whatever a heavy write leaves the machine doing (writeback, page reclaim) then
        # lands on a different writer each time
        names = list(timers)
        order.shuffle(names)
        for name in names:
            save, restore = timers[name]
            rounds[name].append((save(), restore()))
            if "(default)" in name or name == UNCHECKED:
                from_disk[name != UNCHECKED].append(
                    _from_disk(state, base / "store", use_checksums=name != UNCHECKED)
                )
    best = {name: tuple(map(min, zip(*times, strict=True))) for name, times in rounds.items()}
    raw_w, raw_r = best[RAW]
    orbax_w, orbax_r = best[ORBAX]
    print()
    print(
        f"{'writer (best of ' + str(args.repeats) + ' rounds)':44} {'save MB/s':>10} {'vs orbax':>9}"
        f" {'vs raw':>7} {'restore MB/s':>13} {'vs orbax':>9} {'vs raw':>7}"
    )
    for name, (write, read) in best.items():
        print(
            f"{name:44} {size / write:10.0f} {orbax_w / write:8.2f}x {raw_w / write:6.2f}x"
            f" {size / read:13.0f} {orbax_r / read:8.2f}x {raw_r / read:6.2f}x"
        )
    default_w, default_r = next(times for name, times in best.items() if "(default)" in name)
    print("goals, default settings (noise only ever adds time, so each side's best round):")
    if args.mb != _GOAL_MB:
        print(
            f"  (the goals are set for a {_GOAL_MB} MB state; fixed costs weigh more at {args.mb} MB)"
        )
    _speed_goals(best[ORBAX], best[RAW], (default_w, default_r))
    _checksum_cost(size, (default_w, default_r), best[UNCHECKED], from_disk)

    blocked, blocking = _async_blocking(state, base / "async")
    print()
    print(f"async save blocks the caller {blocked * 1e3:8.1f} ms")
    print(f"blocking save                {blocking * 1e3:8.1f} ms")
    print(
        f"ratio                        {blocked / blocking:8.1%}"
        f"  (goal < 5%: {_verdict(blocked / blocking < 0.05)})"
    )

    cold, warm, read_all, fill = _best_step(base / "best", args.steps)
    print()
    print(f"best_step over {args.steps} steps (stored in {fill:.1f} s):")
    print(f"  warm (store open)              {warm * 1e3:8.3f} ms")
    print(f"  cold (first call after open)   {cold * 1e3:8.3f} ms")
    print(
        f"  reading every step's metadata  {read_all * 1e3:8.3f} ms  ({read_all / warm:,.0f}x the warm call)"
    )
    print(f"  goal: under 10 ms, cold: {_verdict(cold < 0.010)}")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
