"""The store's reads (``StoreReads``, a base of ``OrbaxCheckpointStore``) and ``verify_step``."""

import contextlib
import logging
import time
from collections.abc import Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np

from substrax.support import check_int, check_mode, check_seconds

from ._lifecycle import StoreLifecycle
from ._manager import step_directories
from ._manifest import check_manifest, read_manifest
from ._metadata import CheckpointMetadata, StepRecord, read_step
from ._protocol import Checkpoint, PyTree
from ._read_errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointStoreClosedError,
    CheckpointWaitTimeoutError,
)
from ._restore import StoredLeaf, check_files, restore_items, stored_leaves, stored_trees
from ._retention import ModeLike


_logger = logging.getLogger(__name__)


@contextlib.contextmanager
def deleted_under_read(directory: Path, step: int) -> Generator[None]:
    """Raise ``CheckpointNotFoundError(deleted=True)`` for a read of ``step`` that failed as it was deleted.

    A step leaves in one rename: a read that fails once its directory is gone was deleted under.
    """
    try:
        yield
    except (CheckpointNotFoundError, CheckpointStoreClosedError):
        raise
    except Exception as error:
        if (directory / str(step)).is_dir():
            raise
        raise CheckpointNotFoundError(
            step=step,
            directory=directory,
            available=tuple(step_directories(directory)),
            deleted=True,
        ) from error


class StoreReads(StoreLifecycle):
    """The read side of a step-addressed store (``OrbaxCheckpointStore`` inherits it)."""

    def best_step(self, metric: str, *, mode: ModeLike | None = None) -> int | None:
        """The step whose ``metric`` is lowest (``"min"``) or highest (``"max"``), or None.

        Steps without the metric are skipped; ties go to the earliest step. Without ``mode``,
        the store's ``best_mode`` ranks its ``best_metric`` (so a store that keeps the highest
        accuracy names the step retention keeps for it), and ``"min"`` ranks any other metric.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.best_step("loss") is None
            True
        """
        if mode is None:
            policy = self._retention
            mode = policy.best_mode if metric == policy.best_metric else "min"
        return self._book.best_step(metric, check_mode("mode", mode))

    def read_metadata(self, step: int | None) -> CheckpointMetadata:
        """The metadata record of ``step`` (None: the latest), a format-2 sidecar mapped onto it.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.read_metadata(3)
            Traceback (most recent call last):
            ...
            substrax.checkpoint.CheckpointNotFoundError: no checkpoint step 3 ...
        """
        step = self._resolve(step)
        with deleted_under_read(self._directory, step):
            return self._record(step).metadata

    def _resolve(self, step: int | None) -> int:
        """``step``, or the latest step for None (an empty store raises, saying it is empty)."""
        if step is not None:
            return check_int("step", int(step) if isinstance(step, np.integer) else step, minimum=0)
        step = self.latest_step()
        if step is None:
            raise CheckpointNotFoundError(step=None, directory=self._directory)
        return step

    def _require(self, step: int) -> None:
        """Wait for ``step`` if it is being written; ``CheckpointNotFoundError`` if not held."""
        if step == self._writer.pending:
            self.wait()
        if step not in self.list_steps():
            raise CheckpointNotFoundError(
                step=step, directory=self._directory, available=tuple(self.list_steps())
            )

    def _record(self, step: int) -> StepRecord:
        self._require(step)
        return read_step(self._step_dir(step), step)

    def wait_for_step(
        self, after: int | None = None, *, timeout: float, poll_interval: float = 0.5
    ) -> int:
        """Wait until a step above ``after`` (any step for None) is committed; return the newest.

        An evaluator follows a live run with it; ``CheckpointWaitTimeoutError`` after ``timeout``.

        Example:
            >>> import tempfile
            >>> import numpy as np
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as root:
            ...     with OrbaxCheckpointStore(root, async_save=False) as writer:
            ...         _ = writer.save(3, {"model": {"w": np.zeros(2)}})
            ...     with OrbaxCheckpointStore(root, read_only=True) as evaluator:
            ...         evaluator.wait_for_step(after=2, timeout=10.0)
            3
        """
        check_seconds("timeout", timeout)
        check_seconds("poll_interval", poll_interval, positive=True)
        deadline = time.monotonic() + timeout
        while True:
            self._check_open()
            steps = step_directories(self._directory)
            newer = [step for step in steps if after is None or step > after]
            if newer:
                return newer[-1]
            left = deadline - time.monotonic()
            if left <= 0:
                raise CheckpointWaitTimeoutError(
                    directory=self._directory,
                    after=after,
                    timeout=timeout,
                    latest_step=steps[-1] if steps else None,
                )
            time.sleep(min(poll_interval, left))

    def restore(
        self,
        step: int | None,
        *,
        templates: Mapping[str, PyTree] | None = None,
        cast_dtypes: bool = False,
        mesh: jax.sharding.Mesh | None = None,
        items: Sequence[str] | None = None,
    ) -> Checkpoint:
        """Read ``step``: templated items land on their templates' shardings and dtypes.

        Without a template an item comes back as stored (its saved placement, else the first
        local device; in a reader, the first local device where the placement spans other
        processes' devices). A template that does not fit raises ValueError naming the first leaf; a
        dtype change raises ``CheckpointDtypeMismatchError`` unless ``cast_dtypes`` (NumPy's cast:
        an integer past the target's range wraps). Templates
        with abstract meshes need ``mesh=`` (a concrete ``Mesh``: an ``AbstractMesh`` raises
        TypeError) or a ``jax.set_mesh`` block; ``items=`` restores only
        the named items; ``step=None`` the latest step. The files read are checked against the
        step's manifest (``CheckpointCorruptError``), one its live writer owes waited for a few
        seconds; a step without one restores unverified (``verified``).

        Example:
            >>> import tempfile
            >>> import numpy as np
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     _ = store.save(0, {"rng": {"seed": 3}})
            ...     store.restore(0).items["rng"]
            {'seed': 3}
        """
        step = self._resolve(step)
        with deleted_under_read(self._directory, step):
            self._require(step)  # a step being written is waited for, its manifest too
            with ThreadPoolExecutor(1, thread_name_prefix="substrax-checkpoint-check") as pool:
                # the files are checked while orbax reads them: the restore takes the longer of
                # the two, not their sum; a damaged file is raised in place of what orbax says
                check = None
                if self._checksums:
                    check = pool.submit(check_files, self._directory, step, items)
                try:
                    record = read_step(self._step_dir(step), step)
                    manager = self._manager()
                    assert manager is not None  # noqa: S101 - _require found the step
                    values = restore_items(
                        manager,
                        step,
                        record,
                        templates=templates or {},
                        cast_dtypes=cast_dtypes,
                        mesh=mesh,
                        items=items,
                        local=self._read_only,  # a reader restores in its process alone
                    )
                finally:
                    verified = check is not None and check.result()  # CheckpointCorruptError first
            if check is not None and not verified:  # checksums asked for, none to check
                _logger.warning(
                    "checkpoint step %s in %s has no manifest (written before manifests, by a "
                    "writer stopped before it wrote one, or the file was deleted): restored "
                    "unverified, its files not checked",
                    step,
                    self._directory,
                )
        return Checkpoint(step, values, record.metadata, verified=verified)

    def describe(self, step: int) -> dict[str, list[StoredLeaf]]:
        """Every item's leaves (path, shape, dtype, bytes) read from metadata, no array read.

        Example:
            >>> import tempfile
            >>> import numpy as np
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     _ = store.save(0, {"model": {"w": np.zeros((2, 3), np.float32)}})
            ...     store.describe(0)["model"][0].nbytes
            24
        """
        with deleted_under_read(self._directory, step):
            record = self._record(step)
            manager = self._manager()
            assert manager is not None  # noqa: S101 - _record found the step
            trees = stored_trees(manager, step, record)
        dtypes, shapes = record.dtypes or {}, record.shapes or {}
        return {
            name: stored_leaves(tree, dtypes.get(name), shapes.get(name))
            for name, tree in trees.items()
        }


def _failure(item: str | None, leaf: str | None, error: BaseException) -> dict[str, Any]:
    corrupt = isinstance(error, CheckpointCorruptError)  # its own words, not its type
    words = str(error) if corrupt else f"{type(error).__name__}: {error}"
    return {"item": item, "leaf": leaf, "error": words}


def _dtype_failures(store: StoreReads, step: int) -> list[dict[str, Any]]:
    """Leaves whose dtype in the step's dtypes record differs from their array's own metadata."""
    stored = store.describe(step)
    try:
        record = read_step(store.directory / str(step), step)
    except (OSError, ValueError) as error:
        if not (store.directory / str(step)).is_dir():
            raise CheckpointNotFoundError(
                step=step, directory=store.directory, deleted=True
            ) from error
        return []  # reading the metadata record failed, and was reported
    failures: list[dict[str, Any]] = []
    for item, saved in (record.dtypes or {}).items():
        actual = {leaf.path: leaf.dtype for leaf in stored.get(item, [])}
        for leaf, dtype in saved.items():
            found = actual.get(leaf)
            if found is None or found.startswith("key<") or found == dtype:
                continue
            if dtype.startswith("key<") and found == "uint32":  # orbax's metadata: a key's data
                continue
            problem = f"the step's dtypes record says {dtype} but the array's metadata says {found}"
            problem += ": one of them was changed on disk; restore an earlier step"
            failures.append({"item": item, "leaf": leaf, "error": problem})
    return failures


def _read_back(store: StoreReads, step: int, items: tuple[str, ...]) -> list[dict[str, Any]]:
    """A step without a manifest: every item read back, one entry per item orbax cannot read."""
    failures: list[dict[str, Any]] = []
    for item in items:
        try:
            store.restore(step, items=(item,), cast_dtypes=True)
        except CheckpointNotFoundError:
            raise
        except Exception as error:
            failures.append(_failure(item, None, error))
    return failures


def verify_step(store: StoreReads, step: int) -> tuple[list[dict[str, Any]] | None, bool]:
    """Check ``step``: its failures (one entry each; None: deleted meanwhile), and whether verified.

    A step with a manifest has every file checked against it (verified), one without every
    item read back (unverified); both have their dtypes checked against the dtypes record.
    """
    try:
        items = store.read_metadata(step).items
    except CheckpointNotFoundError:
        return None, False
    except Exception as error:
        return [_failure(None, None, error)], False
    step_dir = store.directory / str(step)
    failures: list[dict[str, Any]] = []
    try:
        manifest = read_manifest(step_dir)
        if manifest is None:
            failures += _read_back(store, step, items)
        else:
            for damage in check_manifest(step_dir, manifest):
                leaf = (damage.array or "<root>").replace(".", "/")
                problem = f"{step_dir / damage.file}: {damage.problem} against the step's manifest"
                message = f"{problem}; restore an earlier step"
                failures.append({"item": damage.item, "leaf": leaf, "error": message})
        failures += _dtype_failures(store, step)
    except CheckpointNotFoundError:
        return None, False
    except FileNotFoundError:
        if not step_dir.is_dir():
            return None, False
        raise
    except Exception as error:
        failures.append(_failure(None, None, error))
        manifest = None
    unique = {(f["item"], f["leaf"], f["error"]): f for f in failures}  # one damaged dtypes record
    return list(unique.values()), manifest is not None
