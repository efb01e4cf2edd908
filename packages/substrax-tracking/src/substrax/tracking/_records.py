"""Record: one logging call on its way to a remote backend, and how it becomes JSON data."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal, cast

from substrax.support import is_device_array

from ._errors import NotARecordError
from ._file import json_ready
from ._media import save_image
from ._paths import file_part
from ._values import as_scalar, histogram_summary, prefetch, read_scalar, value_ready


__all__ = ["Record", "RecordKind", "Scalar", "as_record", "prefetch_scalars", "split_scalars"]

# The metrics warned about as unreadable, for a record materialized without a set of its own.
_WARNED: set[str] = set()

type RecordKind = Literal["scalars", "hyperparams", "text", "image", "histogram", "artifact"]
_KINDS = frozenset(typing.get_args(RecordKind.__value__))

type Scalar = tuple[str, Any, int, float]
"""One scalar as the per-step call queues it: (name, value, step, ``time.time()``)."""


def prefetch_scalars(records: Iterable[Record]) -> None:
    """Start copying the jax values of unmaterialized ``records`` to the host (never blocks)."""
    prefetch(
        value
        for record in records
        if record.kind == "scalars" and not record.materialized
        for value in record.payload["values"].values()
        if is_device_array(value)
    )


def as_record(item: Record | Scalar) -> Record:
    """``item`` as a record: a queued :data:`Scalar` becomes its ``scalars`` record.

    Example:
        >>> from substrax.tracking._records import as_record
        >>> as_record(("loss", 0.5, 3, 1.0)).payload
        {'values': {'loss': 0.5}}
    """
    if isinstance(item, Record):
        return item
    name, value, step, when = item
    return Record(kind="scalars", step=step, time=when, payload={"values": {name: value}})


def split_scalars(record: Record) -> list[Record]:
    """A materialized record of several scalars as one record per scalar; [] for any other.

    Example:
        >>> from substrax.tracking._records import Record, split_scalars
        >>> both = Record(kind="scalars", step=3, time=1.0, payload={"values": {"a": 1.0, "b": 2.0}},
        ...               materialized=True)
        >>> [part.payload for part in split_scalars(both)]
        [{'values': {'a': 1.0}}, {'values': {'b': 2.0}}]
    """
    values = record.payload.get("values")
    if record.kind != "scalars" or not record.materialized or not isinstance(values, dict):
        return []
    parts = cast("dict[str, Any]", values)
    if len(parts) <= 1:
        return []
    return [dataclasses.replace(record, payload={"values": {k: v}}) for k, v in parts.items()]


@dataclasses.dataclass(slots=True, kw_only=True)
class Record:
    """One logging call: kind, step, ``time.time()`` and payload (raw until :meth:`materialize`)."""

    kind: RecordKind
    step: int | None
    time: float
    payload: dict[str, Any]
    materialized: bool = False

    def ready(self) -> bool:
        """Whether :meth:`materialize` reads no jax value still being computed (never waits)."""
        values = self.payload.get("values") if self.kind == "scalars" else None
        parts = cast("dict[str, Any]", values) if isinstance(values, dict) else {}
        return self.materialized or all(map(value_ready, parts.values()))

    def materialize(
        self, media_dir: Path, *, label: str = "substrax.tracking", warned: set[str] | None = None
    ) -> Record:
        """Make the payload JSON data (floats, histogram counts, image files under ``media_dir``).

        A jax array that cannot be read (its buffer donated) is left out, warned about once per
        metric name in ``warned``.
        """
        if self.materialized:
            return self
        payload = self.payload
        if self.kind == "scalars":
            warned = _WARNED if warned is None else warned
            values = {
                key: as_scalar(key, value)
                if not is_device_array(value)
                else read_scalar(label, key, value, self.step, warned)
                for key, value in payload["values"].items()
            }
            payload = {"values": {key: v for key, v in values.items() if v is not None}}
        elif self.kind == "hyperparams":
            payload = {"params": json_ready(payload["params"])}
        elif self.kind == "histogram":
            payload = {"name": payload["name"], **histogram_summary(payload["values"])}
        elif self.kind == "image":
            name = payload["name"]
            stem = f"{file_part(name)}_step{self.step}"
            paths = [
                str(save_image(media_dir / f"{stem}_{index}_{int(self.time * 1e6)}", image))
                for index, image in enumerate(payload["images"])
            ]
            payload = {"name": name, "paths": paths}
        self.payload = payload
        self.materialized = True
        return self

    def to_json(self) -> dict[str, Any]:
        """The record as JSON data (materialize it first)."""
        return {"kind": self.kind, "step": self.step, "time": self.time, "payload": self.payload}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Record:
        """A materialized record from :meth:`to_json` data (NotARecordError for anything else)."""
        unknown = set(data) - {"kind", "step", "time", "payload"}
        if unknown or not isinstance(kind := data.get("kind"), str) or kind not in _KINDS:
            raise NotARecordError(f"not a substrax tracking record: {data!r}")
        if missing := sorted({"step", "time", "payload"} - set(data)):
            raise NotARecordError(f"a {kind} record without {' or '.join(missing)}")
        step, time, payload = data["step"], float(data["time"]), data["payload"]
        if step is not None and (type(step) is not int or step < 0):  # past 2**63: the store's
            raise NotARecordError(f"step {step!r} is not an int >= 0, as a logger writes it")
        return cls(kind=data["kind"], step=step, time=time, payload=payload, materialized=True)
