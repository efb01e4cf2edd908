"""Whether a smaller or a larger metric is better."""

from enum import StrEnum


class Mode(StrEnum):
    """The direction a monitored metric improves in: ``"min"`` (a loss) or ``"max"`` (accuracy).

    A plain string is accepted wherever a ``Mode`` is (``Mode("min")``), and a ``Mode`` compares
    equal to its string.

    Example:
        >>> from substrax.support import Mode
        >>> Mode("max").better(0.9, 0.8)
        True
        >>> Mode.MIN == "min"
        True
    """

    __module__ = "substrax.support"

    MIN = "min"
    MAX = "max"

    def better(self, candidate: float, incumbent: float) -> bool:
        """Whether ``candidate`` is strictly better than ``incumbent`` in this direction."""
        return candidate < incumbent if self is Mode.MIN else candidate > incumbent


def check_mode(name: str, value: object) -> Mode:
    """``value`` as a :class:`Mode` if it is one, ``"min"`` or ``"max"``.

    Raises:
        ValueError: anything else; the message names the argument ``name``.

    Example:
        >>> from substrax.support import check_mode
        >>> check_mode("best_mode", "max")
        <Mode.MAX: 'max'>
        >>> check_mode("best_mode", "mx")
        Traceback (most recent call last):
        ...
        ValueError: best_mode='mx' is not 'min' or 'max'; pass 'min' for a loss, 'max' for accuracy
    """
    if isinstance(value, str) and value in ("min", "max"):
        return Mode(value)
    raise ValueError(
        f"{name}={value!r} is not 'min' or 'max'; pass 'min' for a loss, 'max' for accuracy"
    )
