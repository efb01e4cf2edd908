"""Parse and merge ``XLA_FLAGS`` by flag name, never replacing a value silently.

Values are read as XLA's own parser reads them: ``--name=value`` up to the next whitespace, or
``--name="a value"`` (``'a value'``) in quotes, a backslash escaping the next character inside
double quotes.
"""

from collections.abc import Iterable, Iterator

from substrax.support import check_type

from ._errors import XlaFlagConflictError


HOST_DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
"""The XLA flag that emulates CPU devices, the setting ``JAX_NUM_CPU_DEVICES`` also makes."""


def _malformed(token: str, why: str = "write it as --name or --name=value") -> ValueError:
    return ValueError(f"XLA flag token {token!r} is malformed; {why}")


def _check_name(name: str, token: str) -> None:
    flag = name[2:]
    if (
        not name.startswith("--")
        or not flag
        or flag.startswith("-")
        or any(c.isspace() for c in flag)
    ):
        raise _malformed(token)


def _quoted(text: str, start: int) -> tuple[str, int]:
    """The quoted value opening at ``text[start]`` and the index just past its closing quote."""
    quote = text[start]
    value: list[str] = []
    index = start + 1
    while index < len(text) and text[index] != quote:
        if quote == '"' and text[index] == "\\" and index + 1 < len(text):
            index += 1
        value.append(text[index])
        index += 1
    if index >= len(text):
        raise _malformed(text[:index], f"its value opens a {quote} quote it never closes")
    return "".join(value), index + 1


def _tokens(text: str) -> Iterator[tuple[str, str | None]]:
    """``(name, value)`` of each flag in ``text``; quotes around a value are removed."""
    index = 0
    while True:
        while index < len(text) and text[index].isspace():
            index += 1
        if index >= len(text):
            return
        start = index
        while index < len(text) and not text[index].isspace() and text[index] != "=":
            index += 1
        name = text[start:index]
        value: str | None = None
        if index < len(text) and text[index] == "=":
            if index + 1 < len(text) and text[index + 1] in "\"'":
                value, index = _quoted(text, index + 1)
                if index < len(text) and not text[index].isspace():
                    raise _malformed(
                        text[start:].split(maxsplit=1)[0],
                        "put a space after the quoted value's end",
                    )
            else:
                end = index + 1
                while end < len(text) and not text[end].isspace():
                    end += 1
                value, index = text[index + 1 : end], end
        _check_name(name, text[start:index])
        yield name, value


def render_xla_flag(name: str, value: str | None) -> str:
    """One flag as ``XLA_FLAGS`` holds it: a value with spaces or a leading quote in quotes.

    Example:
        >>> from substrax.runtime._xla_flags import render_xla_flag
        >>> render_xla_flag("--xla_dump_to", "/tmp/a b"), render_xla_flag("--a", None)
        ('--xla_dump_to="/tmp/a b"', '--a')
    """
    if value is None:
        return name
    if any(c.isspace() for c in value) or value.startswith(("'", '"')):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"')
        return f'{name}="{escaped}"'
    return f"{name}={value}"


def _reads_as(value: str | None) -> str | None:
    """A flag's value as XLA reads it: a bare flag, ``true``, ``True`` and ``1`` are one."""
    if value is None or value.lower() in ("true", "1"):
        return "true"
    return "false" if value.lower() in ("false", "0") else value


def _same(first: str | None, second: str | None) -> bool:
    return first == second or _reads_as(first) == _reads_as(second)


def parse_xla_flags(value: str) -> dict[str, str | None]:
    """Parse an ``XLA_FLAGS`` string into ``{"--name": value}`` in the order given.

    A bare flag maps to ``None``. A flag repeated with the same value (a bare flag, ``=true``
    and ``=1`` are one, as XLA reads them) is one entry, as first given. A value in
    double or single quotes (``--xla_dump_to="/tmp/a b"``) is read without them, as XLA reads it.

    Args:
        value: The whitespace-separated flags, e.g. ``os.environ.get("XLA_FLAGS", "")``.

    Returns:
        The flags by name, in first-seen order.

    Raises:
        ValueError: A token is not ``--name`` or ``--name=value``, or a quote is not closed.
        XlaFlagConflictError: A flag is repeated with a different value.

    Example:
        >>> from substrax.runtime import parse_xla_flags
        >>> parse_xla_flags("--xla_force_host_platform_device_count=8 --xla_dump_hlo_as_text")
        {'--xla_force_host_platform_device_count': '8', '--xla_dump_hlo_as_text': None}
        >>> parse_xla_flags('--xla_dump_to="/tmp/a b"')
        {'--xla_dump_to': '/tmp/a b'}
    """
    check_type("XLA_FLAGS", value, str, "a str of flags")
    flags: dict[str, str | None] = {}
    for name, flag_value in _tokens(value):
        if name in flags and not _same(flags[name], flag_value):
            raise XlaFlagConflictError(name, flags[name], flag_value)
        flags.setdefault(name, flag_value)
    return flags


def merge_xla_flags(existing: str, requested: Iterable[str]) -> str:
    """Merge requested flags into an ``XLA_FLAGS`` string by name.

    Existing flags keep their positions and new ones are appended. A flag already set to the
    same value is a no-op; a different value raises instead of replacing it. A value with
    spaces is written in double quotes.

    Args:
        existing: The current ``XLA_FLAGS`` value (``""`` when unset).
        requested: Flags to add, each ``--name``, ``--name=value`` or ``--name="a value"``.

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
        for name, value in _tokens(token):
            if name in flags and not _same(flags[name], value):
                raise XlaFlagConflictError(name, flags[name], value)
            flags.setdefault(name, value)
    return " ".join(render_xla_flag(name, value) for name, value in flags.items())


def bad_device_count_flag(flag: str | None, where: str) -> str | None:
    """Why the device-count flag's value ``flag`` is no count of CPU devices, or ``None``.

    XLA takes ``0`` and then jax fails as its CPU backend starts ("Could not determine
    process_index"); a word stops XLA with a listing of every flag. Neither names the flag.

    Example:
        >>> from substrax.runtime._xla_flags import bad_device_count_flag
        >>> bad_device_count_flag("8", "xla_flags") is None
        True
        >>> print(bad_device_count_flag("0", "xla_flags"))
        --xla_force_host_platform_device_count=0 (xla_flags) is not a number of emulated CPU devices (a whole number, at least 1); set it to one, drop the flag, or pass JaxRuntime(cpu_devices=...)
    """
    if flag is None or (flag.strip().isdecimal() and int(flag) >= 1):
        return None
    return (
        f"{HOST_DEVICE_COUNT_FLAG}={flag} ({where}) is not a number of emulated CPU devices (a "
        "whole number, at least 1); set it to one, drop the flag, or pass "
        "JaxRuntime(cpu_devices=...)"
    )


def device_count_conflict(
    count: str | None, flag: str | None, *, count_from: str, flag_from: str
) -> str | None:
    """Why ``count`` (``JAX_NUM_CPU_DEVICES``) and the device-count flag's ``flag`` disagree.

    They are one setting: jax takes ``JAX_NUM_CPU_DEVICES`` when it is set (not ``-1``) and the
    flag's count only otherwise, so a flag asking for another count would be ignored.

    Args:
        count: ``JAX_NUM_CPU_DEVICES``'s value, or ``None`` when unset.
        flag: ``--xla_force_host_platform_device_count``'s value, or ``None`` when unset.
        count_from: Where the count comes from, for the message.
        flag_from: Where the flag comes from, for the message.

    Returns:
        ``None`` when they agree (or either is unset), else the refusal's text.

    Example:
        >>> from substrax.runtime._xla_flags import device_count_conflict
        >>> device_count_conflict("8", "8", count_from="the environment", flag_from="xla_flags")
        >>> print(device_count_conflict("8", "4", count_from="the environment", flag_from="xla_flags"))
        JAX_NUM_CPU_DEVICES=8 (the environment) and --xla_force_host_platform_device_count=4 (xla_flags) ask for two CPU device counts, and jax would take JAX_NUM_CPU_DEVICES; ask once: JaxRuntime(cpu_devices=...), without the flag
    """
    if count is None or flag is None or count.strip() == "-1":
        return None
    try:
        if int(count) == int(flag):
            return None
    except ValueError:
        if count.strip() == flag.strip():
            return None
    return (
        f"JAX_NUM_CPU_DEVICES={count.strip()} ({count_from}) and {HOST_DEVICE_COUNT_FLAG}={flag} "
        f"({flag_from}) ask for two CPU device counts, and jax would take JAX_NUM_CPU_DEVICES; "
        "ask once: JaxRuntime(cpu_devices=...), without the flag"
    )
