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
