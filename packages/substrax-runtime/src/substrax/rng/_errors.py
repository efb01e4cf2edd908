"""The errors of ``substrax.rng``."""

from collections.abc import Sequence

from substrax.support import PicklableError


class MissingRngStreamError(PicklableError, ValueError):
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
    streams: tuple[str, ...]

    def __init__(self, *, context: str, streams: Sequence[str]) -> None:
        self.context = context
        self.streams = tuple(streams)
        super().__init__(
            f"{context} needs an rng stream named one of {self.streams}; "
            f"pass nnx.Rngs({self.streams[0] if self.streams else 'default'}=...)"
        )
