"""The errors of ``substrax.rng``."""

from collections.abc import Sequence

from substrax.support import StructuredError


class MissingRngStreamError(StructuredError, ValueError, kw_only=True):
    """An ``nnx.Rngs`` holds none of the streams a caller can draw from.

    Attributes:
        context: What asked for a key (e.g. ``"Dropout"``).
        streams: The streams it accepts, in preference order.

    Example:
        >>> from substrax.rng import MissingRngStreamError
        >>> str(MissingRngStreamError(context="dropout layer", streams=("dropout", "default")))
        "dropout layer needs an rng stream named one of ('dropout', 'default'); pass nnx.Rngs(dropout=...)"
    """

    __module__ = "substrax.rng"

    context: str
    streams: Sequence[str]

    def _message(self) -> str:
        return (
            f"{self.context} needs an rng stream named one of {self.streams}; "
            f"pass nnx.Rngs({self.streams[0] if self.streams else 'default'}=...)"
        )
