"""Readers for every on-disk format ever written, keyed by what a step's metadata says.

* format version 1 (substrax 0.1.16 and later, and this release): each item a PyTreeSave of
  ``{"tree": item}``, a ``metadata`` JSON record and a ``dtypes`` JSON record per step;
* legacy format 2 (substrax 0.1.0-0.1.9): one ``model`` PyTreeSave payload (no wrapper node)
  beside a JSON sidecar stamped ``checkpoint_version: "2.0"``. It is read in memory and can be
  copied into the current format with ``python -m substrax.checkpoint upgrade SRC DST``.
"""

import datetime
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, cast

from ._errors import UnsupportedCheckpointError
from ._metadata import FORMAT_NAME, CheckpointMetadata


type Layout = Literal["current", "format2"]

METADATA_ITEM: Final = "metadata"
DTYPES_ITEM: Final = "dtypes"
HOST_LEAVES: Final = "host_leaves"
"""Key of the dtypes record naming each item's NumPy leaves, ``{item: {leaf_path: kind}}``."""
_JSON_FILE: Final = "metadata"
"""The file orbax's ``JsonCheckpointHandler`` writes in an item's directory."""
_FORMAT2_VERSION: Final = "2.0"
_FORMAT2_FIELDS: Final = frozenset(
    {"step", "checkpoint_version", "loss", "metrics", "epoch", "timestamp"}
)


@dataclass(frozen=True, slots=True)
class StepRecord:
    """A step's metadata, the layout its items are stored in, and its stored dtypes (if kept).

    ``host`` names each item's NumPy leaves (``{item: {leaf_path: kind}}``); it is None for steps
    written before it was recorded, whose NumPy leaves restore as ``jax.Array``.
    ``damaged_dtypes`` is the dtypes record's file and what is wrong with it when the step has a
    ``dtypes`` item whose record is missing, empty or not a JSON object (a restore refuses it);
    a step written without a ``dtypes`` item (older releases) has ``dtypes`` None and no damage.
    """

    metadata: CheckpointMetadata
    layout: Layout
    dtypes: dict[str, dict[str, str]] | None
    host: dict[str, dict[str, str]] | None = None
    damaged_dtypes: tuple[Path, str] | None = None


def _read_json(path: Path) -> object:
    return json.loads(path.read_text())


def read_step(step_dir: Path, step: int) -> StepRecord:
    """Read the metadata of the step stored in ``step_dir`` whatever format wrote it."""
    path = step_dir / METADATA_ITEM / METADATA_ITEM
    try:
        raw = _read_json(path)
    except FileNotFoundError:
        raise UnsupportedCheckpointError(
            f"{step_dir} holds no {FORMAT_NAME} metadata record ({path} is missing); "
            "it was not written by substrax-checkpoint"
        ) from None
    except ValueError as error:
        raise UnsupportedCheckpointError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(raw, dict):
        raise UnsupportedCheckpointError(f"{path} is not a JSON object")
    raw = cast("dict[str, Any]", raw)
    if raw.get("checkpoint_version") == _FORMAT2_VERSION:
        return StepRecord(format2_metadata(raw, step), "format2", None)
    metadata = CheckpointMetadata.from_dict(raw)
    dtypes_file = step_dir / DTYPES_ITEM / _JSON_FILE
    try:
        dtypes = _read_json(dtypes_file)
    except (OSError, ValueError) as error:
        if not dtypes_file.parent.is_dir():  # written before the record existed
            return StepRecord(metadata, "current", None)
        detail = "the file is missing" if isinstance(error, OSError) else f"not JSON: {error}"
        return StepRecord(metadata, "current", None, damaged_dtypes=(dtypes_file, detail))
    if not isinstance(dtypes, dict):
        damage = (dtypes_file, "not a JSON object")
        return StepRecord(metadata, "current", None, damaged_dtypes=damage)
    record = cast("dict[str, dict[str, Any]]", dict(dtypes))  # pyright: ignore[reportUnknownArgumentType]
    host = record.pop(HOST_LEAVES, None)
    return StepRecord(metadata, "current", record, host)


def format2_metadata(raw: dict[str, Any], step: int) -> CheckpointMetadata:
    """Map a format-2 sidecar onto the current record.

    ``loss`` and ``metrics`` become metrics (loss first), ``epoch`` stays, ``timestamp`` becomes
    ``created_at`` (UTC, ISO 8601), and every other key goes to ``extra`` beside
    ``upgraded_from: {"format_version": 2}``.

    Example:
        >>> from substrax.checkpoint._formats import format2_metadata
        >>> record = format2_metadata({"step": 7, "checkpoint_version": "2.0", "loss": 0.5,
        ...     "timestamp": 0.0, "model_type": "dict"}, 7)
        >>> record.metrics, record.extra["model_type"], record.created_at[:4]
        ({'loss': 0.5}, 'dict', '1970')
    """
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
        else datetime.datetime.now(tz=datetime.UTC).isoformat()
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
