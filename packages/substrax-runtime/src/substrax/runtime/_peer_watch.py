"""End a process of a ``jax.distributed`` job soon after one of its peers dies, in Python.

Left to itself, jax notices a dead peer when its heartbeats stop, then aborts every other process
from C++ (exit 134, no Python cleanup). ``initialize_distributed`` instead starts jax's
coordination service in its recoverable mode, in which a dead peer is only marked dead, and runs
a ``PeerWatch`` thread: it asks the coordination service which processes are alive every second
and, once one is missing, logs which, runs the caller's hook, flushes the logging handlers and
ends this process with ``PEER_FAILURE_EXIT_CODE``. The recoverable mode drops jax's own
synchronized shutdown, so ``PeerWatch`` puts it back as a barrier every process meets before jax
shuts its client down (at exit or in ``jax.distributed.shutdown()``); a process that ends with an
uncaught exception skips it and only lingers long enough for the watch to name a dead peer.
"""

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol


PEER_FAILURE_EXIT_CODE = 75
"""The exit status of a process ended because a peer of its ``jax.distributed`` job died."""

POLL_SECONDS = 1.0
HOOK_SECONDS = 10.0
DRAIN_SECONDS = 30.0
_SHUTDOWN_BARRIER = "substrax_shutdown"
_LOG = logging.getLogger(__name__)


class CoordinationClient(Protocol):
    """The part of jax's ``DistributedRuntimeClient`` the watch uses."""

    def get_live_nodes(self, process_ids: Sequence[int]) -> Mapping[int, int]: ...

    def wait_at_barrier(self, barrier_id: str, timeout_in_ms: int) -> None: ...


class PeerWatch:
    """A daemon thread that ends this process once a peer of its job is no longer alive.

    Args:
        client: jax's coordination client of this process.
        process_id: This process's index.
        num_processes: How many processes the job has.
        on_peer_failure: Called with the dead process ids before this process ends (for at most
            ``HOOK_SECONDS``), e.g. to mark a tracked run failed.
        is_current: Whether ``client`` is still jax's client; once jax shut it down, a failing
            call means nothing.
        poll_seconds: How often to ask.
    """

    def __init__(
        self,
        client: CoordinationClient,
        *,
        process_id: int,
        num_processes: int,
        on_peer_failure: Callable[[tuple[int, ...]], object] | None,
        is_current: Callable[[], bool],
        poll_seconds: float = POLL_SECONDS,
    ) -> None:
        self._client = client
        self._process_id = process_id
        self._num_processes = num_processes
        self._hook = on_peer_failure
        self._is_current = is_current
        self._poll = poll_seconds
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="substrax-peer-watch", daemon=True)
        # started with the watch: once the interpreter finalizes (a process lingering at exit
        # after an error), no new thread can start
        self._hook_thread = threading.Thread(
            target=self._run_hook, name="substrax-peer-failure-hook", daemon=True
        )
        self._dead: tuple[int, ...] = ()
        self._failing = threading.Event()
        self._hook_due = threading.Event()
        self._hook_done = threading.Event()

    def start(self) -> None:
        """Start watching."""
        if self._hook is not None:
            self._hook_thread.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (before jax shuts its client down); an answer still due is ignored."""
        self._stopped.set()

    def meet_at_shutdown(self, timeout_seconds: int) -> None:
        """Wait until every process of the job gets here, then stop watching.

        A peer that died meanwhile ends this process through the watch, as during the run.
        """
        try:
            self._client.wait_at_barrier(_SHUTDOWN_BARRIER, timeout_seconds * 1000)
        except Exception as error:
            _LOG.warning("the processes did not all meet at shutdown: %s", error)
            self.stop()
            self._finish_failure()
            return
        self.stop()
        if self._process_id == 0:
            self._outlive_peers(min(timeout_seconds, DRAIN_SECONDS))

    def _outlive_peers(self, seconds: float) -> None:
        """Keep the coordinator up until the peers disconnected (jax aborts a peer that can't)."""
        deadline = time.monotonic() + seconds
        everyone = list(range(self._num_processes))
        while time.monotonic() < deadline:
            try:
                if set(self._client.get_live_nodes(everyone)) <= {0}:
                    return
            except Exception:
                return
            time.sleep(0.05)

    def linger(self, seconds: float) -> None:
        """Keep watching for up to ``seconds``, then stop: for a process that ends with an error.

        Such a process does not wait for the others at shutdown (they may be stuck waiting for
        it in a collective). If its error came from a peer's death, the watch names the peer and
        ends it meanwhile.
        """
        self._thread.join(timeout=seconds)
        self.stop()
        self._finish_failure()

    def _finish_failure(self) -> None:
        """Once the watch is ending this process, let it finish (hook, flush, exit) first."""
        if self._failing.is_set():
            self._thread.join(timeout=self._poll * 3 + HOOK_SECONDS + 5.0)

    def _run(self) -> None:
        everyone = list(range(self._num_processes))
        while not self._stopped.wait(self._poll):
            try:
                # answers once every live process asked too (or died): a round of the job
                live = self._client.get_live_nodes(everyone)
            except Exception as error:
                if self._stopped.wait(self._poll) or not self._is_current():
                    return
                self._fail((0,), f"the coordinator does not answer ({error})")
                return
            dead = tuple(p for p in everyone if p not in live)
            if dead and not self._stopped.is_set():
                self._fail(dead, "stopped sending heartbeats")
                return

    def _fail(self, dead: tuple[int, ...], why: str) -> None:
        self._failing.set()
        names = ", ".join(str(p) for p in dead)
        message = (
            f"process {names} of this {self._num_processes}-process jax job died ({why}); "
            f"process {self._process_id} stops too, with exit status {PEER_FAILURE_EXIT_CODE}"
        )
        _LOG.critical(message)
        if not reaches_stderr(_LOG):
            sys.stderr.write(f"substrax: {message}\n")
        if self._process_id == 0 and len(dead) < self._num_processes - 1:
            # the coordinator goes last, so every live peer's own watch reports the dead process
            self._stopped.wait(self._poll * 3)
        if self._hook is not None:
            self._dead = dead
            self._hook_due.set()
            self._hook_done.wait(timeout=HOOK_SECONDS)
        logging.shutdown()  # flushes (and closes) every logging handler
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(PEER_FAILURE_EXIT_CODE)

    def _run_hook(self) -> None:
        self._hook_due.wait()
        try:
            if self._hook is not None:
                self._hook(self._dead)
        except Exception:
            _LOG.exception("on_peer_failure raised")
        finally:
            self._hook_done.set()


def reaches_stderr(logger: logging.Logger) -> bool:
    """Whether a record of ``logger`` is written to stderr (by a handler or by logging's last resort)."""
    current: logging.Logger | None = logger
    found = False
    while current is not None:
        for handler in current.handlers:
            found = True
            if isinstance(handler, logging.StreamHandler) and handler.stream in {
                sys.stderr,
                sys.__stderr__,
            }:
                return True
        current = current.parent if current.propagate else None
    return not found
