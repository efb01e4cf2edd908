"""initialize_distributed: a no-op on one process, and a real two-process run on 127.0.0.1."""

import logging
import os
import socket
import subprocess
import sys

import pytest

from substrax.runtime import DistributedInfo, initialize_distributed
from substrax.testing import free_port, json_objects


def _last_json_line(stdout: str) -> dict:
    """The child's last JSON object (gloo prints connection notes on the same stdout)."""
    objects = json_objects(stdout)
    assert objects, f"no JSON object in the child's output: {stdout[-2000:]!r}"
    return objects[-1]


def test_single_process_is_a_no_op():
    info = initialize_distributed(env={})
    assert info == DistributedInfo(
        process_id=0, num_processes=1, coordinator=None, source="single_process"
    )


def test_local_device_ids_on_a_single_process_are_ignored_with_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="substrax.runtime"):
        info = initialize_distributed(env={}, local_device_ids=[0])
    assert info.num_processes == 1
    assert "local_device_ids=[0] is ignored: one process starts no jax.distributed" in caplog.text


def test_one_process_from_arguments_starts_nothing():
    info = initialize_distributed(num_processes=1, env={})
    assert (info.num_processes, info.source) == (1, "argument")


def test_one_node_skypilot_run_starts_nothing():
    env = {"SKYPILOT_NODE_IPS": "10.0.0.5", "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NUM_NODES": "1"}
    info = initialize_distributed(env=env)
    assert info == DistributedInfo(
        process_id=0, num_processes=1, coordinator="10.0.0.5:8476", source="skypilot"
    )


def test_a_modal_container_outside_a_cluster_is_one_process():
    # Inside Modal but not clustered: the SDK reports no cluster context.
    assert initialize_distributed(env={"MODAL_TASK_ID": "ta-1"}).source == "single_process"


@pytest.mark.parametrize("timeout", [0, -5])
def test_timeout_must_be_positive(timeout):
    with pytest.raises(ValueError, match="initialization_timeout"):
        initialize_distributed(env={}, initialization_timeout=timeout)


@pytest.mark.parametrize("timeout", [1.5, True, "30"])
def test_timeout_must_be_whole_seconds(timeout):
    with pytest.raises(TypeError, match="initialization_timeout"):
        initialize_distributed(env={}, initialization_timeout=timeout)


def test_partial_arguments_are_refused():
    with pytest.raises(ValueError, match="num_processes is required"):
        initialize_distributed(coordinator_address="10.0.0.1:1", env={})
    with pytest.raises(ValueError, match="coordinator_address, num_processes and process_id"):
        initialize_distributed(num_processes=2, process_id=0, env={})


def test_loopback_coordinator_on_several_nodes_is_refused_before_jax_starts():
    env = {"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2", "SKYPILOT_NODE_RANK": "0"}
    with pytest.raises(ValueError, match="loopback"):
        initialize_distributed(
            coordinator_address="127.0.0.1:1234", num_processes=2, process_id=0, env=env
        )


PROGRAM = """
import json, sys
from substrax.runtime import initialize_distributed
port, mode, rank = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "arguments":
    info = initialize_distributed(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                                  process_id=rank, initialization_timeout=60)
else:
    info = initialize_distributed(initialization_timeout=60)  # launcher variables
again = other = None
if mode == "arguments":
    again = initialize_distributed(coordinator_address=f"127.0.0.1:{port}", num_processes=2,
                                   process_id=rank).coordinator  # the same run: a no-op
    try:  # another run's coordinator: refused, not taken as joined
        initialize_distributed(coordinator_address="127.0.0.1:1", num_processes=2,
                               process_id=rank)
    except Exception as error:
        other = f"{type(error).__name__}: {error}"
import jax
import jax.numpy as jnp
from jax.experimental import multihost_utils
gathered = multihost_utils.process_allgather(jnp.array([info.process_id]))
print(json.dumps({
    "info": [info.process_id, info.num_processes, info.coordinator, info.source],
    "again": again, "other": other,
    "devices": jax.device_count(), "local": jax.local_device_count(),
    "processes": jax.process_count(), "gathered": gathered.ravel().tolist(),
}))
"""


def _base_env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "SLURM_"))}
    return base | {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}


def _run_pair(port: int, launches: list[tuple[int, str, dict[str, str]]]) -> list[dict]:
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROGRAM, str(port), mode, str(rank)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, mode, env in launches
    ]
    outputs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode == 0, stderr[-4000:]
            outputs.append(_last_json_line(stdout) | {"stderr": stderr})
    finally:
        for proc in procs:  # a failed check leaves the others running or their pipes open
            if proc.poll() is None:
                proc.kill()
            proc.communicate()
    for out in outputs:
        assert (out["devices"], out["local"], out["processes"]) == (4, 2, 2)
        assert out["gathered"] == [0, 1]
    # nothing serves the coordinator's port once the job ended (its child process was stopped)
    with (
        pytest.raises(ConnectionRefusedError),
        socket.create_connection(("127.0.0.1", port), timeout=2),
    ):
        pass
    return outputs


@pytest.mark.usefixtures("child_processes")
def test_two_local_processes_form_one_four_device_view():
    port = free_port()
    base = _base_env()
    launcher_env = base | {
        "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": "1",
    }
    # Process 0 takes explicit arguments; process 1 reads the launcher's JAX_* variables.
    outputs = _run_pair(port, [(0, "arguments", base), (1, "environment", launcher_env)])
    coordinator = f"127.0.0.1:{port}"
    assert outputs[0]["info"] == [0, 2, coordinator, "argument"]
    assert outputs[1]["info"] == [1, 2, coordinator, "jax_env"]
    assert outputs[0]["again"] == coordinator  # initialized again with the same run: a no-op
    assert outputs[0]["other"] == (  # with another run's coordinator: refused
        f"RuntimeConfigurationError: jax.distributed is already initialized with coordinator "
        f"{coordinator}, not 127.0.0.1:1; a process joins one run"
    )
    # the job's service runs in a child process, whose log is not shown: no warning about
    # jax's experimental recoverable mode on every start
    assert not any("recoverable task feature" in out["stderr"] for out in outputs)


def _slurm_job_id() -> int:
    # jax's SLURM detection listens on 61440 + job_id % 4096 (above Linux's ephemeral range):
    # pick a job id whose port is free now.
    for offset in range(4096):
        port = 61440 + (os.getpid() + offset) % 4096
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port - 61440
    raise AssertionError("no free port in 61440-65535 for the SLURM run")


@pytest.mark.usefixtures("child_processes")
def test_two_slurm_tasks_on_one_node_let_jax_find_the_coordinator():
    job_id = _slurm_job_id()
    base = _base_env() | {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_STEP_NODELIST": "127.0.0.1",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_NTASKS": "2",
    }
    outputs = _run_pair(
        61440 + job_id,
        [
            (rank, "environment", base | {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank)})
            for rank in (0, 1)
        ],
    )
    assert [out["info"] for out in outputs] == [[0, 2, None, "slurm"], [1, 2, None, "slurm"]]


def test_modal_cluster_context_is_read_through_the_sdk(monkeypatch):
    # The SDK fills this context when a clustered function's container starts.
    from modal import _cluster

    from substrax.runtime._launchers import modal_cluster_launch

    context = _cluster.ClusterContext(
        rank=0,
        cluster_id="cl-1",
        container_ips=["fd00::7"],
        container_ipv4_ips=["10.2.0.7"],
        fabric_ids=[],
    )
    monkeypatch.setattr(_cluster, "current_cluster_context", context)
    info = initialize_distributed(env={"MODAL_TASK_ID": "ta-1"})
    assert info == DistributedInfo(
        process_id=0, num_processes=1, coordinator="10.2.0.7:8476", source="modal"
    )
    two = _cluster.ClusterContext(
        rank=1,
        cluster_id="cl-2",
        container_ips=["fd00::1", "fd00::2"],
        container_ipv4_ips=[],
        fabric_ids=[],
    )
    monkeypatch.setattr(_cluster, "current_cluster_context", two)
    launch = modal_cluster_launch({"MODAL_TASK_ID": "ta-2"}, 9000)
    assert launch is not None
    assert (launch.coordinator_address, launch.process_id, launch.num_processes) == (
        "[fd00::1]:9000",
        1,
        2,
    )
    assert modal_cluster_launch({}, 9000) is None  # not inside Modal: the SDK is not consulted


WATCHED = """
import logging, os, pathlib, signal, sys, time
from substrax.runtime import initialize_distributed
port, rank, out, victim = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3]), int(sys.argv[4])
survivor_raises = sys.argv[5].startswith("raise")
handler = logging.FileHandler(out / f"log-{rank}.txt")
logging.getLogger("substrax").addHandler(handler)
def hook(dead):
    if sys.argv[5] == "raise-slow-hook":
        time.sleep(7)  # past the 6.5 s a failed process lingers at exit with heartbeat_timeout=3
    (out / f"hook-{rank}.txt").write_text(",".join(map(str, dead)))
initialize_distributed(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                       initialization_timeout=60, heartbeat_timeout=3, on_peer_failure=hook)
import jax
if rank == victim:
    os.kill(os.getpid(), signal.SIGKILL)
if survivor_raises:
    # as when a collective fails on the dead peer's closed connection: the survivor lingers at
    # exit (the interpreter finalizing, where no thread can start) until the watch ends it
    raise RuntimeError("Connection closed by peer")
time.sleep(120)  # the survivor waits here, outside any collective, until the watch ends it
"""


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize(
    ("victim", "mode"),
    [(1, "wait"), (0, "wait"), (1, "raise"), (0, "raise"), (1, "raise-slow-hook")],
)
@pytest.mark.usefixtures("child_processes")
def test_a_dead_peer_ends_the_survivor_through_its_hook_and_flushed_logs(tmp_path, victim, mode):
    from substrax.runtime import PEER_FAILURE_EXIT_CODE

    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WATCHED, str(port), str(rank), str(tmp_path), str(victim), mode],
            env=_base_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    survivor = 1 - victim
    try:
        _, stderr = procs[survivor].communicate(timeout=60)
        procs[victim].communicate(timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert procs[victim].returncode == -9
    assert procs[survivor].returncode == PEER_FAILURE_EXIT_CODE, stderr[-3000:]
    message = f"process {victim} of this 2-process jax job died"
    assert message in stderr
    assert (tmp_path / f"hook-{survivor}.txt").read_text() == str(victim)
    assert message in (tmp_path / f"log-{survivor}.txt").read_text()
