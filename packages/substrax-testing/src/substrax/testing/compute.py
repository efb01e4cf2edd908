"""``BackendContract``: the tests every compute backend must pass, to inherit in a test module.

This module's path is an interface: the spec names ``substrax.testing.compute.BackendContract``,
and it is the one part of substrax.testing that imports substrax.compute (the ``compute`` extra),
so it stays out of the package's ``__init__``.

Example::

    from substrax.compute import LocalBackend
    from substrax.testing.compute import BackendContract


    class TestLocalBackend(BackendContract):
        def make_backend(self, state_dir):
            return LocalBackend({"state_dir": str(state_dir)})

The assertions carry their own messages: pytest does not rewrite asserts in an installed package.
"""

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import ClassVar

import pytest

from substrax.compute import (
    MANIFEST_NAME,
    ComputeBackend,
    JobSpec,
    RunHandle,
    RunState,
    RunStore,
    Task,
    TaskStatus,
    read_manifest,
)

from ._errors import RunNotFinalError


_WRITES = """\
import os, pathlib
print("hello from the task", flush=True)
out = pathlib.Path(os.environ["AVITAI_OUTPUT_DIR"]) / "result"
out.mkdir(parents=True, exist_ok=True)
(out / "value.txt").write_text("42")
"""
_FAILS = "import sys\nprint('about to fail', flush=True)\nsys.exit(7)\n"
_SLEEPS = "import time\nprint('sleeping now', flush=True)\ntime.sleep(600)\n"

_REOPEN = """\
import json, sys
from pathlib import Path
from substrax.compute import RunStore, load_backend
from substrax.testing.compute import wait_until_final
handle = RunStore(Path(sys.argv[1])).load(sys.argv[2])
backend = load_backend(handle.backend, handle.settings)
print(json.dumps({"state": str(wait_until_final(backend, handle, timeout=float(sys.argv[3])))}))
"""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def wait_until_final(
    backend: ComputeBackend, handle: RunHandle, timeout: float = 180.0, interval: float = 0.2
) -> RunState:
    """Poll ``backend.status`` until the run is final; return that state.

    Raises:
        RunNotFinalError: The run is still not final after ``timeout`` seconds (a
            ``TimeoutError``).
    """
    deadline = time.monotonic() + timeout
    while True:
        state = backend.status(handle)
        if state.is_final:
            return state
        if time.monotonic() > deadline:
            raise RunNotFinalError(handle.run_id, str(state), timeout)
        time.sleep(interval)


class BackendContract:
    """Inheritable tests: subclass it, define ``make_backend``, and pytest collects five tests.

    Class attributes a subclass may change: ``timeout`` (seconds a run may take) and
    ``probe_devices`` (whether the jobs run the device probe).
    """

    timeout: ClassVar[float] = 180.0
    probe_devices: ClassVar[bool] = False

    def make_backend(self, state_dir: Path) -> ComputeBackend:
        """Build the backend under test, keeping its state under ``state_dir``."""
        raise NotImplementedError("subclass BackendContract and define make_backend(state_dir)")

    @pytest.fixture
    def state_dir(self, tmp_path: Path) -> Path:
        """A fresh state directory for the backend."""
        path = tmp_path / "state"
        path.mkdir()
        return path

    @pytest.fixture
    def project(self, tmp_path: Path) -> Path:
        """A project with three scripts: ``writes.py``, ``fails.py`` (exit 7), ``sleeps.py``."""
        root = tmp_path / "project"
        root.mkdir()
        for name, text in (("writes", _WRITES), ("fails", _FAILS), ("sleeps", _SLEEPS)):
            (root / f"{name}.py").write_text(text)
        return root

    def job(self, *scripts: str) -> JobSpec:
        """A job running ``scripts`` (names without ``.py``) in order."""
        tasks = tuple(
            Task(name=name, argv=("python", f"{name}.py"), timeout_seconds=self.timeout)
            for name in scripts
        )
        return JobSpec(
            name="contract",
            tasks=tasks,
            timeout_seconds=self.timeout,
            runtime={"platforms": ["cpu"]},
            probe_devices=self.probe_devices,
        )

    def test_job_succeeds_and_outputs_are_fetched(
        self, project: Path, state_dir: Path, tmp_path: Path
    ) -> None:
        """A run of one writing task succeeds; fetch brings back manifest, output and log."""
        backend = self.make_backend(state_dir)
        handle = backend.submit(self.job("writes"), project=project)
        state = wait_until_final(backend, handle, self.timeout)
        _check(state is RunState.SUCCEEDED, f"run ended {state}, expected succeeded")
        fetched = backend.fetch(handle, tmp_path / "fetched")
        _check(fetched == tmp_path / "fetched" / handle.run_id, f"fetch returned {fetched}")
        manifest = read_manifest(fetched / MANIFEST_NAME)
        _check(manifest.finished, f"manifest not finished: {manifest}")
        _check(
            [t.status for t in manifest.tasks] == [TaskStatus.SUCCEEDED],
            f"task outcomes {manifest.tasks}",
        )
        value = fetched / "writes" / "result" / "value.txt"
        _check(value.is_file() and value.read_text() == "42", f"{value} missing or wrong")
        _check(
            "result/value.txt" in manifest.tasks[0].outputs,
            f"outputs listed: {manifest.tasks[0].outputs}",
        )
        stdout = (fetched / "writes" / "stdout.log").read_text()
        _check("hello from the task" in stdout, f"stdout.log holds {stdout!r}")

    def test_failed_task_does_not_stop_the_next(self, project: Path, state_dir: Path) -> None:
        """A task exiting 7 fails the run, and the task after it still runs."""
        backend = self.make_backend(state_dir)
        handle = backend.submit(self.job("fails", "writes"), project=project)
        state = wait_until_final(backend, handle, self.timeout)
        _check(state is RunState.FAILED, f"run ended {state}, expected failed")
        fetched = backend.fetch(handle, project.parent / "fetched")
        outcomes = [(t.status, t.returncode) for t in read_manifest(fetched / MANIFEST_NAME).tasks]
        expected = [(TaskStatus.FAILED, 7), (TaskStatus.SUCCEEDED, 0)]
        _check(outcomes == expected, f"outcomes {outcomes}, expected {expected}")

    def test_followed_logs_hold_task_output(self, project: Path, state_dir: Path) -> None:
        """Following the logs shows the task's prefixed lines and ends with the run."""
        backend = self.make_backend(state_dir)
        handle = backend.submit(self.job("writes"), project=project)
        lines = list(backend.logs(handle, follow=True))
        _check(
            any("[writes] hello from the task" in line for line in lines),
            f"followed logs lack the task's line: {lines}",
        )
        state = backend.status(handle)
        _check(state.is_final, f"logs ended while the run is {state}")

    def test_cancel_stops_a_running_job(self, project: Path, state_dir: Path) -> None:
        """Cancelling a sleeping run ends it cancelled; a second cancel changes nothing."""
        backend = self.make_backend(state_dir)
        handle = backend.submit(self.job("sleeps"), project=project)
        for line in backend.logs(handle, follow=True):
            if "sleeping now" in line:
                break
        backend.cancel(handle)
        state = wait_until_final(backend, handle, 60.0)
        _check(state is RunState.CANCELLED, f"run ended {state}, expected cancelled")
        backend.cancel(handle)
        again = backend.status(handle)
        _check(again is RunState.CANCELLED, f"second cancel moved the run to {again}")

    def test_stored_handle_reopens_in_a_new_process(self, project: Path, state_dir: Path) -> None:
        """A handle saved in the run store is followed to success by another interpreter."""
        backend = self.make_backend(state_dir)
        handle = backend.submit(self.job("writes"), project=project)
        store_root = state_dir / "runs-store"
        RunStore(store_root).save(handle)
        child = subprocess.run(
            [sys.executable, "-c", _REOPEN, str(store_root), handle.run_id, str(self.timeout)],
            capture_output=True,
            text=True,
            timeout=self.timeout + 60,
            check=False,
        )
        _check(child.returncode == 0, f"reopening failed:\n{child.stderr[-4000:]}")
        state = json.loads(child.stdout.strip().splitlines()[-1])["state"]
        _check(state == RunState.SUCCEEDED, f"reopened run ended {state}")
