"""The errors of ``substrax.runtime``."""

from substrax.support import PicklableError, StructuredError


class RuntimeConfigurationError(PicklableError, RuntimeError):
    """A JAX setting that cannot be applied to this process (or to a child) as asked.

    Example:
        >>> from substrax.runtime import RuntimeConfigurationError
        >>> raise RuntimeConfigurationError("platforms are read when jax starts")
        Traceback (most recent call last):
        ...
        substrax.runtime.RuntimeConfigurationError: platforms are read when jax starts
    """

    __module__ = "substrax.runtime"


class _SubstraxRuntimeError(StructuredError, public_module="substrax.runtime"):
    """The base of the errors below: each shows as ``substrax.runtime``'s, where users import it."""


class XlaFlagConflictError(_SubstraxRuntimeError, RuntimeConfigurationError):
    """An XLA flag requested with a value other than the one already set.

    Attributes:
        flag: The flag's name, with its leading ``--``.
        existing: The value already set (``None`` for a bare flag).
        requested: The value asked for (``None`` for a bare flag).

    Example:
        >>> from substrax.runtime import XlaFlagConflictError
        >>> error = XlaFlagConflictError("--a", "1", "2")
        >>> str(error)
        "XLA flag --a is already set to '1' and was requested as '2'"
    """

    flag: str
    existing: str | None
    requested: str | None

    def _message(self) -> str:
        return (
            f"XLA flag {self.flag} is already set to {_shown(self.existing)} and was requested "
            f"as {_shown(self.requested)}"
        )


class EnvironmentConflictError(
    _SubstraxRuntimeError, RuntimeConfigurationError, ValueError, kw_only=True
):
    """A variable given one value in a process's ``env`` and another by a setting substrax applies.

    A value substrax must set is never replaced silently: ``child_environment`` raises it when
    ``env`` sets a variable the runtime sets to another value (``JAX_PLATFORMS=cpu`` against
    ``platforms=("tpu",)``); one that means the same (``JAX_ENABLE_X64=1`` for
    ``enable_x64=True``) is accepted. It is a ``ValueError`` too: the value given is wrong.

    Attributes:
        variable: The variable's name, e.g. ``"JAX_PLATFORMS"``.
        given: The value ``env`` gives it.
        required: The value substrax sets; ``None`` where substrax leaves it unset.
        setter: What sets it, e.g. ``"JaxRuntime.platforms"``.
        fix: Where to set it instead.

    Example:
        >>> from substrax.runtime import EnvironmentConflictError
        >>> error = EnvironmentConflictError(
        ...     variable="JAX_PLATFORMS", given="cpu", required="tpu",
        ...     setter="JaxRuntime.platforms", fix="set it in one place",
        ... )
        >>> print(error)
        env sets JAX_PLATFORMS='cpu', but JaxRuntime.platforms sets it to 'tpu'; set it in one place
    """

    variable: str
    given: str
    required: str | None
    setter: str
    fix: str

    def _message(self) -> str:
        wanted = "leaves it unset" if self.required is None else f"sets it to {self.required!r}"
        return f"env sets {self.variable}={self.given!r}, but {self.setter} {wanted}; {self.fix}"


def _shown(value: str | None) -> str:
    return "a bare flag" if value is None else repr(value)


class DistributedStartupError(_SubstraxRuntimeError, TimeoutError):
    """The processes of a ``jax.distributed`` job did not all meet within the timeout.

    Raised by ``initialize_distributed`` before jax waits on its own (jax would abort the process
    from C++ instead). A process other than 0 raises it when the coordinator never answers, when
    the coordinator refuses it (it expects another ``num_processes``, or another process has this
    process id) or when something else than a coordinator serves the port; the coordinator
    (process 0) raises it when some peers never arrive, naming those it refused.

    Attributes:
        coordinator_address: The coordinator's ``host:port``.
        process_id: The process that raised.
        num_processes: How many processes the job expects.
        arrived: The process ids that reached the coordinator, where known (the coordinator
            knows them and tells the peers that reached it); ``None`` when unknown.
        timeout: The seconds waited.
        reached: Whether this process reached the coordinator at all.
        refused: On the coordinator: ``(process id, num_processes)`` of the peers it refused
            because they were started with another process count.
        duplicated: On the coordinator: the process ids a second peer was started with (each
            refused, so some other id stays missing).
        coordinator_num_processes: On a peer the coordinator refused: the process count the
            coordinator expects (the peer's own when its process id was refused).
        foreign: Something that is neither a coordinator nor jax's coordination service
            answered on the coordinator's port.

    Example:
        >>> from substrax.runtime import DistributedStartupError
        >>> error = DistributedStartupError("10.0.0.1:8476", process_id=0, num_processes=3,
        ...                                 arrived=(0, 2), timeout=30)
        >>> error.missing
        (1,)
        >>> print(error)  # doctest: +NORMALIZE_WHITESPACE
        the coordinator at 10.0.0.1:8476 waited 30 s: 2 of 3 processes arrived (0, 2), missing
        (1,); start every process with the same coordinator address and num_processes, or raise
        initialization_timeout
    """

    coordinator_address: str
    process_id: int
    num_processes: int
    arrived: tuple[int, ...] | None
    timeout: float
    reached: bool = True
    refused: tuple[tuple[int, int], ...] = ()
    duplicated: tuple[int, ...] = ()
    coordinator_num_processes: int | None = None
    foreign: bool = False

    @property
    def missing(self) -> tuple[int, ...] | None:
        """The process ids that never reached the coordinator (nor were refused), where known."""
        if self.arrived is None:
            return None
        refused = {p for p, _ in self.refused}
        return tuple(
            p for p in range(self.num_processes) if p not in self.arrived and p not in refused
        )

    def _message(self) -> str:
        fix = (
            "start every process with the same coordinator address and num_processes, or "
            "raise initialization_timeout"
        )
        seconds = f"{self.timeout:g} s"
        this = f"process {self.process_id} of {self.num_processes}"
        if self.coordinator_num_processes is not None:
            if self.coordinator_num_processes != self.num_processes:
                return (
                    f"{this} was refused by the coordinator at {self.coordinator_address}, "
                    f"which expects {self.coordinator_num_processes} processes, not "
                    f"{self.num_processes}; start every process with the same num_processes"
                )
            return (
                f"{this} was refused by the coordinator at {self.coordinator_address}: another "
                f"process has process id {self.process_id}; give every process its own id"
            )
        if self.foreign:
            return (
                f"{this} reached {self.coordinator_address}, but something else than a "
                "coordinator serves that port (it answered neither substrax's rendezvous nor "
                "jax's coordination service); check the coordinator's address, or free the port"
            )
        if self.arrived is None and self.reached:
            return (
                f"process {self.process_id} of {self.num_processes} reached the coordinator at "
                f"{self.coordinator_address}, but the job did not gather within {seconds}; {fix}"
            )
        if self.arrived is None:
            return (
                f"process {self.process_id} of {self.num_processes} could not reach the "
                f"coordinator at {self.coordinator_address} within {seconds}; start process 0 "
                f"there first, check the address, the port and firewalls, or raise "
                f"initialization_timeout"
            )
        arrived = ", ".join(str(p) for p in self.arrived)
        where = (
            f"the coordinator at {self.coordinator_address} waited {seconds}"
            if self.process_id == 0
            else f"process {self.process_id} reached the coordinator at "
            f"{self.coordinator_address}, which gave up after {seconds}"
        )
        refused = "".join(
            f", refused process {p} (started with num_processes={n})" for p, n in self.refused
        )
        refused += "".join(f", refused a second process with id {p}" for p in self.duplicated)
        missing = f", missing {self.missing}" if self.missing else ""
        return (
            f"{where}: {len(self.arrived)} of {self.num_processes} processes arrived "
            f"({arrived}){refused}{missing}; {fix}"
        )


class CoordinatorPortError(_SubstraxRuntimeError, OSError):
    """Process 0 cannot serve the coordinator's port: our meeting point or jax's service.

    Attributes:
        address: The coordinator's ``host:port`` (the service's bind address).
        reason: What failed, e.g. the system's message or the service's last log line.

    Example:
        >>> from substrax.runtime import CoordinatorPortError
        >>> error = CoordinatorPortError("10.0.0.1:8476", "cannot listen: Address in use")
        >>> isinstance(error, OSError), error.address
        (True, '10.0.0.1:8476')
    """

    template = (
        "{reason}; is the port taken? Free it (another job's coordinator may still run on "
        "this host, or a second process of this job was started as process 0) or choose "
        "another coordinator port"
    )

    address: str
    reason: str

    def __init__(self, address: str, reason: str, errno: int | None = None) -> None:
        # by hand: ``errno`` goes to OSError's own constructor (a field of that name would
        # shadow OSError's attribute with its default)
        self.address, self.reason = address, reason
        OSError.__init__(self, *(() if errno is None else (errno,)), self._message())
