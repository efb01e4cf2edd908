"""Faults of a multi-process job, with real processes on 127.0.0.1: nothing aborts, nothing stalls.

- a coordinator nobody serves, or peers that never come: a Python ``DistributedStartupError``
  naming the address (and who arrived), within the timeout plus a few seconds; never jax's C++
  abort;
- a process SIGKILLed while the job trains: its peer ends within 30 s, naming the dead process
  and with its logs flushed, instead of aborting from C++ after jax's 100 s heartbeat timeout;
  process 0 too, whose death jax alone answers with an immediate C++ abort of the others (the
  coordination service it hosted outlives it, in a child process that ends soon after);
- the local backend's multi-node job with a failing node: the other node is stopped and the
  job's manifest names the node that failed.
"""

import json
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from substrax.compute import MANIFEST_NAME, JobSpec, LocalBackend, RunState, Task, read_manifest
from substrax.runtime import PEER_FAILURE_EXIT_CODE, JaxRuntime, child_environment
from substrax.testing import free_port, run_distributed
from substrax.testing.compute import wait_until_final


STARTUP = textwrap.dedent(
    """
    import json, sys, time
    from substrax.runtime import DistributedStartupError, initialize_distributed
    address, rank, processes, timeout = sys.argv[1], *map(int, sys.argv[2:5])
    started = time.monotonic()
    try:
        initialize_distributed(coordinator_address=address, num_processes=processes,
                               process_id=rank, initialization_timeout=timeout)
    except DistributedStartupError as error:
        print(json.dumps({"seconds": time.monotonic() - started, "message": str(error),
                          "address": error.coordinator_address, "arrived": error.arrived,
                          "timeout_error": isinstance(error, TimeoutError)}))
    """
)


# short, as nobody is ever coming: the test waits it out
STARTUP_TIMEOUT = 1
# the startup's timeout, not jax's own 300 s: the span includes importing jax, which takes
# seconds more on a loaded machine (10.2 s was seen on 2 busy cores with a 5 s timeout)
BOUNDED = STARTUP_TIMEOUT + 25


def _startup(address: str, rank: int, processes: int) -> dict:
    env = child_environment(JaxRuntime(platforms=("cpu",)), {})
    result = subprocess.run(
        [sys.executable, "-c", STARTUP, address, str(rank), str(processes), str(STARTUP_TIMEOUT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-3000:]}"
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_dead_coordinator_is_a_python_exception_naming_the_address():
    address = f"127.0.0.1:{free_port()}"
    seen = _startup(address, rank=1, processes=2)
    assert seen["seconds"] < BOUNDED
    assert (seen["address"], seen["arrived"], seen["timeout_error"]) == (address, None, True)
    assert address in seen["message"]


def test_a_coordinator_whose_peers_never_come_names_who_arrived():
    address = f"127.0.0.1:{free_port()}"
    seen = _startup(address, rank=0, processes=3)
    assert seen["seconds"] < BOUNDED
    assert seen["arrived"] == [0]
    assert "1 of 3 processes arrived" in seen["message"]


TRAINING = textwrap.dedent(
    """
    import logging, os, pathlib, signal, sys, time
    import numpy as np
    from substrax.runtime import initialize_distributed
    out, victim = pathlib.Path(sys.argv[1]), int(sys.argv[2])
    info = initialize_distributed(initialization_timeout=60)  # the launcher's JAX_* variables
    (out / "coordinator").write_text(os.environ["JAX_COORDINATOR_ADDRESS"])
    handler = logging.FileHandler(out / f"log-{info.process_id}.txt", delay=True)
    logging.getLogger("substrax").addHandler(handler)
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    sharding = NamedSharding(mesh, P("data"))
    step = jax.jit(lambda w, x: w - 0.1 * (w - x.mean()))
    w = 0.0
    for i in range(100_000):
        local = np.full((jax.local_device_count(),), float(i), np.float32)
        w = float(step(w, jax.make_array_from_process_local_data(sharding, local)))
        if i == 5 and info.process_id == victim:
            (out / "killed-at").write_text(str(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)
    """
)


def _train_and_kill(out: Path, victim: int) -> float:
    """Two processes train together until ``victim`` SIGKILLs itself; the other must end in 30 s."""
    runs = run_distributed(
        TRAINING,
        str(out),
        str(victim),
        num_processes=2,
        runtime=JaxRuntime(platforms=("cpu",), cpu_devices=2),
        timeout=120,
    )
    ended = time.time()
    survivor = runs[1 - victim]
    assert runs[victim].returncode == -9, runs[victim].stderr[-3000:]
    assert survivor.returncode == PEER_FAILURE_EXIT_CODE, survivor.stderr[-3000:]
    killed_at = float((out / "killed-at").read_text())
    # both processes are waited for: the survivor ended no later than ``ended``
    assert ended - killed_at < 30
    message = f"process {victim} of this 2-process jax job died"
    assert message in survivor.stderr
    # the file handler was flushed
    assert message in (out / f"log-{1 - victim}.txt").read_text()
    assert "Terminating process because the JAX distributed service" not in survivor.stderr
    return ended


def _serves(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def test_a_killed_process_ends_its_peer_within_30_seconds_naming_it(tmp_path):
    _train_and_kill(tmp_path, victim=1)


def test_a_killed_process_0_ends_its_peer_within_30_seconds_naming_it(tmp_path):
    ended = _train_and_kill(tmp_path, victim=0)
    # the coordination service outlived process 0 in a child process, which ends soon after:
    # at most its grace period (1.5 heartbeat timeouts, the hook's 10 s and a few seconds) after
    # process 0 died; on Linux, once no client is connected any more
    address = (tmp_path / "coordinator").read_text()
    killed_at = float((tmp_path / "killed-at").read_text())
    while _serves(address) and time.time() - killed_at < 60:
        time.sleep(0.5)
    assert not _serves(address)
    if Path("/proc/net/tcp").exists():
        assert time.time() - ended < 10


NODE = textwrap.dedent(
    """
    import time
    import numpy as np
    from substrax.runtime import initialize_distributed
    info = initialize_distributed(initialization_timeout=60, heartbeat_timeout=3)
    import jax
    from jax.experimental import multihost_utils
    for i in range(100_000):
        multihost_utils.process_allgather(np.float32(i))
        if i == 3 and info.process_id == 1:
            raise RuntimeError("node 1 fails")  # its task fails, then its worker exits non-zero
        time.sleep(0.05)
    """
)


def _two_node_job(tmp_path: Path, program: str) -> Path:
    """Run ``program`` as a two-node job of the local backend; its fetched outputs' directory."""
    (tmp_path / "node.py").write_text(program)
    spec = JobSpec(
        name="faulty",
        tasks=(Task(name="train", argv=("python", "node.py"), timeout_seconds=300),),
        nodes=2,
        probe_devices=False,
        timeout_seconds=300,
        runtime={"platforms": ["cpu"], "cpu_devices": 2},
    )
    backend = LocalBackend({"state_dir": str(tmp_path / "state")})
    handle = backend.submit(spec, project=tmp_path)
    state = wait_until_final(backend, handle, 90)
    assert state is RunState.FAILED
    return backend.fetch(handle, tmp_path / "fetched")


def test_a_failing_node_of_a_local_job_stops_the_other_and_is_named(tmp_path: Path):
    fetched = _two_node_job(tmp_path, NODE)
    manifest = read_manifest(fetched / MANIFEST_NAME)
    assert (manifest.failed_node, manifest.failed_node_status) == (1, 1)
    assert not manifest.succeeded
    node_1 = read_manifest(fetched / "nodes" / "1" / MANIFEST_NAME)
    # node 1's process can still be shutting jax down when node 0 (status 75) stops it
    assert [(t.status, t.returncode) for t in node_1.tasks] in ([("failed", 1)], [("cancelled", 1)])
    assert "node 1 failed (exit status 1)" in (fetched / "worker.log").read_text()


KILLED_NODE = textwrap.dedent(
    """
    import os, signal, time
    import numpy as np
    from substrax.runtime import initialize_distributed
    info = initialize_distributed(
        initialization_timeout=60,
        heartbeat_timeout=3,  # the hook, not the default's timing, is what these tests check
        on_peer_failure=lambda dead: print("hook", dead, flush=True),
    )
    import jax
    from jax.experimental import multihost_utils
    for i in range(100_000):
        multihost_utils.process_allgather(np.float32(i))
        if i == 3 and info.process_id == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.05)
    """
)


def test_a_killed_node_of_a_local_job_ends_the_other_through_its_hook_despite_sigterm(
    tmp_path: Path,
):
    # node 0's collective fails on the dead peer's closed connection, so it lingers at exit;
    # the backend then sends it SIGTERM (which jax's preemption notifier catches) and SIGKILL
    # after its grace: its peer watch must run the hook and end it with status 75 before that
    fetched = _two_node_job(tmp_path, KILLED_NODE)
    manifest = read_manifest(fetched / MANIFEST_NAME)
    assert manifest.failed_node == 1
    assert [t.returncode for t in manifest.tasks] == [PEER_FAILURE_EXIT_CODE]
    assert "hook (1,)" in (fetched / "train" / "stdout.log").read_text()


@pytest.fixture(autouse=True)
def _bounded():
    """Each of these tests ends well within a minute or two; the suite's own timeout backs it."""
    started = time.monotonic()
    yield
    assert time.monotonic() - started < 120
