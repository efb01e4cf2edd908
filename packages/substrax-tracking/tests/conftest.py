"""Fixtures for the tracking tests: a real MLflow SQLite store and a real `mlflow server`."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from substrax.testing import free_port


SERVER_BOOT_SECONDS = 240


@pytest.fixture(autouse=True)
def bounded_mlflow_http(monkeypatch):
    """MLflow's HTTP settings as the tracking guide advises a user to set them.

    The logger never changes them; with MLflow's defaults (7 retries with backoff, 120 s per
    request) a dead server holds the delivery thread for minutes before a failure is seen. The
    logger's own bounds with slow settings are tested in tests-integration/test_faults_tracking.py.
    """
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "5")


@pytest.fixture
def wait_for() -> Callable[..., None]:
    """``wait_for(condition, timeout=60)``: poll ``condition()`` until it holds, or fail the test."""

    def wait(condition: Callable[[], object], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert time.monotonic() < deadline, "condition not reached"
            time.sleep(0.01)

    return wait


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


class Door:
    """A port of its own in front of the session's `mlflow server`, shut or open.

    Shut, nothing listens on it: to a client the server is down (a refused connection), and
    every connection through it is reset, as when the server dies. Open, each connection is
    relayed to the server. A test of a server that is down and comes back uses it instead of
    killing and restarting the session's server (about 20 s of the server's start each time).
    """

    def __init__(self, server_port: int) -> None:
        self.server_port = server_port
        self.port = free_port()
        self.uri = f"http://127.0.0.1:{self.port}"
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def open(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", self.port))
        self._listener.settimeout(0.1)
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def shut(self) -> None:
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._lock:
            connections, self._open = self._open, set()
        for connection in connections:  # reset, not closed in order: as a killed server's
            with contextlib.suppress(OSError):
                connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                connection.close()

    def _accept(self, listener: socket.socket) -> None:
        while self._listener is listener:
            try:
                client, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.server_port))
            except OSError:
                client.close()
                continue
            with self._lock:
                self._open |= {client, server}
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._relay, args=(source, sink), daemon=True).start()

    @staticmethod
    def _relay(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
            sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def mlflow_door(mlflow_server):
    """A shut :class:`Door` to the session's server (``open()`` it); shut again at the end."""
    door = Door(mlflow_server.port)
    yield door
    door.shut()


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


WANDB_OFFLINE_ENV = {
    "WANDB_MODE": "offline",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_SILENT": "true",
    "WANDB_DISABLE_GIT": "true",
    "WANDB_DISABLE_CODE": "true",
}


@pytest.fixture
def spool_scalars() -> Callable[..., None]:
    """``spool_scalars(path, target, steps, values)``: a spool as a logger leaves it, of scalars."""
    from substrax.tracking._spool import spool_lines

    def write(path: Path, target: dict[str, Any], steps: range, values: dict[str, float]) -> None:
        records = [
            {"kind": "scalars", "step": s, "time": 1.0, "payload": {"values": values}}
            for s in steps
        ]
        path.write_text("".join(f"{line}\n" for line in spool_lines(target, records)))

    return write


@pytest.fixture
def wandb_offline(monkeypatch):
    """W&B offline and quiet for this test and the children it starts; skips without wandb."""
    pytest.importorskip("wandb", reason="the wandb extra is needed for WandbLogger")
    for key, value in WANDB_OFFLINE_ENV.items():
        monkeypatch.setenv(key, value)


WandbRecords = list[tuple[str, Any]]  # (record_type, wandb_internal_pb2.Record) of one run file


def read_wandb_run_file(path: Path) -> WandbRecords:
    """The records of one offline run file, with wandb's own reader, as far as they are written.

    W&B's service creates the file before it writes its header, and writes records in blocks: a
    file not written yet, or cut inside a record, holds the records read up to there.
    """
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal import datastore

    records: WandbRecords = []
    store = datastore.DataStore()
    try:
        store.open_for_scan(str(path))
        while (data := store.scan_data()) is not None:
            record = wandb_internal_pb2.Record()
            record.ParseFromString(data)
            records.append((record.WhichOneof("record_type"), record))
    except AssertionError:  # "header is 0 bytes", a short record header, a record not all there
        pass
    finally:
        store.close()
    return records


class WandbRuns:
    """Reads the offline run files under ``<root>/wandb``: ``runs(root)`` and ``runs.wait(...)``."""

    def __call__(self, root: Path) -> list[WandbRecords]:
        """The records of each ``offline-run-*/run-*.wandb`` under ``<root>/wandb``, by path."""
        files = sorted((Path(root) / "wandb").glob("offline-run-*/run-*.wandb"))
        return [read_wandb_run_file(path) for path in files]

    def wait(
        self, root: Path, until: Callable[[list[WandbRecords]], object], timeout: float = 60.0
    ) -> list[WandbRecords]:
        """The runs once ``until(runs)`` holds, or as they are after ``timeout`` seconds.

        ``run.finish()`` returns once the run is handed over; W&B's service writes the last
        records a moment later, more so on a loaded machine.
        """
        deadline = time.monotonic() + timeout
        while True:
            runs = self(root)
            if until(runs) or time.monotonic() > deadline:
                return runs
            time.sleep(0.2)


@pytest.fixture
def wandb_runs():
    """A :class:`WandbRuns`: the records of the offline runs under a root, and a wait for them."""
    pytest.importorskip("wandb", reason="the wandb extra is needed to read W&B run files")
    return WandbRuns()


class SmallDisk:
    """A real 4 MB tmpfs of 2048 inodes at ``path``: :meth:`fill` leaves it without a free byte,
    :meth:`fill_inodes` without a free inode (no file or folder can be made), :meth:`free` gives
    the room back."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.filler = path / ".filler"
        self.inode_fillers: list[Path] = []

    def fill_inodes(self) -> None:
        """Make empty files until the file system refuses a new one (ENOSPC)."""
        with contextlib.suppress(OSError):
            while True:
                filler = self.path / f".inode-filler-{len(self.inode_fillers)}"
                filler.touch()
                self.inode_fillers.append(filler)

    def fill(self) -> None:
        """Write a filler file until the file system refuses (ENOSPC), a page at a time at the end."""
        with self.filler.open("ab", buffering=0) as file:
            for size in (1 << 16, 1 << 12, 1 << 9, 1):
                block = b"\0" * size
                with contextlib.suppress(OSError):
                    while True:
                        file.write(block)

    def free(self) -> None:
        self.filler.unlink(missing_ok=True)
        for filler in self.inode_fillers:
            filler.unlink()
        self.inode_fillers.clear()


@pytest.fixture
def small_disk(tmp_path):
    """A :class:`SmallDisk`: a real tmpfs of 4 MB that can be filled; skips where mount is not allowed."""
    path = tmp_path / "disk"
    path.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a real full disk) needs root")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=4m,nr_inodes=2048", "tmpfs", str(path)],
        capture_output=True,
        check=False,
        timeout=30,
    )
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode(errors='replace')}")
    try:
        yield SmallDisk(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False, timeout=30)


@pytest.fixture
def make(tmp_path):
    """``make(sink, spool=None, **options)``: an AsyncDelivery to ``sink`` with quick retries,
    its spool ``<tmp>/run.spool.jsonl`` (or ``spool``); each is closed after the test."""
    from substrax.tracking._background import AsyncDelivery

    made = []

    def make(sink, spool=None, **options):
        delivery = AsyncDelivery(
            sink,
            spool_path=spool or tmp_path / "run.spool.jsonl",
            media_dir=tmp_path / "media",
            label="test",
            retry_initial=0.01,
            retry_max=0.05,
            **options,
        )
        made.append(delivery)
        return delivery

    yield make
    for delivery in made:
        if delivery._thread.is_alive():
            delivery.close(5)
