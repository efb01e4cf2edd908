"""Read a multi-process launch from the environment a launcher sets (pure, no jax)."""

import ipaddress
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, cast

from substrax.support import check_int


DEFAULT_COORDINATOR_PORT = 8476

type LaunchSource = Literal["argument", "jax_env", "skypilot", "slurm", "modal", "single_process"]


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_LAST_PORT = 65535


def coordinator_host(address: str) -> str:
    """The host part of ``host:port`` (``[v6]:port`` keeps its address, brackets dropped).

    Args:
        address: A coordinator address such as ``"10.0.0.1:8476"`` or ``"[fd00::1]:8476"``.

    Returns:
        The host.

    Raises:
        ValueError: The address has no ``:port``, or the port is not a number from 1 to 65535.

    Example:
        >>> from substrax.runtime._launchers import coordinator_host
        >>> coordinator_host("[fd00::1]:8476")
        'fd00::1'
    """
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdecimal() or (":" in host and not host.startswith("[")):
        raise ValueError(
            f"coordinator address {address!r} must be host:port (an IPv6 host as [addr]:port)"
        )
    if not 1 <= int(port) <= _LAST_PORT:  # 0 or 99999: no peer could ever reach it
        raise ValueError(f"coordinator address {address!r} needs a port from 1 to {_LAST_PORT}")
    return host.strip("[]")


def with_port(host: str, port: int) -> str:
    """Format ``host`` and ``port`` as a coordinator address (IPv6 in brackets).

    Example:
        >>> from substrax.runtime._launchers import with_port
        >>> with_port("fd00::1", 8476)
        '[fd00::1]:8476'
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSettings:
    """What ``jax.distributed.initialize`` needs, read from arguments or a launcher.

    Attributes:
        coordinator_address: ``host:port`` of process 0, or ``None`` to let jax's own cluster
            detection find it (SLURM).
        num_processes: How many processes join.
        process_id: This process's index, in ``[0, num_processes)``.
        source: Where the settings came from.
        node_addresses: The nodes' addresses when the launcher names them.
        num_nodes: How many nodes the launcher reports, when it does.

    Raises:
        ValueError: A count or index is out of range, the coordinator is not ``host:port``, or
            a run across several nodes names a loopback coordinator.

    Example:
        >>> from substrax.runtime import LaunchSettings
        >>> LaunchSettings(coordinator_address="10.0.0.1:8476", num_processes=2, process_id=1,
        ...                source="argument").process_id
        1
    """

    coordinator_address: str | None
    num_processes: int
    process_id: int
    source: LaunchSource
    node_addresses: tuple[str, ...] = ()
    num_nodes: int | None = None

    def __post_init__(self) -> None:
        check_int("num_processes", self.num_processes, minimum=1)
        check_int("process_id", self.process_id)
        if not 0 <= self.process_id < self.num_processes:
            raise ValueError(
                f"process_id {self.process_id} is outside [0, {self.num_processes}) "
                f"(num_processes={self.num_processes}, from {self.source})"
            )
        if self.coordinator_address is None:
            return
        host = coordinator_host(self.coordinator_address)
        if self.multi_node and _is_loopback(host):
            raise ValueError(
                f"coordinator {self.coordinator_address!r} is a loopback address, but this "
                f"{self.num_processes}-process run spans {self._nodes_shown()}; the other nodes "
                "cannot reach it. Name process 0's routable address (e.g. the first node IP)"
            )

    @property
    def multi_node(self) -> bool:
        """Whether the launcher says the processes run on more than one node."""
        return len(set(self.node_addresses)) > 1 or (self.num_nodes or 1) > 1

    def _nodes_shown(self) -> str:
        if self.node_addresses:
            return f"nodes {', '.join(self.node_addresses)}"
        return f"{self.num_nodes} nodes"


# The variables srun sets for each task of a step (the same set jax's SLURM detection reads).
_SLURM_STEP = (
    "SLURM_JOB_ID",
    "SLURM_STEP_NODELIST",
    "SLURM_NTASKS",
    "SLURM_PROCID",
    "SLURM_LOCALID",
)


def _int(env: Mapping[str, str], name: str) -> int:
    raw = env[name]
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{name}={raw!r} must be an integer") from None


def _refuse_partial_launch(env: Mapping[str, str]) -> None:
    """Refuse a SkyPilot or SLURM launch of several nodes or tasks that lacks a variable.

    Without it no launch would be read, and each process would train alone.
    """
    said = [
        f"{name}={env[name].strip()}"
        for name in ("SKYPILOT_NUM_NODES", "SKYPILOT_NODE_RANK")
        if env.get(name, "").strip() and _int(env, name) > (name == "SKYPILOT_NUM_NODES")
    ]
    if said and not _skypilot_nodes(env):
        raise ValueError(
            f"{', '.join(said)} says a SkyPilot run of several nodes, but SKYPILOT_NODE_IPS (the "
            "nodes' IPs, one a line) is not set, so this node would train alone; run under "
            "SkyPilot, which sets it, or pass coordinator_address=, num_processes= and "
            "process_id= to initialize_distributed"
        )
    if env.get("SLURM_PROCID", "").strip() and _int(env, "SLURM_PROCID") > 0:
        missing = [name for name in _SLURM_STEP if not env.get(name, "").strip()]
        if missing:
            raise ValueError(
                f"SLURM_PROCID={env['SLURM_PROCID'].strip()} marks a task of an srun step, but "
                f"{', '.join(missing)} is not set, so this task would train alone; launch with "
                "srun (which sets them all), or pass coordinator_address=, num_processes= and "
                "process_id= to initialize_distributed"
            )


def _skypilot_nodes(env: Mapping[str, str]) -> tuple[str, ...]:
    return tuple(
        line.strip() for line in env.get("SKYPILOT_NODE_IPS", "").splitlines() if line.strip()
    )


def _launcher_nodes(env: Mapping[str, str]) -> tuple[tuple[str, ...], int | None]:
    """Node addresses and count that a launcher reports, whichever source names the coordinator."""
    nodes = _skypilot_nodes(env)
    count: int | None = None
    for name in (
        "SKYPILOT_NUM_NODES",
        "SLURM_STEP_NUM_NODES",
        "SLURM_JOB_NUM_NODES",
        "SLURM_NNODES",
    ):
        if env.get(name, "").strip():
            count = _int(env, name)
            break
    return nodes, count


def _one_process_per_node(
    nodes: tuple[str, ...], *, rank: int, port: int, source: LaunchSource
) -> LaunchSettings:
    """One process on each of ``nodes`` (ordered by rank); the first node coordinates on ``port``."""
    return LaunchSettings(
        coordinator_address=with_port(nodes[0], port),
        num_processes=len(nodes),
        process_id=rank,
        source=source,
        node_addresses=nodes,
        num_nodes=len(nodes),
    )


def launch_from_arguments(
    env: Mapping[str, str],
    *,
    coordinator_address: str | None,
    num_processes: int | None,
    process_id: int | None,
) -> LaunchSettings:
    """Settings from explicit arguments, checked against the nodes a launcher reports.

    Args:
        env: The environment, read only for the launcher's node list (the loopback check).
        coordinator_address: ``host:port`` of process 0 (may be ``None`` for one process).
        num_processes: How many processes join.
        process_id: This process's index.

    Returns:
        The settings, with ``source="argument"``.

    Raises:
        ValueError: An argument is missing for a multi-process run, or out of range.

    Example:
        >>> from substrax.runtime._launchers import launch_from_arguments
        >>> launch_from_arguments({}, coordinator_address="127.0.0.1:1234", num_processes=2,
        ...                       process_id=0).num_processes
        2
    """
    if num_processes is None:
        raise ValueError("num_processes is required when initialize_distributed gets arguments")
    if num_processes != 1 and (coordinator_address is None or process_id is None):
        raise ValueError(
            "a multi-process run needs coordinator_address, num_processes and process_id together"
        )
    nodes, count = _launcher_nodes(env)
    return LaunchSettings(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id or 0,
        source="argument",
        node_addresses=nodes,
        num_nodes=count,
    )


def launch_from_environment(
    env: Mapping[str, str], *, coordinator_port: int = DEFAULT_COORDINATOR_PORT
) -> LaunchSettings | None:
    r"""Read a launch from launcher variables; ``None`` when no launcher set any.

    Checked in order:

    1. ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID`` (all three);
    2. SkyPilot: ``SKYPILOT_NODE_IPS`` (one per line), ``SKYPILOT_NODE_RANK``,
       ``SKYPILOT_NUM_NODES``; one process per node, the first IP coordinates on
       ``coordinator_port``;
    3. SLURM, inside an ``srun`` step (``SLURM_JOB_ID``, ``SLURM_STEP_NODELIST``,
       ``SLURM_NTASKS``, ``SLURM_PROCID``, ``SLURM_LOCALID``): one process per task; the
       coordinator (first node, port from the job id) is left to jax's own SLURM detection
       (``coordinator_address=None``). A bare ``salloc`` shell is not a launch.

    A launcher's variables that say several nodes or tasks but lack the rest
    (``SKYPILOT_NUM_NODES=2`` without ``SKYPILOT_NODE_IPS``; ``SLURM_PROCID=1`` without
    ``SLURM_STEP_NODELIST``) are refused, never read as one process. SLURM's task 0 cannot be
    told from a batch script (both set ``SLURM_PROCID=0``), so only the other tasks are refused.

    Modal clusters set no such variables; ``initialize_distributed`` reads them from
    ``modal.experimental.get_cluster_info()`` (see ``launch_from_modal_cluster``).

    Args:
        env: The environment to read.
        coordinator_port: The port process 0 listens on when the launcher gives only IPs.

    Returns:
        The settings, or ``None``.

    Raises:
        ValueError: A launcher's variables are partial (the message names the missing one),
            not integers, or inconsistent.

    Example:
        >>> from substrax.runtime import launch_from_environment
        >>> launch = launch_from_environment({"SKYPILOT_NODE_IPS": "10.0.0.1\n10.0.0.2",
        ...                                   "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2"})
        >>> launch.coordinator_address, launch.process_id, launch.num_processes
        ('10.0.0.1:8476', 1, 2)
    """
    nodes, count = _launcher_nodes(env)
    jax_vars = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")
    present = [name for name in jax_vars if env.get(name, "").strip()]
    if present:
        if len(present) != len(jax_vars):
            missing = sorted(set(jax_vars) - set(present))
            raise ValueError(
                f"{', '.join(present)} set without {', '.join(missing)}; set all three"
            )
        return LaunchSettings(
            coordinator_address=env["JAX_COORDINATOR_ADDRESS"].strip(),
            num_processes=_int(env, "JAX_NUM_PROCESSES"),
            process_id=_int(env, "JAX_PROCESS_ID"),
            source="jax_env",
            node_addresses=nodes,
            num_nodes=count,
        )
    if nodes:
        rank = _int(env, "SKYPILOT_NODE_RANK") if "SKYPILOT_NODE_RANK" in env else None
        if rank is None:
            raise ValueError("SKYPILOT_NODE_IPS is set without SKYPILOT_NODE_RANK")
        if count is not None and count != len(nodes):
            raise ValueError(
                f"SKYPILOT_NUM_NODES={count} disagrees with the {len(nodes)} SKYPILOT_NODE_IPS"
            )
        return _one_process_per_node(nodes, rank=rank, port=coordinator_port, source="skypilot")
    _refuse_partial_launch(env)
    if all(env.get(name, "").strip() for name in _SLURM_STEP):
        return LaunchSettings(
            coordinator_address=None,
            num_processes=_int(env, "SLURM_NTASKS"),
            process_id=_int(env, "SLURM_PROCID"),
            source="slurm",
            num_nodes=count,
        )
    return None


def launch_from_modal_cluster(
    *, rank: int, container_ips: Sequence[str], coordinator_port: int = DEFAULT_COORDINATOR_PORT
) -> LaunchSettings:
    """Settings for a Modal clustered function: one process per container, rank 0 coordinates.

    Args:
        rank: This container's cluster rank (``modal.experimental.get_cluster_info().rank``).
        container_ips: The containers' addresses ordered by rank (``container_ipv4_ips`` or
            ``container_ips``).
        coordinator_port: The port rank 0 listens on.

    Returns:
        The settings, with ``source="modal"``.

    Raises:
        TypeError: ``container_ips`` is one string rather than a sequence of addresses.
        ValueError: ``container_ips`` is empty, or ``rank`` is outside it.

    Example:
        >>> from substrax.runtime import launch_from_modal_cluster
        >>> launch_from_modal_cluster(rank=0, container_ips=["10.1.0.1", "10.1.0.2"]).coordinator_address
        '10.1.0.1:8476'
    """
    if isinstance(cast("object", container_ips), str | bytes):
        raise TypeError(
            f"container_ips={container_ips!r} is one string; pass the containers' addresses as a "
            f"sequence ordered by rank, e.g. [{container_ips!r}]"
        )
    ips = tuple(container_ips)
    if not ips:
        raise ValueError("a Modal cluster reported no container addresses")
    return _one_process_per_node(ips, rank=rank, port=coordinator_port, source="modal")


def modal_cluster_launch(env: Mapping[str, str], port: int) -> LaunchSettings | None:
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
