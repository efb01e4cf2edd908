"""The store's reads: the best step, a step's metadata, waiting for a step, restores, describe.

``StoreReads`` is the read side of ``OrbaxCheckpointStore`` (its base class); it never writes.
Reading one step's files is :mod:`._restore`'s job, and a step that a live writer deletes
while it is read is :mod:`._follow`'s.
"""

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import jax

from substrax.support import check_mode

from . import _templates
from ._errors import CheckpointNotFoundError
from ._follow import deleted_under_read, wait_for_step
from ._formats import StepRecord, read_step
from ._lifecycle import StoreLifecycle
from ._metadata import CheckpointMetadata
from ._protocol import Checkpoint, PyTree
from ._restore import check_files, restore_items, stored_trees
from ._retention import ModeLike


_logger = logging.getLogger(__name__)


class StoreReads(StoreLifecycle):
    """The read side of a step-addressed store (``OrbaxCheckpointStore`` inherits it)."""

    def best_step(self, metric: str, *, mode: ModeLike = "min") -> int | None:
        """The step whose ``metric`` is lowest (``"min"``) or highest (``"max"``), or None.

        Steps without the metric are skipped; ties go to the earliest step. Answered from an
        in-memory index, so its cost does not grow with the number of steps.

        Example:
            >>> import tempfile
            >>> from substrax.checkpoint import OrbaxCheckpointStore
            >>> with tempfile.TemporaryDirectory() as directory, OrbaxCheckpointStore(directory) as store:
            ...     store.best_step("loss") is None
            True
        """
        return self._book.best_step(metric, check_mode("mode", mode))

    def read_metadata(self, step: int | None) -> CheckpointMetadata:
        """The metadata record of ``step`` (a legacy format-2 sidecar is mapped onto it).

        ``None`` (what ``latest_step()`` returns for an empty store) reads the latest step; on an
        empty store it raises ``CheckpointNotFoundError`` saying the store is empty.

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
        if step is None:
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

        An evaluator follows a live run with it, from a ``read_only`` store in another process:
        a step counts once its directory is committed, never while it is being written. Raises
        ``CheckpointWaitTimeoutError`` (a ``TimeoutError``) after ``timeout`` seconds.

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
            >>> with tempfile.TemporaryDirectory() as root:
            ...     with OrbaxCheckpointStore(root, read_only=True) as evaluator:
            ...         evaluator.wait_for_step(after=3, timeout=0.1)
            Traceback (most recent call last):
            ...
            substrax.checkpoint.CheckpointWaitTimeoutError: no step after 3 was committed ...
        """
        return wait_for_step(
            self._directory,
            after,
            timeout=timeout,
            poll_interval=poll_interval,
            check_open=self._check_open,
        )

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

        Without a template an item comes back as stored (its saved placement when those devices
        exist here, else the first local device). A template that does not fit raises ValueError
        naming the first mismatching leaf; a dtype change raises
        ``CheckpointDtypeMismatchError`` before any array is read unless ``cast_dtypes``.
        Templates built by ``nnx.eval_shape`` under ``jax.set_mesh`` carry abstract meshes:
        pass ``mesh=`` or restore inside ``jax.set_mesh(mesh)``. ``items=`` restores only the named
        items (e.g. only ``("model",)`` for evaluation). ``step=None`` (what ``latest_step()``
        returns for an empty store) restores the latest step; on an empty store it raises
        ``CheckpointNotFoundError`` saying the store is empty, so a resume never starts from
        scratch by accident. A step that a live writer's retention (or ``delete``) removes while
        it is read raises ``CheckpointNotFoundError`` with ``deleted=True``.

        The files read are first checked against the step's manifest (each file's size and
        CRC-32C, written once orbax committed the step) unless the store was opened with
        ``use_checksums=False``: a damaged file raises ``CheckpointCorruptError`` naming the
        step, the item, the file and, where the layout tells it, the array. A step without a
        manifest (written before manifests, or by a process killed between orbax's commit and
        its manifest) restores unverified: ``Checkpoint.verified`` is False, and a log record
        says so.

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
            if not self._checksums:
                record = read_step(self._step_dir(step), step)
                values = self._restore_items(
                    step,
                    record,
                    templates=templates,
                    cast_dtypes=cast_dtypes,
                    mesh=mesh,
                    items=items,
                )
                return Checkpoint(step, values, record.metadata)
            with ThreadPoolExecutor(1, thread_name_prefix="substrax-checkpoint-check") as pool:
                # the files are checked while orbax reads them: the restore takes the longer of
                # the two, not their sum; a damaged file is raised in place of what orbax says
                check = pool.submit(check_files, self._directory, step, items)
                try:
                    record = read_step(self._step_dir(step), step)
                    values = self._restore_items(
                        step,
                        record,
                        templates=templates,
                        cast_dtypes=cast_dtypes,
                        mesh=mesh,
                        items=items,
                    )
                finally:
                    verified = check.result()  # raises CheckpointCorruptError first
            if not verified:
                _logger.info(
                    "checkpoint step %s in %s has no manifest: restored unverified",
                    step,
                    self._directory,
                )
        return Checkpoint(step, values, record.metadata, verified=verified)

    def _restore_items(
        self,
        step: int,
        record: StepRecord,
        *,
        templates: Mapping[str, PyTree] | None,
        cast_dtypes: bool,
        mesh: jax.sharding.Mesh | None,
        items: Sequence[str] | None,
    ) -> dict[str, PyTree]:
        manager = self._manager()
        assert manager is not None  # noqa: S101 - _require found the step
        return restore_items(
            manager,
            step,
            record,
            templates=templates or {},
            cast_dtypes=cast_dtypes,
            mesh=mesh,
            items=items,
        )

    def describe(self, step: int) -> dict[str, list[_templates.StoredLeaf]]:
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
        return {name: _templates.describe(tree) for name, tree in trees.items()}
