"""A bounded meeting of a job's processes on the coordinator's port, before jax waits on its own.

jax's own wait for the coordinator and for the peers ends in a C++ abort. Before handing over to
jax, process 0 listens on the coordinator's port and counts the peers that say hello; every other
process connects (retrying until the timeout), says hello and waits for the coordinator's verdict:
``go`` once every peer arrived, or ``fail <ids>`` naming those that did. Either side raises
``DistributedStartupError`` on a timeout, so the job fails as a Python exception that names the
address and who arrived. Process 0 then closes the port and jax's coordination service binds it.
A hello with another process count, or with a process id that is out of range or taken, gets
``refuse <count>`` at once (the coordinator's count), and that peer raises.

A peer that finds jax's coordination service on the port (a coordinator started by plain
``jax.distributed.initialize``: a gRPC server, which opens with an HTTP/2 SETTINGS frame) hands
over to jax at once; anything else answering there is an error.
"""

import contextlib
import selectors
import socket
import time

from ._errors import CoordinatorPortError, DistributedStartupError


_HELLO = "substrax-rendezvous-1"
_GO = b"go\n"
_FAIL = b"fail"
_REFUSE = b"refuse"
_RETRY_SECONDS = 0.2
_LINE_LIMIT = 256
_FRAME_HEADER = 9  # bytes of an HTTP/2 frame header: length (3), type, flags, stream id (4)
_SETTINGS = 4  # the HTTP/2 frame type a gRPC server sends first


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as a host and a port number.

    Example:
        >>> from substrax.runtime._rendezvous import split_address
        >>> split_address("[::1]:8476")
        ('::1', 8476)
    """
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def _listener(address: str) -> socket.socket:
    port = split_address(address)[1]
    try:
        if socket.has_dualstack_ipv6():
            return socket.create_server(("", port), family=socket.AF_INET6, dualstack_ipv6=True)
        return socket.create_server(("", port))
    except OSError as error:
        raise CoordinatorPortError(
            address,
            f"cannot listen on the coordinator's port {port} ({address}): {error.strerror}",
            error.errno,
        ) from error


def _check_resolves(address: str) -> None:
    """Refuse a coordinator host that does not resolve, before process 0 waits for anyone.

    Process 0 listens on every interface, so it would wait out the timeout and then blame the
    peers that could not reach it.
    """
    host, port = split_address(address)
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as error:
        raise ValueError(
            f"the coordinator address {address!r} names host {host!r}, which does not resolve "
            f"here ({error.strerror}), so the other processes could not reach process 0; name "
            "process 0's routable hostname or IP address"
        ) from None


def gather_peers(
    address: str,
    *,
    num_processes: int,
    timeout: float,
    keep: dict[int, socket.socket] | None = None,
) -> None:
    """On process 0: wait on ``address``'s port until processes 1..N-1 said hello, then let them go.

    Once they all came, their connections go into ``keep`` (by process id), left open, where
    given: a ``StartupGuard`` watches them while jax starts.

    Raises:
        DistributedStartupError: Not every peer arrived within ``timeout`` (the peers that did
            are told who arrived and raise too).
        CoordinatorPortError: The port cannot be bound (an ``OSError``: something else listens
            there).
        ValueError: The address's host does not resolve, so no peer could reach it.
    """
    deadline = time.monotonic() + timeout
    _check_resolves(address)
    arrived: dict[int, socket.socket] = {}
    refused: dict[int, int] = {}  # process id -> the process count it was started with
    twice: set[int] = set()  # process ids a second process was started with
    buffers: dict[socket.socket, bytes] = {}
    with _listener(address) as server, selectors.DefaultSelector() as selector:
        server.setblocking(False)
        selector.register(server, selectors.EVENT_READ)
        try:
            while len(arrived) < num_processes - 1:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in selector.select(timeout=left):
                    sock = key.fileobj
                    if not isinstance(sock, socket.socket):  # pragma: no cover - sockets only
                        continue
                    if sock is server:
                        with contextlib.suppress(BlockingIOError):
                            conn, _ = server.accept()
                            conn.setblocking(False)
                            buffers[conn] = b""
                            selector.register(conn, selectors.EVENT_READ)
                        continue
                    line = _read_hello(sock, buffers)
                    if line is None:
                        continue
                    selector.unregister(sock)
                    buffers.pop(sock, None)
                    _admit(sock, line, num_processes, arrived, refused=refused, twice=twice)
            ids = (0, *sorted(arrived))
            verdict = _GO if len(ids) == num_processes else _FAIL + _ids(ids)
            told = (*arrived.values(), *(() if verdict == _GO else buffers))
            for sock in told:  # a failed job tells a peer whose hello was not read yet too
                with contextlib.suppress(OSError):
                    sock.setblocking(True)
                    sock.settimeout(1.0)
                    sock.sendall(verdict)
            if keep is not None and verdict == _GO:
                keep.update(arrived)
                arrived.clear()
        finally:
            for sock in (*arrived.values(), *buffers):
                sock.close()
    if len(ids) < num_processes:
        raise DistributedStartupError(
            address,
            process_id=0,
            num_processes=num_processes,
            arrived=ids,
            timeout=timeout,
            refused=tuple(sorted((p, n) for p, n in refused.items() if p not in arrived)),
            duplicated=tuple(sorted(twice)),
        )


def _admit(
    sock: socket.socket,
    line: bytes,
    num_processes: int,
    arrived: dict[int, socket.socket],
    *,
    refused: dict[int, int],
    twice: set[int],
) -> None:
    """Count the peer that sent ``line`` as arrived, or refuse it (a stranger is dropped)."""
    hello = _parse_hello(line)
    if hello is None:
        sock.close()
        return
    peer, count = hello
    if count == num_processes and 0 < peer < num_processes and peer not in arrived:
        arrived[peer] = sock
        return
    if count != num_processes:
        refused[peer] = count
    elif peer in arrived or peer == 0:
        twice.add(peer)
    with sock, contextlib.suppress(OSError):
        sock.sendall(_REFUSE + f" {num_processes}\n".encode())


def _ids(ids: tuple[int, ...]) -> bytes:
    return (" " + ",".join(str(p) for p in ids) + "\n").encode()


def _read_hello(sock: socket.socket, buffers: dict[socket.socket, bytes]) -> bytes | None:
    """The first line ``sock`` sent once complete (or all it sent before hanging up), else ``None``."""
    try:
        chunk = sock.recv(_LINE_LIMIT)
    except BlockingIOError:
        return None
    except OSError:
        chunk = b""
    buffers[sock] += chunk
    line, newline, _ = buffers[sock].partition(b"\n")
    if chunk and not newline and len(buffers[sock]) < _LINE_LIMIT:
        return None
    return line


def _parse_hello(line: bytes) -> tuple[int, int] | None:
    """A peer's ``(process id, process count)``; ``None`` when ``line`` is no hello."""
    words = line.decode(errors="replace").split()
    if (
        len(words) == 3  # noqa: PLR2004 - hello, process id, process count
        and words[0] == _HELLO
        and words[1].isdigit()
        and words[2].isdigit()
    ):
        return int(words[1]), int(words[2])
    return None


def join_coordinator(
    address: str,
    *,
    process_id: int,
    num_processes: int,
    timeout: float,
    keep: dict[int, socket.socket] | None = None,
) -> None:
    """On a process other than 0: reach the coordinator and wait until every process arrived.

    Once it said go, the connection goes into ``keep`` (as process 0's), left open, where given.

    Raises:
        DistributedStartupError: The coordinator did not answer within ``timeout``, it gave up
            waiting for the other peers, it refused this process (another process count, or a
            process id another process has), or something else answers on its port.
    """
    deadline = time.monotonic() + timeout
    host, port = split_address(address)
    sock = _connect(host, port, deadline)
    if sock is None:
        raise DistributedStartupError(
            address,
            process_id=process_id,
            num_processes=num_processes,
            arrived=None,
            timeout=timeout,
            reached=False,
        )
    try:
        sock.sendall(f"{_HELLO} {process_id} {num_processes}\n".encode())
        # the coordinator gives its verdict at its own deadline, close to ours: allow for skew
        sock.settimeout(max(deadline - time.monotonic(), 0.0) + 5.0)
        reply = _read_reply(sock)
    except TimeoutError:
        reply = None
    except OSError:
        reply = b""  # the port's owner hung up: not a coordinator
    if keep is not None and reply == _GO:
        keep[0] = sock
    else:
        sock.close()
    if reply is None:
        raise DistributedStartupError(
            address, process_id=process_id, num_processes=num_processes, arrived=None,
            timeout=timeout,
        )  # fmt: skip
    if reply.startswith(_FAIL):
        words = reply[len(_FAIL) :].decode(errors="replace").split()
        arrived = tuple(int(p) for p in words[0].split(",") if p.isdigit()) if words else ()
        raise DistributedStartupError(
            address, process_id=process_id, num_processes=num_processes, arrived=arrived,
            timeout=timeout,
        )  # fmt: skip
    if reply.startswith(_REFUSE):
        words = reply[len(_REFUSE) :].split()
        expected = int(words[0]) if words and words[0].isdigit() else num_processes
        raise DistributedStartupError(
            address, process_id=process_id, num_processes=num_processes, arrived=None,
            timeout=timeout, coordinator_num_processes=expected,
        )  # fmt: skip
    if reply != _GO and not _is_grpc_server(reply):
        raise DistributedStartupError(
            address, process_id=process_id, num_processes=num_processes, arrived=None,
            timeout=timeout, foreign=True,
        )  # fmt: skip
    # b"go\n", or plain jax's coordinator: jax takes over


def _is_grpc_server(reply: bytes) -> bool:
    """Whether ``reply`` opens with the SETTINGS frame (on stream 0) a gRPC server sends first."""
    return (
        len(reply) >= _FRAME_HEADER
        and reply[3] == _SETTINGS
        and reply[5:_FRAME_HEADER] == b"\0\0\0\0"
    )


def _connect(host: str, port: int, deadline: float) -> socket.socket | None:
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        try:
            return socket.create_connection((host, port), timeout=min(left, 2.0))
        except OSError:
            time.sleep(min(_RETRY_SECONDS, max(deadline - time.monotonic(), 0.0)))


def _read_reply(sock: socket.socket) -> bytes:
    """A coordinator's answer line, or the first frame header of an HTTP/2 server."""
    data = b""
    while not _complete(data):
        chunk = sock.recv(_LINE_LIMIT)
        if not chunk:
            break
        data += chunk
    return data


def _complete(data: bytes) -> bool:
    if data.startswith(b"\0"):  # an HTTP/2 frame's length: its first byte is zero here
        return len(data) >= _FRAME_HEADER
    return b"\n" in data or len(data) >= _LINE_LIMIT
