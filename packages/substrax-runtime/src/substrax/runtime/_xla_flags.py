"""Parse and merge ``XLA_FLAGS`` by flag name, never replacing a value silently."""

from collections.abc import Iterable

from substrax.support import check_type

from ._errors import XlaFlagConflictError


def _split(token: str) -> tuple[str, str | None]:
    name, sep, value = token.partition("=")
    flag = name[2:]
    if (
        not name.startswith("--")
        or not flag
        or flag.startswith("-")
        or any(c.isspace() for c in flag)
    ):
        raise ValueError(
            f"XLA flag token {token!r} is malformed; write it as --name or --name=value"
        )
    return name, (value if sep else None)


def parse_xla_flags(value: str) -> dict[str, str | None]:
    """Parse an ``XLA_FLAGS`` string into ``{"--name": value}`` in the order given.

    A bare flag maps to ``None``. A flag repeated with the same value is one entry.

    Args:
        value: The whitespace-separated flags, e.g. ``os.environ.get("XLA_FLAGS", "")``.

    Returns:
        The flags by name, in first-seen order.

    Raises:
        ValueError: A token is not ``--name`` or ``--name=value``.
        XlaFlagConflictError: A flag is repeated with a different value.

    Example:
        >>> from substrax.runtime import parse_xla_flags
        >>> parse_xla_flags("--xla_force_host_platform_device_count=8 --xla_dump_hlo_as_text")
        {'--xla_force_host_platform_device_count': '8', '--xla_dump_hlo_as_text': None}
    """
    check_type("XLA_FLAGS", value, str, "a str of flags")
    flags: dict[str, str | None] = {}
    for token in value.split():
        name, flag_value = _split(token)
        if name in flags and flags[name] != flag_value:
            raise XlaFlagConflictError(name, flags[name], flag_value)
        flags[name] = flag_value
    return flags


def merge_xla_flags(existing: str, requested: Iterable[str]) -> str:
    """Merge requested flags into an ``XLA_FLAGS`` string by name.

    Existing flags keep their positions and new ones are appended. A flag already set to the
    same value is a no-op; a different value raises instead of replacing it.

    Args:
        existing: The current ``XLA_FLAGS`` value (``""`` when unset).
        requested: Flags to add, each ``--name`` or ``--name=value``.

    Returns:
        The merged, space-separated flags.

    Raises:
        ValueError: A token is malformed.
        XlaFlagConflictError: A requested flag is already set to another value.

    Example:
        >>> from substrax.runtime import merge_xla_flags
        >>> merge_xla_flags("--a=1", ["--b", "--a=1"])
        '--a=1 --b'
    """
    flags = parse_xla_flags(existing)
    if isinstance(requested, str):
        raise TypeError(
            f"requested XLA flags must be an iterable of flags, not the string {requested!r}"
        )
    for token in requested:
        for part in token.split():
            name, value = _split(part)
            if name in flags and flags[name] != value:
                raise XlaFlagConflictError(name, flags[name], value)
            flags[name] = value
    return " ".join(name if value is None else f"{name}={value}" for name, value in flags.items())
