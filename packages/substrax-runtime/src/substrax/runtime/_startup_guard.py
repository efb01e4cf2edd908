"""End a process whose peer dies between the rendezvous and the end of jax's own start.

Once every process met on the coordinator's port, each calls ``jax.distributed.initialize``,
which waits in C++ until every process registered with the coordination service; a process that
dies meanwhile leaves the others blocked there until ``initialization_timeout``, then jax aborts
them from C++. The connections of the rendezvous stay open during that call instead (process 0
holds one to every peer, each peer one to process 0), and a ``StartupGuard`` thread watches
them: a connection that closes without saying ``up`` (sent by a process whose jax start
returned) means that process died. The guard then logs which, runs the caller's hook, flushes
the logging handlers and ends this process with ``PEER_FAILURE_EXIT_CODE``; process 0 first
tells the other peers which process died, so they name it too.
"""

import contextlib
import logging
import os
import selectors
import socket
import sys
import threading
from collections.abc import Callable

from ._peer_watch import HOOK_SECONDS, PEER_FAILURE_EXIT_CODE, reaches_stderr


_UP = b"up\n"
_DEAD = b"dead"
_LOG = logging.getLogger(__name__)


class StartupGuard:
    """A daemon thread that ends this process when a peer dies while jax starts.

    Args:
        connections: The rendezvous connections by the process id at their other end.
        process_id: This process's index.
        num_processes: How many processes the job has.
        on_peer_failure: Called with the dead process ids before this process ends (for at most
            ``HOOK_SECONDS``).
    """

    def __init__(
        self,
        connections: dict[int, socket.socket],
        *,
        process_id: int,
        num_processes: int,
        on_peer_failure: Callable[[tuple[int, ...]], object] | None,
    ) -> None:
        self._connections = connections
        self._process_id = process_id
        self._num_processes = num_processes
        self._hook = on_peer_failure
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, name="substrax-startup-guard", daemon=True
        )

    def start(self) -> None:
        """Start watching."""
        if self._connections:
            self._thread.start()

    def close(self, *, started: bool = True) -> None:
        """Stop watching and close the connections, telling the others when jax started here.

        Closed without a word (``started=False``), the others see this process end.
        """
        with self._lock:
            self._done.set()
            for sock in self._connections.values():
                with contextlib.suppress(OSError):
                    sock.settimeout(1.0)
                    if started:
                        sock.sendall(_UP)
                sock.close()

    def _run(self) -> None:
        with selectors.DefaultSelector() as selector:
            for peer, sock in self._connections.items():
                sock.setblocking(False)
                selector.register(sock, selectors.EVENT_READ, peer)
            while selector.get_map() and not self._done.is_set():
                for key, _ in selector.select(timeout=0.5):
                    sock = key.fileobj
                    if not isinstance(sock, socket.socket):  # pragma: no cover - sockets only
                        continue
                    dead = self._read(sock, key.data)
                    if dead is None:
                        continue
                    selector.unregister(sock)
                    if dead:
                        self._fail(dead)
                        return

    def _read(self, sock: socket.socket, peer: int) -> tuple[int, ...] | None:
        """``None`` while nothing happened, ``()`` once ``peer`` started, else who died."""
        try:
            data = sock.recv(256)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if data.startswith(_UP):
            return ()
        if data.startswith(_DEAD):
            ids = tuple(int(p) for p in data[len(_DEAD) :].split() if p.isdigit())
            return ids or (peer,)
        return (peer,)  # closed without a word: that process died

    def _fail(self, dead: tuple[int, ...]) -> None:
        with self._lock:
            if self._done.is_set():  # jax started meanwhile: the peer watch takes over
                return
            if self._process_id == 0:
                notice = _DEAD + (" " + " ".join(str(p) for p in dead) + "\n").encode()
                for peer, sock in self._connections.items():
                    if peer not in dead:
                        with contextlib.suppress(OSError):
                            sock.sendall(notice)
        names = ", ".join(str(p) for p in dead)
        message = (
            f"process {names} of this {self._num_processes}-process jax job died while jax "
            f"started; process {self._process_id} stops too, with exit status "
            f"{PEER_FAILURE_EXIT_CODE}"
        )
        _LOG.critical(message)
        if not reaches_stderr(_LOG):
            sys.stderr.write(f"substrax: {message}\n")
        if self._hook is not None:
            hook = threading.Thread(target=self._run_hook, args=(dead,), daemon=True)
            hook.start()
            hook.join(timeout=HOOK_SECONDS)
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(PEER_FAILURE_EXIT_CODE)

    def _run_hook(self, dead: tuple[int, ...]) -> None:
        try:
            if self._hook is not None:
                self._hook(dead)
        except Exception:
            _LOG.exception("on_peer_failure raised")
