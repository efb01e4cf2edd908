import enum
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
from pydantic import ValidationError

from substrax.records import UNKNOWN_FIELDS_REFUSED, dump_record, read_record


class Mode(enum.Enum):
    TRAIN = "train"
    EVAL = "eval"


@dataclass(frozen=True, kw_only=True)
class Record:
    __pydantic_config__ = UNKNOWN_FIELDS_REFUSED
    name: str
    step: int
    loss: float
    shape: tuple[int, ...] = ()
    mode: Mode = Mode.TRAIN
    when: datetime | None = None
    path: Path | None = None
    tags: dict[str, str] = field(default_factory=dict)


def test_round_trip():
    record = Record(
        name="r",
        step=3,
        loss=0.5,
        shape=(2, 3),
        mode=Mode.EVAL,
        when=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
        path=Path("/tmp/x"),
        tags={"a": "b"},
    )
    dumped = dump_record(record)
    assert dumped["shape"] == [2, 3]
    assert dumped["mode"] == "eval"
    assert dumped["when"] == "2026-01-02T03:04:05Z"
    assert dumped["path"] == "/tmp/x"
    assert read_record(Record, dumped) == record


def test_an_int_is_accepted_for_a_float():
    assert read_record(Record, {"name": "r", "step": 1, "loss": 1}).loss == 1.0


@pytest.mark.parametrize(
    "data",
    [
        {"name": "r", "step": "1", "loss": 0.5},  # number from a string
        {"name": "r", "step": True, "loss": 0.5},  # a bool is not a number
        {"name": "r", "step": 1, "loss": "0.5"},
        {"name": "r", "step": 1.5, "loss": 0.5},
        {"name": "r", "step": 1, "loss": 0.5, "stpe": 2},  # unknown field
        {"name": "r", "loss": 0.5},  # missing field
        {"name": "r", "step": 1, "loss": 0.5, "mode": "TRAIN"},  # enums by value
        {"name": 3, "step": 1, "loss": 0.5},
    ],
)
def test_strict_json_semantics(data):
    with pytest.raises(ValidationError):
        read_record(Record, data)


def test_validation_error_is_a_value_error():
    with pytest.raises(ValueError, match="stpe"):
        read_record(Record, {"name": "r", "step": 1, "loss": 0.5, "stpe": 2})


def test_non_json_data_is_a_type_error():
    with pytest.raises(TypeError, match="is not JSON"):
        read_record(Record, {"name": "r", "step": 1, "loss": float("nan")})
    with pytest.raises(TypeError, match="is not JSON"):
        read_record(Record, {"name": object()})


def test_other_types_read_strictly():
    assert read_record(list[int], [1, 2]) == [1, 2]
    with pytest.raises(ValidationError):
        read_record(list[int], ["1"])


def test_dump_record_needs_a_dataclass_instance():
    with pytest.raises(TypeError, match="dataclass instance"):
        dump_record({"a": 1})
    with pytest.raises(TypeError, match="dataclass instance"):
        dump_record(Record)
