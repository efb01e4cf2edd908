"""The per-step ``CheckpointMetadata`` record, read from every on-disk format.

Format 1 stores each item as ``{"tree": item}`` beside ``metadata`` and ``dtypes`` records; the
legacy format 2 (a ``model`` payload, a ``checkpoint_version: "2.0"`` sidecar) is read in memory.
"""

import contextlib
import datetime
import functools
import importlib.metadata
import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, cast

from substrax.records import UNKNOWN_FIELDS_REFUSED, read_record
from substrax.support import check_float, check_int
from substrax.typing import JsonValue

from ._extra import NONFINITE_METRICS_KEY, check_record_extra, check_text
from ._read_errors import UnsupportedCheckpointError, unreadable_record


FORMAT_NAME: Final = "substrax-checkpoint"
CURRENT_FORMAT_VERSION: Final = 1
ITEM_NAMES: Final = ("model", "optimizer", "rng", "data_iterator", "extensions")
LIBRARY_NAMES: Final = ("jax", "flax", "orbax-checkpoint", "optax", "numpy", "substrax-checkpoint")

type Layout = Literal["current", "format2"]

METADATA_ITEM: Final = "metadata"
DTYPES_ITEM: Final = "dtypes"
WRAPPER: Final = "tree"
"""Every item is stored as ``{"tree": item}`` so that a bare array (a lone PRNG key) is a PyTree."""
HOST_LEAVES: Final = "host_leaves"
"""Key of the dtypes record naming each item's NumPy leaves, ``{item: {leaf_path: kind}}``."""
SHAPES: Final = "shapes"  # key of the dtypes record holding ``{item: {leaf_path: [dims]}}``
_JSON_FILE: Final = "metadata"  # the file orbax's JsonCheckpointHandler writes in an item's dir
_FORMAT2_VERSION: Final = "2.0"
_FORMAT2_FIELDS: Final = frozenset(
    {"step", "checkpoint_version", "loss", "metrics", "epoch", "timestamp"}
)


@dataclass(frozen=True, slots=True)  # by position too, in 0.1.22's order
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
        check_text("Producer.name", self.name)
        check_text("Producer.version", self.version)

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
        extra = cast("object", self.extra)  # user input: check_extra below says if not a mapping
        nonfinite = extra.get(NONFINITE_METRICS_KEY) if isinstance(extra, Mapping) else None
        names: list[object] = [*self.metrics]
        names += (
            cast("Mapping[object, object]", nonfinite) if isinstance(nonfinite, Mapping) else ()
        )
        for name in names:  # the nonfinite record's too: named as metrics, not as extra's keys
            if isinstance(name, str):
                check_text("a metric name", name)
        for name, value in self.metrics.items():
            try:
                check_float(f"metric {name!r}", value)
            except ValueError as error:
                raise ValueError(
                    f"{error}; records hold finite numbers only, so leave it out "
                    "(or put str(value) in extra)"
                ) from None
        check_record_extra(self.extra)  # the record holds a save's own NONFINITE_METRICS_KEY

    @property
    def nonfinite_metrics(self) -> dict[str, float]:
        """The metrics saved non-finite (recorded as text in ``extra``, never ranked), as floats.

        Example:
            >>> from substrax.checkpoint import CheckpointMetadata
            >>> extra = {"nonfinite_metrics": {"loss": "inf"}}
            >>> CheckpointMetadata(step=1, items=("model",), extra=extra).nonfinite_metrics
            {'loss': inf}
        """
        recorded = self.extra.get(NONFINITE_METRICS_KEY)
        if not isinstance(recorded, dict):
            return {}
        values: dict[str, float] = {}
        for name, text in recorded.items():
            with contextlib.suppress(ValueError):
                values[name] = float(str(text))
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
        if isinstance(version, int) and not 1 <= version <= CURRENT_FORMAT_VERSION:
            why = "newer than this reader" if version > 1 else "below the first, 1 (damaged)"
            raise UnsupportedCheckpointError(
                f"{FORMAT_NAME} format_version {version} is {why}; this reader reads versions 1 "
                f"to {CURRENT_FORMAT_VERSION} (a newer one: upgrade substrax-checkpoint)"
            )
        return read_record(cls, dict(data))


def check_item_names(names: "tuple[str, ...] | list[str] | Mapping[str, object]") -> None:
    """Refuse an empty item set or a name outside ``ITEM_NAMES``."""
    listed = list(names)
    if not listed:
        raise ValueError(f"a checkpoint needs at least one item; name one of {ITEM_NAMES}")
    unknown = [name for name in listed if name not in ITEM_NAMES]
    if unknown:
        raise ValueError(f"unknown checkpoint item(s) {unknown}; item names are {ITEM_NAMES}")


@functools.cache
def _library_versions() -> tuple[tuple[str, str], ...]:
    versions: list[tuple[str, str]] = []
    for name in LIBRARY_NAMES:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            versions.append((name, importlib.metadata.version(name)))
    return tuple(versions)


def library_versions() -> dict[str, str]:
    """The installed versions of ``LIBRARY_NAMES`` a save records (a fresh dict each call).

    Example:
        >>> from substrax.checkpoint import library_versions
        >>> "jax" in library_versions()
        True
    """
    return dict(_library_versions())


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step's metadata, the layout its items are stored in, and its stored dtypes (if kept).

    ``host`` names each item's NumPy leaves (None before it was recorded: they restore as
    ``jax.Array``); ``damaged_dtypes`` is the dtypes record's file and what is wrong with it.
    """

    metadata: CheckpointMetadata
    layout: Layout
    dtypes: dict[str, dict[str, str]] | None
    host: dict[str, dict[str, str]] | None = None
    damaged_dtypes: tuple[Path, str] | None = None
    shapes: dict[str, dict[str, list[int]]] | None = None  # None: written before it was kept


def read_step(step_dir: Path, step: int) -> StepRecord:
    """Read the metadata of the step stored in ``step_dir`` whatever format wrote it."""
    path = step_dir / METADATA_ITEM / _JSON_FILE
    try:
        raw: object = json.loads(path.read_text())
    except FileNotFoundError:
        raise UnsupportedCheckpointError(
            f"{step_dir} holds no {FORMAT_NAME} metadata record ({path} is missing): it was "
            "not written by substrax-checkpoint, or it lost its record"
        ) from None
    except ValueError as error:
        raise UnsupportedCheckpointError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise UnsupportedCheckpointError(f"{path} is not a JSON object")
    raw = cast("dict[str, Any]", raw)
    try:
        if raw.get("checkpoint_version") == _FORMAT2_VERSION:
            return StepRecord(format2_metadata(raw, step), "format2", None)
        metadata = CheckpointMetadata.from_dict(raw)
    except UnsupportedCheckpointError:
        raise
    except (ValueError, TypeError) as error:  # pydantic's ValidationError is a ValueError
        raise unreadable_record(path, step, error) from error
    dtypes_file = step_dir / DTYPES_ITEM / _JSON_FILE
    try:
        dtypes: object = json.loads(dtypes_file.read_text())
    except (OSError, ValueError) as error:
        if not dtypes_file.parent.is_dir():  # written before the record existed
            return StepRecord(metadata, "current", None)
        detail = "the file is missing" if isinstance(error, OSError) else f"not JSON: {error}"
        return StepRecord(metadata, "current", None, damaged_dtypes=(dtypes_file, detail))
    if not isinstance(dtypes, dict):
        damage = (dtypes_file, "not a JSON object")
        return StepRecord(metadata, "current", None, damaged_dtypes=damage)
    record = cast("dict[str, dict[str, Any]]", dict(dtypes))  # pyright: ignore[reportUnknownArgumentType]
    host, shapes = record.pop(HOST_LEAVES, None), record.pop(SHAPES, None)
    return StepRecord(metadata, "current", record, host, shapes=shapes)


def format2_metadata(raw: dict[str, Any], step: int) -> CheckpointMetadata:
    """Map a format-2 sidecar onto the current record (its other keys go to ``extra``)."""
    metrics: dict[str, float] = {}
    if isinstance(raw.get("loss"), int | float):
        metrics["loss"] = float(raw["loss"])
    extra_metrics = raw.get("metrics")
    if isinstance(extra_metrics, dict):
        for key, value in extra_metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                metrics.setdefault(str(key), float(value))
    timestamp = raw.get("timestamp")
    created = (
        datetime.datetime.fromtimestamp(float(timestamp), tz=datetime.UTC).isoformat()
        if isinstance(timestamp, int | float)
        else _utc_now()
    )
    extra: dict[str, Any] = {k: v for k, v in raw.items() if k not in _FORMAT2_FIELDS}
    extra["upgraded_from"] = {"format_version": 2}
    epoch = raw.get("epoch")
    return CheckpointMetadata(
        step=int(raw.get("step", step)),
        epoch=epoch if isinstance(epoch, int) else None,
        items=("model",),
        metrics=metrics,
        extra=extra,
        created_at=created,
    )
