"""A process that dies after the rendezvous, before jax started everywhere: the others end, named.

The dead process is played by a real socket that meets the real process on 127.0.0.1 and then
hangs up, as the kernel does for a process that died.
"""

import os
import socket
import subprocess
import sys
import time

import pytest

from substrax.runtime import PEER_FAILURE_EXIT_CODE
from substrax.testing import free_port


PROCESS = """
import pathlib, sys
from substrax.runtime import initialize_distributed
port, rank, out = sys.argv[1], int(sys.argv[2]), pathlib.Path(sys.argv[3])
def hook(dead):
    (out / "hook.txt").write_text(",".join(map(str, dead)))
initialize_distributed(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=rank,
                       initialization_timeout=90, on_peer_failure=hook)
"""


def _env() -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_", "SLURM_"))}
    return base | {"JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}


def _start(port: int, rank: int, out) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", PROCESS, str(port), str(rank), str(out)],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _ended(proc: subprocess.Popen[str]) -> str:
    try:
        return proc.communicate(timeout=60)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def test_a_peer_dying_after_the_rendezvous_ends_process_0_naming_it(tmp_path, wall_clock):
    port = free_port()
    proc = _start(port, 0, tmp_path)
    deadline = time.monotonic() + 60
    while True:
        try:
            peer = socket.create_connection(("127.0.0.1", port), timeout=5)
            break
        except OSError:
            assert time.monotonic() < deadline
            wall_clock.sleep(0.2)
    with peer:
        peer.sendall(b"substrax-rendezvous-1 1 2\n")
        assert peer.recv(16) == b"go\n"
        wall_clock.sleep(1.0)  # process 0 is in jax.distributed.initialize, waiting for process 1
    started = time.monotonic()
    stderr = _ended(proc)  # jax alone would abort it from C++ after initialization_timeout
    assert proc.returncode == PEER_FAILURE_EXIT_CODE, stderr[-3000:]
    assert time.monotonic() - started < 30
    assert "process 1 of this 2-process jax job died while jax started" in stderr
    assert (tmp_path / "hook.txt").read_text() == "1"


@pytest.mark.usefixtures("child_processes")
def test_a_coordinator_dying_after_the_rendezvous_ends_its_peer_naming_it(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        proc = _start(port, 1, tmp_path)
        server.settimeout(60)
        conn, _ = server.accept()
        with conn:
            assert conn.recv(64).startswith(b"substrax-rendezvous-1 1 2")
            conn.sendall(b"go\n")
            time.sleep(1.0)  # process 1 is in jax.distributed.initialize
    started = time.monotonic()
    stderr = _ended(proc)
    assert proc.returncode == PEER_FAILURE_EXIT_CODE, stderr[-3000:]
    assert time.monotonic() - started < 30
    assert "process 0 of this 2-process jax job died while jax started" in stderr
    assert (tmp_path / "hook.txt").read_text() == "0"
