"""Fixtures for the tracking tests: a real MLflow SQLite store and a real `mlflow server`."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class VanishingMlflow:
    """A minimal MLflow tracking server on 127.0.0.1 that can vanish.

    A real HTTP server answering the REST calls a run needs (experiment and run creation,
    log-batch, update), keeping what it is sent in memory. With ``vanish_after_run`` it stops
    after answering ``runs/create``: ``"refuse"`` closes the socket (connections are refused),
    ``"silent"`` keeps it open but accepts and answers nothing (requests hang until their
    timeout). Also in tests-integration/programs/vanishing_mlflow.py.
    """

    def __init__(self, port: int = 0, *, vanish_after_run: str | None = None) -> None:
        self.vanish_after_run = vanish_after_run
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.metrics: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        self.vanished = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                parsed = urllib.parse.urlparse(self.path)
                query = {k: v[0] for k, v in urllib.parse.parse_qs(parsed.query).items()}
                self.answer(*owner.handle(parsed.path, query))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                status, answer = owner.handle(urllib.parse.urlparse(self.path).path, body)
                self.answer(status, answer)
                if self.path.endswith("/runs/create") and owner.vanish_after_run:
                    threading.Thread(target=owner.vanish, daemon=True).start()

            def answer(self, status: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.uri = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def handle(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:  # noqa: PLR0911  (one answer per endpoint)
        endpoint = path.removeprefix("/api/2.0/mlflow/")
        with self.lock:
            if endpoint == "experiments/get-by-name":
                found = self.experiments.get(body.get("experiment_name", ""))
                if found is None:
                    return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no such"}
                return 200, {"experiment": found}
            if endpoint == "experiments/create":
                experiment_id = str(len(self.experiments) + 1)
                self.experiments[body["name"]] = {
                    "experiment_id": experiment_id,
                    "name": body["name"],
                    "artifact_location": "",
                    "lifecycle_stage": "active",
                }
                return 200, {"experiment_id": experiment_id}
            if endpoint == "runs/search":
                wanted = body.get("filter", "")
                runs = [
                    run
                    for run in self.runs.values()
                    if any(f"'{tag['value']}'" in wanted for tag in run["data"]["tags"])
                ]
                return 200, {"runs": runs[:1]}
            if endpoint == "runs/create":
                run_id = f"run{len(self.runs) + 1}"
                self.runs[run_id] = {
                    "info": {
                        "run_id": run_id,
                        "run_uuid": run_id,
                        "experiment_id": body.get("experiment_id", "1"),
                        "run_name": body.get("run_name", ""),
                        "status": "RUNNING",
                        "start_time": int(time.time() * 1000),
                        "lifecycle_stage": "active",
                        "artifact_uri": "",
                    },
                    "data": {"tags": body.get("tags", [])},
                }
                return 200, {"run": self.runs[run_id]}
            if endpoint == "runs/get":
                run = self.runs.get(body.get("run_id", ""))
                if run is None:
                    return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "no run"}
                return 200, {"run": run}
            if endpoint == "runs/log-batch":
                for metric in body.get("metrics", []):
                    self.metrics.append({**metric, "run_id": body["run_id"]})
                return 200, {}
            if endpoint == "runs/update":
                run = self.runs[body["run_id"]]
                run["info"]["status"] = body.get("status", run["info"]["status"])
                return 200, {"run_info": run["info"]}
        return 404, {"error_code": "ENDPOINT_NOT_FOUND", "message": endpoint}

    def vanish(self) -> None:
        """Stop answering (as ``vanish_after_run`` says)."""
        self.server.shutdown()
        if self.vanish_after_run != "silent":
            self.server.server_close()
        self.vanished.set()

    def close(self) -> None:
        if not self.vanished.is_set():
            self.server.shutdown()
        self.server.server_close()


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
