"""The bounded meeting before jax starts: real sockets on 127.0.0.1, threads as the peers."""

import pickle
import socket
import threading
import time

import pytest

from substrax.runtime import CoordinatorPortError, DistributedStartupError, initialize_distributed
from substrax.runtime._rendezvous import gather_peers, join_coordinator, split_address
from substrax.testing import free_port


def _in_thread(target, *args, **kwargs):
    """Run ``target`` on a thread; the returned dict gets ``result`` or ``error``."""
    outcome: dict[str, object] = {}

    def run():
        try:
            outcome["result"] = target(*args, **kwargs)
        except Exception as error:
            outcome["error"] = error

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def test_address_splits_into_host_and_port():
    assert split_address("127.0.0.1:8476") == ("127.0.0.1", 8476)
    assert split_address("[fd00::1]:9000") == ("fd00::1", 9000)


def test_every_peer_arriving_lets_everyone_go(wall_clock):
    address = f"127.0.0.1:{free_port()}"
    peers = [
        _in_thread(join_coordinator, address, process_id=p, num_processes=3, timeout=20)
        for p in (2, 1)  # peers may come first: they retry until the coordinator listens
    ]
    wall_clock.sleep(0.5)
    gather_peers(address, num_processes=3, timeout=20)
    for thread, outcome in peers:
        thread.join(timeout=20)
        assert outcome == {"result": None}


def test_a_peer_with_no_coordinator_raises_naming_the_address_within_its_timeout():
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(DistributedStartupError) as caught:
        join_coordinator(address, process_id=1, num_processes=2, timeout=2)
    assert time.monotonic() - started < 2 + 3
    error = caught.value
    assert isinstance(error, TimeoutError)
    assert (error.coordinator_address, error.process_id, error.arrived, error.reached) == (
        address,
        1,
        None,
        False,
    )
    assert address in str(error)
    assert "could not reach" in str(error)


def test_a_coordinator_host_that_does_not_resolve_is_named_at_once_on_process_0():
    # process 0 listened on every interface, waited out the timeout, then blamed the peers
    address = f"no-such-host.invalid:{free_port()}"
    match = r"address 'no-such-host.invalid:\d+' names host 'no-such-host.invalid', which does not"
    with pytest.raises(ValueError, match=match):
        gather_peers(address, num_processes=2, timeout=30)
    with pytest.raises(ValueError, match="routable hostname or IP address"):
        initialize_distributed(
            coordinator_address=address,
            num_processes=2,
            process_id=0,
            initialization_timeout=30,
            env={},
        )


def test_the_coordinator_names_who_arrived_and_tells_the_peers_that_did():
    address = f"127.0.0.1:{free_port()}"
    thread, outcome = _in_thread(
        join_coordinator, address, process_id=2, num_processes=4, timeout=30
    )
    started = time.monotonic()
    with pytest.raises(DistributedStartupError) as caught:
        gather_peers(address, num_processes=4, timeout=2)
    assert time.monotonic() - started < 2 + 3
    assert (caught.value.arrived, caught.value.missing) == ((0, 2), (1, 3))
    assert "2 of 4 processes arrived" in str(caught.value)
    thread.join(timeout=10)
    peer_error = outcome["error"]
    assert isinstance(peer_error, DistributedStartupError)
    assert (peer_error.process_id, peer_error.arrived) == (2, (0, 2))


def test_strangers_on_the_port_are_dropped_and_do_not_count(wall_clock):
    address = f"127.0.0.1:{free_port()}"
    host, port = split_address(address)
    thread, outcome = _in_thread(gather_peers, address, num_processes=2, timeout=20)
    wall_clock.sleep(0.3)
    with socket.create_connection((host, port), timeout=5) as stranger:
        stranger.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")  # what a plain jax client sends
        assert stranger.recv(16) == b""  # dropped
    with socket.create_connection((host, port), timeout=5) as liar:
        liar.sendall(b"substrax-rendezvous-1 1 3\n")  # a peer of another job size
        assert liar.recv(16) == b"refuse 2\n"  # refused, told the coordinator's count
    assert thread.is_alive()
    join_coordinator(address, process_id=1, num_processes=2, timeout=20)
    thread.join(timeout=10)
    assert outcome == {"result": None}


def test_a_peer_started_with_another_process_count_is_refused_and_both_raise():
    address = f"127.0.0.1:{free_port()}"
    thread, outcome = _in_thread(gather_peers, address, num_processes=2, timeout=3)
    started = time.monotonic()
    with pytest.raises(DistributedStartupError) as caught:
        join_coordinator(address, process_id=1, num_processes=3, timeout=20)
    assert time.monotonic() - started < 3  # at once, not at the coordinator's deadline
    error = caught.value
    assert (error.num_processes, error.coordinator_num_processes) == (3, 2)
    assert "expects 2 processes, not 3" in str(error)
    thread.join(timeout=10)
    coordinator_error = outcome["error"]
    assert isinstance(coordinator_error, DistributedStartupError)
    assert (coordinator_error.refused, coordinator_error.missing) == (((1, 3),), ())
    assert "refused process 1 (started with num_processes=3)" in str(coordinator_error)
    assert "missing" not in str(coordinator_error)


def test_a_second_peer_with_a_taken_process_id_is_refused(wall_clock):
    address = f"127.0.0.1:{free_port()}"
    thread, outcome = _in_thread(gather_peers, address, num_processes=3, timeout=20)
    first, first_outcome = _in_thread(
        join_coordinator, address, process_id=1, num_processes=3, timeout=20
    )
    wall_clock.sleep(1.0)  # the first process 1 arrived
    with pytest.raises(DistributedStartupError, match="another process has process id 1"):
        join_coordinator(address, process_id=1, num_processes=3, timeout=20)
    join_coordinator(address, process_id=2, num_processes=3, timeout=20)
    for waited in (thread, first):
        waited.join(timeout=10)
    assert outcome == first_outcome == {"result": None}


def test_the_coordinator_names_a_process_id_started_twice(wall_clock):
    # hostile finding: its error said "missing (2,)" alone, and error.refused was empty
    address = f"127.0.0.1:{free_port()}"
    thread, outcome = _in_thread(gather_peers, address, num_processes=3, timeout=3)
    first, _ = _in_thread(join_coordinator, address, process_id=1, num_processes=3, timeout=5)
    wall_clock.sleep(1.0)  # the first process 1 arrived
    with pytest.raises(DistributedStartupError, match="another process has process id 1"):
        join_coordinator(address, process_id=1, num_processes=3, timeout=5)
    for waited in (thread, first):
        waited.join(timeout=10)
    error = outcome["error"]
    assert isinstance(error, DistributedStartupError)
    assert (error.duplicated, error.missing) == ((1,), (2,))
    assert "arrived (0, 1), refused a second process with id 1, missing (2,)" in str(error)


def test_a_plain_jax_coordinator_hands_the_peer_over_to_jax():
    import jaxlib._jax

    port = free_port()
    service = jaxlib._jax.get_distributed_runtime_service(
        f"127.0.0.1:{port}", 2, heartbeat_timeout=10, shutdown_timeout=10
    )
    try:
        join_coordinator(f"127.0.0.1:{port}", process_id=1, num_processes=2, timeout=10)
    finally:
        service.shutdown()


@pytest.mark.parametrize("answer", [b"HTTP/1.1 400 Bad Request\r\n\r\n", b"", b"\x00\x00"])
def test_something_else_on_the_port_is_named_instead_of_handing_over_to_jax(answer):
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]

        def answer_once():
            conn, _ = server.accept()
            with conn:
                conn.recv(64)
                conn.sendall(answer)

        thread = threading.Thread(target=answer_once, daemon=True)
        thread.start()
        with pytest.raises(DistributedStartupError, match="something else than a coordinator") as c:
            join_coordinator(f"127.0.0.1:{port}", process_id=1, num_processes=2, timeout=10)
        thread.join(timeout=10)
    assert c.value.foreign


def test_initialize_distributed_raises_instead_of_aborting_on_a_dead_coordinator():
    address = f"127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(DistributedStartupError, match=address):
        initialize_distributed(
            coordinator_address=address, num_processes=2, process_id=1, initialization_timeout=2
        )
    assert time.monotonic() - started < 2 + 5


@pytest.mark.parametrize(
    ("name", "value", "error"),
    [("heartbeat_timeout", 0, ValueError), ("shutdown_timeout", 2.5, TypeError)],
)
def test_heartbeat_and_shutdown_timeouts_are_whole_positive_seconds(name, value, error):
    with pytest.raises(error, match=name):
        initialize_distributed(env={}, **{name: value})


def test_the_error_survives_pickling_with_its_attributes():
    error = DistributedStartupError(
        "10.0.0.1:1", process_id=1, num_processes=3, arrived=None, timeout=5, reached=True
    )
    copy = pickle.loads(pickle.dumps(error))  # noqa: S301 - our own bytes
    assert (copy.coordinator_address, copy.arrived, copy.reached, str(copy)) == (
        "10.0.0.1:1",
        None,
        True,
        str(error),
    )
    assert "did not gather within 5 s" in str(copy)


def test_a_taken_coordinator_port_is_named():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(CoordinatorPortError, match=f"coordinator's port {port}") as info:
            gather_peers(f"127.0.0.1:{port}", num_processes=2, timeout=1)
    assert isinstance(info.value, OSError)
    assert info.value.errno is not None
