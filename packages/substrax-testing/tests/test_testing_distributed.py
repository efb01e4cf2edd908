import subprocess
import time

import pytest

from substrax.runtime import JaxRuntime
from substrax.testing import free_port, run_distributed


GATHER = """
import json, os
from substrax.runtime import initialize_distributed
info = initialize_distributed(initialization_timeout=60)
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils
gathered = multihost_utils.process_allgather(jnp.array([info.process_id]))
print(json.dumps({
    "devices": jax.device_count(),
    "processes": jax.process_count(),
    "gathered": gathered.ravel().tolist(),
    "tag": os.environ.get("TAG"),
}))
"""


@pytest.mark.usefixtures("child_processes")
def test_two_processes_form_one_job_and_their_json_survives_gloo():
    runs = run_distributed(
        GATHER,
        num_processes=2,
        runtime=JaxRuntime(cpu_devices=2),
        env={"TAG": "all"},
        per_process_env={1: {"TAG": "one"}},
        timeout=180,
    )
    outputs = [run.check().last_json() for run in runs]
    assert outputs == [
        {"devices": 4, "processes": 2, "gathered": [0, 1], "tag": "all"},
        {"devices": 4, "processes": 2, "gathered": [0, 1], "tag": "one"},
    ]
    assert not any(line.startswith("[Gloo]") for run in runs for line in run.stdout.splitlines())


@pytest.mark.parametrize(
    ("count", "error"), [(1, ValueError), (0, ValueError), (True, TypeError), (2.0, TypeError)]
)
def test_fewer_than_two_processes_are_refused(count, error):
    with pytest.raises(error, match=r"num_processes=.* must be an integer >= 2"):
        run_distributed("pass", num_processes=count, timeout=10)


@pytest.mark.usefixtures("child_processes")
def test_a_peer_that_never_arrives_ends_in_a_timeout_with_every_process_killed():
    program = (
        "import os, sys, time\n"
        "if os.environ['JAX_PROCESS_ID'] == '1': sys.exit(3)\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_distributed(program, num_processes=2, timeout=3)
    assert time.monotonic() - started < 30


def test_free_port_can_be_bound():
    import socket

    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
