"""The coordination service's own process: it starts on a free port and refuses a taken one."""

import socket

import pytest

from substrax.runtime._coordinator import CoordinatorProcess
from substrax.testing import free_port


def _serves(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


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


def test_a_taken_port_is_an_os_error_naming_the_address():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(OSError, match=f"did not start on {address}.*port taken"):
            CoordinatorProcess.start(
                address, num_processes=2, heartbeat_timeout=10, shutdown_timeout=10,
                grace_seconds=30,
            )  # fmt: skip
