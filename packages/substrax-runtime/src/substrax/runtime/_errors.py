"""The errors of ``substrax.runtime``."""


class RuntimeConfigurationError(RuntimeError):
    """A JAX setting that cannot be applied to this process (or to a child) as asked.

    Example:
        >>> raise RuntimeConfigurationError("platforms are read when jax starts")
        Traceback (most recent call last):
        ...
        substrax.runtime._errors.RuntimeConfigurationError: platforms are read when jax starts
    """


class XlaFlagConflictError(RuntimeConfigurationError):
    """An XLA flag requested with a value other than the one already set.

    Attributes:
        flag: The flag's name, with its leading ``--``.
        existing: The value already set (``None`` for a bare flag).
        requested: The value asked for (``None`` for a bare flag).

    Example:
        >>> error = XlaFlagConflictError("--a", "1", "2")
        >>> str(error)
        "XLA flag --a is already set to '1' and was requested as '2'"
    """

    flag: str
    existing: str | None
    requested: str | None

    def __init__(self, flag: str, existing: str | None, requested: str | None) -> None:
        self.flag = flag
        self.existing = existing
        self.requested = requested
        super().__init__(
            f"XLA flag {flag} is already set to {_shown(existing)} and was requested as "
            f"{_shown(requested)}"
        )

    def __reduce__(self) -> tuple[type["XlaFlagConflictError"], tuple[str, str | None, str | None]]:
        return (type(self), (self.flag, self.existing, self.requested))


def _shown(value: str | None) -> str:
    return "a bare flag" if value is None else repr(value)
