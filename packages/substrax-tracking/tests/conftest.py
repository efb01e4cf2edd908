"""Fixtures for the tracking tests: a real MLflow SQLite store and a real `mlflow server`."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from substrax.testing import free_port


SERVER_BOOT_SECONDS = 240


class MlflowServer:
    """A real `mlflow server` on 127.0.0.1 with a SQLite backend store, started and stopped here."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        with (self.root / f"server-{self.starts}.log").open("wb") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "mlflow",
                    "server",
                    "--backend-store-uri",
                    f"sqlite:///{self.root / 'mlflow.db'}",
                    "--artifacts-destination",
                    str(self.root / "artifacts"),
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.starts += 1

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.uri}/health", timeout=2) as response:  # noqa: S310
                return response.status == 200
        except OSError:
            return False

    def wait_ready(self) -> None:
        deadline = time.monotonic() + SERVER_BOOT_SECONDS
        while time.monotonic() < deadline:
            if self.healthy():
                return
            assert self.process is not None
            if self.process.poll() is not None:
                break
            time.sleep(0.25)
        logs = "\n".join(
            p.read_text(errors="replace")[-3000:] for p in sorted(self.root.glob("server-*.log"))
        )
        pytest.fail(f"mlflow server on {self.uri} did not come up:\n{logs}")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Stop the server's whole process group (the CLI and its uvicorn child)."""
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=15)
        deadline = time.monotonic() + 15
        while (
            self.healthy() and time.monotonic() < deadline
        ):  # the uvicorn child may linger a moment
            time.sleep(0.1)
        self.process = None


_SERVERS: dict[str, MlflowServer] = {}  # the one server of this session, once started


def pytest_collection_finish(session):
    # Boot the server as soon as the selected tests are known to need it, so that the other
    # tests run while it starts. An xdist worker does not: the fixture starts it on the worker
    # that runs the "mlflow_server" group.
    config = session.config
    if hasattr(config, "workerinput") or _SERVERS:
        return
    if any("mlflow_server" in getattr(item, "fixturenames", ()) for item in session.items):
        root = Path(config._tmp_path_factory.mktemp("mlflow-server"))  # type: ignore[attr-defined]
        _SERVERS["session"] = MlflowServer(root)
        _SERVERS["session"].start()


def pytest_unconfigure(config):
    for server in _SERVERS.values():
        server.kill()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    if not _SERVERS:  # not started at collection (an xdist worker): start it now
        _SERVERS["session"] = MlflowServer(tmp_path_factory.mktemp("mlflow-server"))
        _SERVERS["session"].start()
    server = _SERVERS["session"]
    server.wait_ready()
    yield server
    server.kill()


@pytest.fixture(scope="session")
def sqlite_uri(tmp_path_factory):
    """A real MLflow SQLite store, migrated once per session."""
    root = tmp_path_factory.mktemp("mlflow-sqlite")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=uri).search_experiments()
    return uri


def _load_vanishing_mlflow() -> Any:
    """The ``VanishingMlflow`` class of vanishing_mlflow.py beside this file (not a package)."""
    path = Path(__file__).with_name("vanishing_mlflow.py")
    spec = importlib.util.spec_from_file_location("substrax_tracking_vanishing_mlflow", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VanishingMlflow


VanishingMlflow = _load_vanishing_mlflow()


@pytest.fixture
def vanishing_mlflow():
    """Start a :class:`VanishingMlflow`: ``start(port=0, vanish_after_run=None)``; all closed at the end."""
    started = []

    def start(port=0, vanish_after_run=None):
        server = VanishingMlflow(port, vanish_after_run=vanish_after_run)
        started.append(server)
        return server

    yield start
    for server in started:
        server.close()
