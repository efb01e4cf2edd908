"""The per-step ``CheckpointMetadata`` record, its producer, and the names it reserves."""

import datetime
import functools
import importlib.metadata
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Final

from substrax.records import UNKNOWN_FIELDS_REFUSED, read_record
from substrax.support import check_float, check_int
from substrax.typing import JsonValue

from ._errors import UnsupportedCheckpointError


FORMAT_NAME: Final = "substrax-checkpoint"
CURRENT_FORMAT_VERSION: Final = 1
ITEM_NAMES: Final = ("model", "optimizer", "rng", "data_iterator", "extensions")
LIBRARY_NAMES: Final = ("jax", "flax", "orbax-checkpoint", "optax", "numpy", "substrax-checkpoint")
NONFINITE_METRICS_KEY: Final = "nonfinite_metrics"
"""The ``extra`` key under which a save records its non-finite metrics, as text (``"nan"``...)."""
RESERVED_METADATA_KEYS: Final = frozenset(
    {"format", "format_version", "step", "epoch", "items", "libraries", "producer", "metrics"}
    | {"created_at", "checkpoint_version"}
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Producer:
    """The program that wrote a checkpoint, e.g. a trainer and its version.

    Example:
        >>> from substrax.checkpoint import Producer
        >>> Producer.from_dict(Producer(name="artifex", version="1.2").to_dict())
        Producer(name='artifex', version='1.2')
    """

    __pydantic_config__ = UNKNOWN_FIELDS_REFUSED

    name: str
    version: str

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("Producer.name is empty; name the program that writes checkpoints")

    def to_dict(self) -> dict[str, str]:
        """The producer as a JSON object."""
        return {"name": self.name, "version": self.version}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Producer":
        """Read a producer from a JSON object, refusing unknown keys."""
        return read_record(cls, dict(data))


def _utc_now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).isoformat()


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointMetadata:
    """The record stored beside every step: what it holds, who wrote it, and its metrics.

    Example:
        >>> from substrax.checkpoint import CheckpointMetadata
        >>> record = CheckpointMetadata(step=10, items=("model",), metrics={"loss": 0.5})
        >>> CheckpointMetadata.from_dict(record.to_dict()) == record
        True
    """

    __pydantic_config__ = UNKNOWN_FIELDS_REFUSED

    format: str = FORMAT_NAME
    format_version: int = CURRENT_FORMAT_VERSION
    step: int
    epoch: int | None = None
    items: tuple[str, ...]
    libraries: Mapping[str, str] = field(default_factory=dict[str, str])
    producer: Producer | None = None
    metrics: Mapping[str, float] = field(default_factory=dict[str, float])
    extra: Mapping[str, JsonValue] = field(default_factory=dict[str, JsonValue])
    created_at: str = field(default_factory=_utc_now)

    def __post_init__(self) -> None:
        check_int("step", self.step, minimum=0)
        if self.epoch is not None:
            check_int("epoch", self.epoch, minimum=0)
        check_item_names(self.items)
        for name, value in self.metrics.items():
            try:
                check_float(f"metric {name!r}", value)
            except ValueError as error:
                raise ValueError(
                    f"{error}; records hold finite numbers only, so leave it out "
                    "(or put str(value) in extra)"
                ) from None
        check_extra(self.extra)

    @property
    def nonfinite_metrics(self) -> dict[str, float]:
        """The metrics saved non-finite (NaN or infinite): recorded aside, never ranked.

        ``metrics`` holds finite numbers only; a save given a NaN or infinite metric records it
        in ``extra["nonfinite_metrics"]`` as text, returned here as floats.

        Example:
            >>> from substrax.checkpoint import CheckpointMetadata
            >>> record = CheckpointMetadata(
            ...     step=1, items=("model",), extra={"nonfinite_metrics": {"loss": "inf"}}
            ... )
            >>> record.nonfinite_metrics
            {'loss': inf}
        """
        recorded = self.extra.get(NONFINITE_METRICS_KEY)
        if not isinstance(recorded, dict):
            return {}
        values: dict[str, float] = {}
        for name, text in recorded.items():
            try:
                values[name] = float(str(text))
            except ValueError:
                continue
        return values

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON object stored on disk."""
        data = asdict(self)
        data["items"] = list(self.items)
        data["libraries"] = dict(self.libraries)
        data["metrics"] = {k: float(v) for k, v in self.metrics.items()}
        data["extra"] = dict(self.extra)
        data["producer"] = None if self.producer is None else self.producer.to_dict()
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "CheckpointMetadata":
        """Read a stored record; another format or a newer version is ``UnsupportedCheckpointError``."""
        if "checkpoint_version" in data:
            raise UnsupportedCheckpointError(
                f"this record is a legacy format {data['checkpoint_version']} sidecar, not a "
                f"{FORMAT_NAME} record; run `python -m substrax.checkpoint upgrade SRC DST`"
            )
        fmt = data.get("format")
        if fmt != FORMAT_NAME:
            raise UnsupportedCheckpointError(
                f"not a {FORMAT_NAME} record: format {fmt!r}; this store reads only {FORMAT_NAME}"
            )
        version = data.get("format_version")
        if isinstance(version, int) and version > CURRENT_FORMAT_VERSION:
            raise UnsupportedCheckpointError(
                f"{FORMAT_NAME} format_version {version} is newer than this reader "
                f"(version {CURRENT_FORMAT_VERSION}); upgrade substrax-checkpoint"
            )
        return read_record(cls, dict(data))


def check_item_names(names: "tuple[str, ...] | list[str] | Mapping[str, object]") -> None:
    """Refuse an empty item set or a name outside ``ITEM_NAMES``.

    Example:
        >>> from substrax.checkpoint._metadata import check_item_names
        >>> check_item_names(("model", "rng"))
    """
    listed = list(names)
    if not listed:
        raise ValueError(f"a checkpoint needs at least one item; name one of {ITEM_NAMES}")
    unknown = [name for name in listed if name not in ITEM_NAMES]
    if unknown:
        raise ValueError(f"unknown checkpoint item(s) {unknown}; item names are {ITEM_NAMES}")


def check_extra(extra: Mapping[str, object]) -> None:
    """Refuse ``extra`` keys that collide with the record's own fields.

    Example:
        >>> from substrax.checkpoint._metadata import check_extra
        >>> check_extra({"run": "a"})
    """
    clashes = sorted(set(extra) & RESERVED_METADATA_KEYS)
    if clashes:
        raise ValueError(
            f"extra keys {clashes} are reserved by CheckpointMetadata; rename them "
            f"(reserved: {sorted(RESERVED_METADATA_KEYS)})"
        )


@functools.cache
def _library_versions() -> tuple[tuple[str, str], ...]:
    versions: list[tuple[str, str]] = []
    for name in LIBRARY_NAMES:
        try:
            versions.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            continue
    return tuple(versions)


def library_versions() -> dict[str, str]:
    """The installed versions of the libraries a checkpoint depends on.

    Example:
        >>> from substrax.checkpoint._metadata import library_versions
        >>> "jax" in library_versions()
        True
    """
    return dict(_library_versions())
