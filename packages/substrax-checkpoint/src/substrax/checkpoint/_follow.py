"""Reading a store that a live writer changes: waiting for its next step, reads it deletes.

An evaluator opens the store ``read_only`` in another process and follows the run: it waits for
a newer committed step, and a step that the writer's retention removes while it is read is
reported as deleted (``CheckpointNotFoundError(deleted=True)``), not as a broken step.
"""

import contextlib
import time
from collections.abc import Callable, Generator
from pathlib import Path

from substrax.support import check_seconds

from ._errors import (
    CheckpointNotFoundError,
    CheckpointStoreClosedError,
    CheckpointWaitTimeoutError,
)
from ._manager import step_directories


def wait_for_step(
    directory: Path,
    after: int | None,
    *,
    timeout: float,
    poll_interval: float,
    check_open: Callable[[], None],
) -> int:
    """The newest step above ``after`` (any step for None) once one is committed in ``directory``.

    ``check_open`` runs before every look (it raises once the store is closed). Raises
    ``CheckpointWaitTimeoutError`` after ``timeout`` seconds.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.checkpoint._follow import wait_for_step
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     root = Path(directory)
        ...     (root / "4").mkdir()
        ...     wait_for_step(root, 3, timeout=0, poll_interval=0.1, check_open=lambda: None)
        4
    """
    check_seconds("timeout", timeout)
    check_seconds("poll_interval", poll_interval, positive=True)
    deadline = time.monotonic() + timeout
    while True:
        check_open()
        steps = step_directories(directory)
        newer = [step for step in steps if after is None or step > after]
        if newer:
            return newer[-1]
        left = deadline - time.monotonic()
        if left <= 0:
            raise CheckpointWaitTimeoutError(
                directory=directory,
                after=after,
                timeout=timeout,
                latest_step=steps[-1] if steps else None,
            )
        time.sleep(min(poll_interval, left))


@contextlib.contextmanager
def deleted_under_read(directory: Path, step: int) -> Generator[None]:
    """Raise ``CheckpointNotFoundError(deleted=True)`` for a read of ``step`` that failed as it was deleted.

    A writer's retention (or ``delete``) removes a step in one rename: when a read fails and
    the step's directory is gone, the step was deleted under the read, whatever orbax or
    TensorStore said about its missing files. A closed store stays a closed store.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.checkpoint._follow import deleted_under_read
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     with deleted_under_read(Path(directory), 3):
        ...         raise OSError("a file of step 3 is missing")
        Traceback (most recent call last):
        ...
        substrax.checkpoint.CheckpointNotFoundError: checkpoint step 3 in ... was deleted ...
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
