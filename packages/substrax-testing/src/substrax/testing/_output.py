"""How a child run is named and its stderr shortened in messages."""

STDERR_TAIL_LINES = 40
_SHOWN_CODE = 60


def tail(text: str, lines: int = STDERR_TAIL_LINES) -> str:
    """The last ``lines`` lines of ``text``."""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def describe(argv: tuple[str, ...]) -> str:
    """Name a child run briefly: the script path, or the first line of ``-c`` code."""
    match argv:
        case (_, "-c", code, *_):
            first = code.strip().splitlines()[0] if code.strip() else ""
            shown = first if len(first) <= _SHOWN_CODE else first[: _SHOWN_CODE - 3] + "..."
            return f"python -c {shown!r}"
        case (_, script, *_):
            return script
        case _:
            return " ".join(argv)
