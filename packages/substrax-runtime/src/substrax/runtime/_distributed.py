"""Bring up ``jax.distributed`` from arguments or from the launcher's environment."""

# Callers are untyped at run time: the isinstance checks below are the validation.
# pyright: reportUnnecessaryIsInstance=false

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._errors import RuntimeConfigurationError
from ._launchers import (
    DEFAULT_COORDINATOR_PORT,
    LaunchSettings,
    LaunchSource,
    launch_from_arguments,
    launch_from_environment,
    launch_from_modal_cluster,
)


_LOG = logging.getLogger(__name__)


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
        >>> DistributedInfo(process_id=0, num_processes=1, coordinator=None,
        ...                 source="single_process").num_processes
        1
    """

    process_id: int
    num_processes: int
    coordinator: str | None
    source: LaunchSource


def _modal_launch(env: Mapping[str, str], port: int) -> LaunchSettings | None:
    """Read a Modal cluster's ranks, when this runs inside a clustered Modal function."""
    if "MODAL_TASK_ID" not in env:
        return None
    try:
        import modal.experimental  # noqa: PLC0415 - optional SDK, present inside Modal containers
        from modal.exception import InvalidError  # noqa: PLC0415
    except ImportError:
        return None
    try:
        cluster = modal.experimental.get_cluster_info()
    except InvalidError:  # a Modal container that is not part of a cluster
        return None
    ips = cluster.container_ipv4_ips or cluster.container_ips
    return launch_from_modal_cluster(rank=cluster.rank, container_ips=ips, coordinator_port=port)


def _check_timeout(timeout: int) -> None:
    value: object = timeout
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"initialization_timeout must be whole seconds (an int), got {timeout!r}")
    if timeout < 1:
        raise ValueError(f"initialization_timeout must be at least 1 second, got {timeout}")


def initialize_distributed(
    *,
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    local_device_ids: Sequence[int] | None = None,
    initialization_timeout: int = 300,
    coordinator_port: int = DEFAULT_COORDINATOR_PORT,
    env: Mapping[str, str] | None = None,
) -> DistributedInfo:
    """Start ``jax.distributed`` for a multi-process run; a no-op on a single process.

    The launch comes from the arguments when any is given, else from the environment
    (``launch_from_environment``: ``JAX_COORDINATOR_ADDRESS``/``JAX_NUM_PROCESSES``/
    ``JAX_PROCESS_ID``, SkyPilot, SLURM), else from a Modal cluster
    (``modal.experimental.get_cluster_info()``, read only inside a Modal container). Call it
    first thing in ``main()``, before any other jax call.

    Args:
        coordinator_address: ``host:port`` of process 0.
        num_processes: How many processes join.
        process_id: This process's index.
        local_device_ids: The local devices this process uses (default: all).
        initialization_timeout: Seconds to wait for every process to connect.
        coordinator_port: The port used when a launcher names only node IPs.
        env: The environment to read; defaults to ``os.environ``.

    Returns:
        This process's place in the run.

    Raises:
        ValueError: The launch is inconsistent, or a run across several nodes names a loopback
            coordinator.
        RuntimeConfigurationError: ``jax.distributed`` is already initialized with another
            process layout.

    Example:
        >>> initialize_distributed(env={})  # one process: nothing to start
        DistributedInfo(process_id=0, num_processes=1, coordinator=None, source='single_process')
    """
    _check_timeout(initialization_timeout)
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
            launch = _modal_launch(source_env, coordinator_port)
    if launch is None or launch.num_processes == 1:
        return DistributedInfo(
            process_id=0,
            num_processes=1,
            coordinator=None if launch is None else launch.coordinator_address,
            source="single_process" if launch is None else launch.source,
        )
    return _start(launch, local_device_ids, initialization_timeout)


def _start(
    launch: LaunchSettings, local_device_ids: Sequence[int] | None, timeout: int
) -> DistributedInfo:
    import jax  # noqa: PLC0415 - jax loads only when a multi-process run starts

    if jax.distributed.is_initialized():
        if (jax.process_count(), jax.process_index()) != (launch.num_processes, launch.process_id):
            raise RuntimeConfigurationError(
                f"jax.distributed is already initialized as process {jax.process_index()} of "
                f"{jax.process_count()}, not {launch.process_id} of {launch.num_processes}"
            )
    else:
        _LOG.info(
            "starting jax.distributed: process %d of %d, coordinator %s (%s)",
            launch.process_id,
            launch.num_processes,
            launch.coordinator_address or "detected by jax",
            launch.source,
        )
        ids = None if local_device_ids is None else list(local_device_ids)
        if launch.coordinator_address is None:
            jax.distributed.initialize(local_device_ids=ids, initialization_timeout=timeout)
        else:
            jax.distributed.initialize(
                coordinator_address=launch.coordinator_address,
                num_processes=launch.num_processes,
                process_id=launch.process_id,
                local_device_ids=ids,
                initialization_timeout=timeout,
            )
    return DistributedInfo(
        process_id=jax.process_index(),
        num_processes=jax.process_count(),
        coordinator=launch.coordinator_address,
        source=launch.source,
    )
