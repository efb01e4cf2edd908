"""A minimal MLflow tracking server on 127.0.0.1 that can vanish: a real HTTP server answering
the REST calls a run needs (experiment and run creation, log-batch, update), keeping what it
is sent in memory.

``VanishingMlflow(port, vanish_after_run=...)``: after answering ``runs/create`` it stops,
either ``"refuse"`` (the socket is closed: connections are refused) or ``"silent"`` (the socket
stays open but nothing is accepted or answered: requests hang until their timeout).
Used by the tracking tests' conftest and by tests-integration/test_faults_tracking.py.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _found(key: str, value: dict[str, Any] | None) -> tuple[int, dict[str, Any]]:
    """200 with ``{key: value}``, or MLflow's 404 answer when there is no such ``key``."""
    if value is None:
        return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": f"no such {key}"}
    return 200, {key: value}


class VanishingMlflow:
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
        # checks for shutdown every 50 ms, not the standard 0.5 s each test's teardown would wait
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.thread.start()

    def handle(self, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:  # noqa: PLR0911  (one answer per endpoint)
        endpoint = path.removeprefix("/api/2.0/mlflow/")
        with self.lock:
            if endpoint == "experiments/get-by-name":
                return _found("experiment", self.experiments.get(body.get("experiment_name", "")))
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
                return _found("run", self.runs.get(body.get("run_id", "")))
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
