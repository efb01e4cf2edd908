"""``python -m substrax.compute.worker --spec S --project P --outputs O [--node-rank N]``.

This module's path is an interface: every backend starts the worker as ``python -m
substrax.compute.worker`` on the machine that runs the job. The worker's logic lives in
``substrax.compute._worker``; ``substrax.compute.run_job`` is the library entry.

Exit codes: 0 every task succeeded, 1 a task did not, 2 bad arguments or an unreadable or
invalid spec, 128 + SIGTERM the run was cancelled.
"""

import sys

from ._manifest import JobManifest, RunDevices, TaskOutcome, read_manifest
from ._worker import main, run_job


# The manifest's names are here too, where substrax 0.1.22 served them.
__all__ = ["JobManifest", "RunDevices", "TaskOutcome", "main", "read_manifest", "run_job"]


if __name__ == "__main__":
    sys.exit(main())
