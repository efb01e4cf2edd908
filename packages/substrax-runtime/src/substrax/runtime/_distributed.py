"""Bring up ``jax.distributed`` from arguments or from the launcher's environment."""

# Callers are untyped at run time: the isinstance checks below are the validation.
# pyright: reportUnnecessaryIsInstance=false

import logging
import os
import socket
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from substrax.support import check_int

from ._coordinator import CoordinatorProcess
from ._errors import RuntimeConfigurationError
from ._launchers import (
    DEFAULT_COORDINATOR_PORT,
    LaunchSettings,
    LaunchSource,
    launch_from_arguments,
    launch_from_environment,
    modal_cluster_launch,
)
from ._peer_watch import HOOK_SECONDS, POLL_SECONDS, PeerWatch
from ._rendezvous import gather_peers, join_coordinator
from ._startup_guard import StartupGuard


_LOG = logging.getLogger(__name__)

DEFAULT_HEARTBEAT_TIMEOUT = 10
"""Seconds without a heartbeat after which a process of the job counts as dead."""
DEFAULT_SHUTDOWN_TIMEOUT = 300
"""Seconds a finished process waits at exit for the others to finish too."""
_IDLE_BIND_ADDRESS = "127.0.0.1:0"
_STARTED: dict[str, str] = {}  # "coordinator": the address this process's run started with
"""Where process 0's own in-process coordination service listens when a child serves the job's
(jax always starts one on process 0): a loopback port of the system's choosing, never used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DistributedInfo:
    """Where this process stands in a (possibly single-process) jax run.

    Attributes:
        process_id: This process's index.
        num_processes: How many processes take part.
        coordinator: The coordinator's ``host:port``; ``None`` on a single process or when jax
            found it itself (SLURM).
        source: Where the settings came from (``"single_process"`` when nothing was started).

    Example:
        >>> from substrax.runtime import DistributedInfo
        >>> DistributedInfo(process_id=0, num_processes=1, coordinator=None,
        ...                 source="single_process").num_processes
        1
    """

    process_id: int
    num_processes: int
    coordinator: str | None
    source: LaunchSource


def initialize_distributed(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
    initialization_timeout: int = 300,
    coordinator_port: int = DEFAULT_COORDINATOR_PORT,
    env: Mapping[str, str] | None = None,
    heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT,
    shutdown_timeout: int = DEFAULT_SHUTDOWN_TIMEOUT,
    fail_fast: bool = True,
    on_peer_failure: Callable[[tuple[int, ...]], object] | None = None,
) -> DistributedInfo:
    """Start ``jax.distributed`` for a multi-process run; a no-op on a single process.

    The launch comes from the arguments when any is given, else from the environment
    (``launch_from_environment``: ``JAX_COORDINATOR_ADDRESS``/``JAX_NUM_PROCESSES``/
    ``JAX_PROCESS_ID``, SkyPilot, SLURM), else from a Modal cluster
    (``modal.experimental.get_cluster_info()``, read only inside a Modal container). Call it
    first thing in ``main()``, before any other jax call, in every process of the job.

    Before jax starts, the processes meet on the coordinator's port for at most
    ``initialization_timeout`` seconds: process 0 listens there and every other process
    connects. Whoever waits in vain raises ``DistributedStartupError`` naming the address and
    the processes that arrived, where jax would abort the process from C++.

    With ``fail_fast`` (the default), the meeting's connections stay open while jax starts: a
    process that dies before jax started everywhere ends the others at once, as below (jax alone
    leaves them waiting until ``initialization_timeout``, then aborts them from C++). A process
    whose peer dies later ends within about
    ``heartbeat_timeout`` seconds plus a few: it logs which process died, calls
    ``on_peer_failure``, flushes its logging handlers and exits with ``PEER_FAILURE_EXIT_CODE``
    (jax alone would abort it from C++ after its 100 s heartbeat timeout). Process 0 serves
    jax's coordination service from a child process of its own, so that the service outlives
    process 0 and a dead process 0 is named like any other (jax alone aborts the others at once
    from C++). The child ends with the job: at a clean shutdown, or a grace period after process
    0 is gone (about ``1.5 * heartbeat_timeout + 17`` seconds). A process that ends normally
    waits at exit, or in ``jax.distributed.shutdown()``, for the others to get there, for at
    most ``shutdown_timeout`` seconds; one that ends with an uncaught exception does not wait
    for them (they may be waiting for it in a collective), so they see it die.

    Args:
        coordinator_address: ``host:port`` of process 0.
        num_processes: How many processes join.
        process_id: This process's index.
        local_device_ids: The local devices this process uses (default: all); on a single
            process nothing starts, so they are ignored, with a warning.
        initialization_timeout: Seconds to wait for every process to connect.
        coordinator_port: The port used when a launcher names only node IPs.
        env: The environment to read; defaults to ``os.environ``.
        heartbeat_timeout: Seconds without a heartbeat after which a process counts as dead
            (jax's ``heartbeat_timeout_seconds``).
        shutdown_timeout: Seconds a finished process waits for the others at exit (jax's
            ``shutdown_timeout_seconds``).
        fail_fast: End this process when a peer dies (jax's recoverable coordination mode, its
            service in a child of process 0 where the coordinator's address is known, and a
            watch thread); ``False`` leaves jax's own handling, a C++ abort.
        on_peer_failure: With ``fail_fast``, called with the dead process ids before this
            process ends, for at most 10 seconds (e.g. to mark a tracked run failed); it runs
            on a watch thread while the main thread may be stuck in a collective.

    Returns:
        This process's place in the run.

    Raises:
        DistributedStartupError: Not every process reached the coordinator within
            ``initialization_timeout`` (a ``TimeoutError``).
        ValueError: The launch is inconsistent, a run across several nodes names a loopback
            coordinator, or (on process 0) the coordinator's host does not resolve.
        CoordinatorPortError: On process 0 (an ``OSError``), the coordinator's port cannot be
            served (another process holds it).
        RuntimeConfigurationError: ``jax.distributed`` is already initialized with another
            process layout.

    Example:
        >>> from substrax.runtime import initialize_distributed
        >>> initialize_distributed(env={})  # one process: nothing to start
        DistributedInfo(process_id=0, num_processes=1, coordinator=None, source='single_process')
    """
    # jax takes whole seconds
    check_int("initialization_timeout", initialization_timeout, minimum=1)
    check_int("heartbeat_timeout", heartbeat_timeout, minimum=1)
    check_int("shutdown_timeout", shutdown_timeout, minimum=1)
    source_env = os.environ if env is None else env
    if coordinator_address is not None or num_processes is not None or process_id is not None:
        launch = launch_from_arguments(
            source_env,
            coordinator_address=coordinator_address,
            num_processes=num_processes,
            process_id=process_id,
        )
    else:
        launch = launch_from_environment(source_env, coordinator_port=coordinator_port)
        if launch is None:
            launch = modal_cluster_launch(source_env, coordinator_port)
    if launch is None or launch.num_processes == 1:
        if local_device_ids is not None:
            _LOG.warning(
                "local_device_ids=%s is ignored: one process starts no jax.distributed and "
                "sees every local device (choose them with CUDA_VISIBLE_DEVICES instead)",
                list(local_device_ids),
            )
        return DistributedInfo(
            process_id=0,
            num_processes=1,
            coordinator=None if launch is None else launch.coordinator_address,
            source="single_process" if launch is None else launch.source,
        )
    settings = _Settings(
        initialization_timeout=initialization_timeout,
        heartbeat_timeout=heartbeat_timeout,
        shutdown_timeout=shutdown_timeout,
        fail_fast=fail_fast,
        on_peer_failure=on_peer_failure,
    )
    return _start(launch, local_device_ids, settings)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Settings:
    initialization_timeout: int
    heartbeat_timeout: int
    shutdown_timeout: int
    fail_fast: bool
    on_peer_failure: Callable[[tuple[int, ...]], object] | None


def _meet(launch: LaunchSettings, timeout: int, *, keep: bool) -> dict[int, socket.socket]:
    """Meet on the coordinator's port (bounded), so jax never waits for an absent process.

    Returns the meeting's connections, left open where ``keep`` (by the process id at their
    other end).
    """
    connections: dict[int, socket.socket] = {}
    if launch.coordinator_address is None:
        return connections
    if launch.process_id == 0:
        gather_peers(
            launch.coordinator_address,
            num_processes=launch.num_processes,
            timeout=timeout,
            keep=connections if keep else None,
        )
    else:
        join_coordinator(
            launch.coordinator_address,
            process_id=launch.process_id,
            num_processes=launch.num_processes,
            timeout=timeout,
            keep=connections if keep else None,
        )
    return connections


def _serve_coordinator(launch: LaunchSettings, settings: _Settings) -> CoordinatorProcess | None:
    """On process 0 with ``fail_fast``: the job's coordination service, in a child process."""
    address = launch.coordinator_address
    if not settings.fail_fast or launch.process_id != 0 or address is None:
        return None
    bind_address = os.environ.get("JAX_COORDINATOR_BIND_ADDRESS") or (
        "[::]:" + address.rsplit(":", 1)[1]  # jax's own default: every interface
    )
    # long enough for the others to see process 0 dead, run their hook and flush
    detection = 1.5 * settings.heartbeat_timeout + 2 * POLL_SECONDS
    return CoordinatorProcess.start(
        bind_address,
        num_processes=launch.num_processes,
        heartbeat_timeout=settings.heartbeat_timeout,
        shutdown_timeout=settings.shutdown_timeout,
        grace_seconds=detection + HOOK_SECONDS + 5.0,
    )


def _releasing(
    coordinator: CoordinatorProcess,
    hook: Callable[[tuple[int, ...]], object] | None,
    num_processes: int,
) -> Callable[[tuple[int, ...]], object]:
    """``hook``, after which the service ends with process 0 when every other process is dead."""

    def run(dead: tuple[int, ...]) -> None:
        try:
            if hook is not None:
                hook(dead)
        finally:
            if len(dead) == num_processes - 1:  # nobody else needs the service any more
                coordinator.release()

    return run


def _watch_peers(
    process_id: int,
    num_processes: int,
    settings: _Settings,
    coordinator: CoordinatorProcess | None,
) -> None:
    """Start the peer watch and make jax's shutdown meet the other processes first."""
    from ._jax_client import distributed_state  # noqa: PLC0415  (it imports jax)

    state: Any = distributed_state()
    client = state.client
    hook = settings.on_peer_failure
    if coordinator is not None:
        hook = _releasing(coordinator, hook, num_processes)
    watch = PeerWatch(
        client,
        process_id=process_id,
        num_processes=num_processes,
        on_peer_failure=hook,
        is_current=lambda: state.client is client,
    )
    jax_shutdown = state.shutdown
    failing = threading.Event()
    excepthook = sys.excepthook

    def note_failure(
        kind: type[BaseException], error: BaseException, tb: TracebackType | None
    ) -> None:
        failing.set()
        excepthook(kind, error, tb)

    def shutdown() -> None:
        del state.shutdown  # back to jax's own method
        if state.client is client and failing.is_set():
            # the others may wait for this process in a collective: don't wait for them; only
            # give the coordination service time to declare a dead peer (heartbeat_timeout
            # after its last heartbeat, checked periodically)
            watch.linger(1.5 * settings.heartbeat_timeout + 2 * POLL_SECONDS)
        elif state.client is client:
            watch.meet_at_shutdown(settings.shutdown_timeout)
        jax_shutdown()
        if coordinator is not None and not failing.is_set():
            coordinator.stop()  # every process met here (a failing one leaves it its grace)

    sys.excepthook = note_failure  # an uncaught exception ends this process with an error
    state.shutdown = shutdown  # jax.distributed.shutdown() and jax's exit hook call this
    watch.start()


def _check_joined(launch: LaunchSettings, index: int, count: int) -> None:
    """Refuse to start again as another process, or in another run, than the one joined."""
    started, address = _STARTED.get("coordinator"), launch.coordinator_address
    if (count, index) != (launch.num_processes, launch.process_id):
        joined = f"as process {index} of {count}, not {launch.process_id} of {launch.num_processes}"
    elif started and address not in (None, started):
        joined = f"with coordinator {started}, not {address}; a process joins one run"
    else:
        return
    raise RuntimeConfigurationError(f"jax.distributed is already initialized {joined}")


def _start(
    launch: LaunchSettings, local_device_ids: Sequence[int] | None, settings: _Settings
) -> DistributedInfo:
    import jax  # noqa: PLC0415 - jax loads only when a multi-process run starts

    if jax.distributed.is_initialized():
        _check_joined(launch, jax.process_index(), jax.process_count())
    else:
        _LOG.info(
            "starting jax.distributed: process %d of %d, coordinator %s (%s)",
            launch.process_id,
            launch.num_processes,
            launch.coordinator_address or "detected by jax",
            launch.source,
        )
        # with fail_fast, a process dying before jax started everywhere ends the others too
        guard = StartupGuard(
            _meet(launch, settings.initialization_timeout, keep=settings.fail_fast),
            process_id=launch.process_id,
            num_processes=launch.num_processes,
            on_peer_failure=settings.on_peer_failure,
        )
        guard.start()
        ids = None if local_device_ids is None else list(local_device_ids)
        try:
            coordinator = _serve_coordinator(launch, settings)
        except BaseException:
            guard.close(started=False)
            raise
        if settings.fail_fast and launch.coordinator_address is None:
            # jax finds the coordinator (SLURM): process 0 serves the job in-process. The flag
            # only sets that service's mode (a child serving the job is recoverable anyway), and
            # a service in that mode warns about an experimental feature
            jax.config.update("jax_enable_recoverability", True)
        common: dict[str, Any] = {
            "local_device_ids": ids,
            "initialization_timeout": settings.initialization_timeout,
            "heartbeat_timeout_seconds": settings.heartbeat_timeout,
            "shutdown_timeout_seconds": settings.shutdown_timeout,
        }
        if coordinator is not None:
            common["coordinator_bind_address"] = _IDLE_BIND_ADDRESS
        try:
            if launch.coordinator_address is None:
                jax.distributed.initialize(**common)
            else:
                jax.distributed.initialize(
                    coordinator_address=launch.coordinator_address,
                    num_processes=launch.num_processes,
                    process_id=launch.process_id,
                    **common,
                )
        except BaseException:
            guard.close(started=False)
            if coordinator is not None:
                coordinator.stop()
            raise
        guard.close()
        if launch.coordinator_address:
            _STARTED["coordinator"] = launch.coordinator_address
        if settings.fail_fast:
            _watch_peers(jax.process_index(), jax.process_count(), settings, coordinator)
    return DistributedInfo(
        process_id=jax.process_index(),
        num_processes=jax.process_count(),
        coordinator=launch.coordinator_address or _STARTED.get("coordinator"),
        source=launch.source,
    )
