"""The coordination service's own process: it starts on a free port, refuses a taken one, and
ends once process 0 stopped it, or once process 0 is gone and no client is left."""

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from substrax.runtime import CoordinatorPortError
from substrax.runtime._coordinator import CoordinatorProcess
from substrax.testing import free_port


def _serves(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


@pytest.mark.usefixtures("child_processes")
def test_the_service_listens_once_started_and_is_gone_once_stopped():
    port = free_port()
    coordinator = CoordinatorProcess.start(
        f"127.0.0.1:{port}",
        num_processes=2,
        heartbeat_timeout=10,
        shutdown_timeout=10,
        grace_seconds=30,
    )
    assert _serves(port)
    coordinator.stop()
    assert not _serves(port)


@pytest.mark.usefixtures("child_processes")
def test_a_taken_port_is_an_os_error_naming_the_address():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(
            CoordinatorPortError, match=f"did not start on {address}.*port taken"
        ) as info:
            CoordinatorProcess.start(
                address, num_processes=2, heartbeat_timeout=10, shutdown_timeout=10,
                grace_seconds=30,
            )  # fmt: skip
    assert isinstance(info.value, OSError)
    assert info.value.address == address


ORPHAN = """
import os, sys
from substrax.runtime._coordinator import CoordinatorProcess
CoordinatorProcess.start(sys.argv[1], num_processes=2, heartbeat_timeout=10, shutdown_timeout=10,
                         grace_seconds=60)
os._exit(0)  # process 0 is gone without stopping its service
"""


def _wait_until_free(port: int, seconds: float) -> float:
    started = time.monotonic()
    while _serves(port) and time.monotonic() - started < seconds:
        time.sleep(1.0)
    return time.monotonic() - started


@pytest.mark.skipif(
    not Path("/proc/net/tcp").exists(), reason="needs Linux's socket tables (/proc/net/tcp)"
)
@pytest.mark.usefixtures("child_processes")
def test_an_orphaned_service_serves_its_clients_then_ends_before_its_grace():
    port = free_port()
    subprocess.run([sys.executable, "-c", ORPHAN, f"127.0.0.1:{port}"], check=True, timeout=60)
    with socket.create_connection(("127.0.0.1", port), timeout=5):  # a client still connected
        time.sleep(4)
        assert _serves(port)
    assert _wait_until_free(port, 30) < 20  # well before the 60 s grace
