"""RefusalNotes: a warning the first time a backend refuses each key, naming its step and why."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import cast

from ._records import Record


__all__ = ["RefusalNotes", "refused_key"]

_logger = logging.getLogger(__name__)

_LONGEST_REASON = 500  # characters of the backend's reason shown


def refused_key(record: Record) -> str:
    """What a refused record names: its key (``metric 'loss'``), or its keys.

    Example:
        >>> from substrax.tracking._records import Record
        >>> from substrax.tracking._refusals import refused_key
        >>> refused_key(Record(kind="scalars", step=3, time=0.0, payload={"values": {"a%": 1.0}}))
        "metric 'a%'"
        >>> refused_key(Record(kind="hyperparams", step=0, time=0.0, payload={"params": {"a": 1, "b": 2}}))
        "params ['a', 'b']"
    """
    payload = record.payload
    if record.kind == "artifact":
        return f"artifact {payload.get('path')!r}"
    if record.kind in ("scalars", "hyperparams"):
        keys: object = payload.get("values" if record.kind == "scalars" else "params")
        if not isinstance(keys, dict):  # a value that could not be read: the record stands in
            return f"a {record.kind} record"
        names = list(cast("dict[str, object]", keys))
        what = "metric" if record.kind == "scalars" else "param"
        return f"{what} {names[0]!r}" if len(names) == 1 else f"{what}s {names}"
    return f"{record.kind} {payload.get('name')!r}"


class RefusalNotes:
    """Warn once per key its backend refuses for good; ``kept_in`` (``<spool>.refused``) holds every refused record."""

    def __init__(self, label: str, kept_in: Path) -> None:
        self.label, self.kept_in = label, kept_in
        self.warned: set[str] = set()

    def note(self, record: Record, reason: str) -> None:
        """Warn of ``record``'s key (refused for ``reason``) the first time it is refused."""
        key = refused_key(record)
        if key in self.warned:
            return
        self.warned.add(key)
        if len(reason) > _LONGEST_REASON:
            reason = reason[: _LONGEST_REASON - 3] + "..."
        at = (
            "" if record.step is None or record.kind == "hyperparams" else f" at step {record.step}"
        )
        _logger.warning(
            f"{self.label}: the backend refused {key}{at} ({reason}); it is kept in "
            f"{self.kept_in} with its later refused values (reported once a key)"
        )
