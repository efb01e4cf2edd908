import dataclasses
import enum
import json
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypedDict

import jax.numpy as jnp
import numpy as np
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


def test_non_json_data_is_a_type_error_naming_where():
    with pytest.raises(TypeError, match=r"is not JSON: name is a builtins.object"):
        read_record(Record, {"name": object()})
    with pytest.raises(TypeError, match=r"tags\['a'\] is a numpy.int64 .*\.item\(\)"):
        read_record(Record, {"name": "r", "step": 1, "loss": 0.5, "tags": {"a": np.int64(1)}})
    with pytest.raises(TypeError, match=r"shape has the key a builtins.tuple"):
        read_record(Record, {"name": "r", "step": 1, "loss": 0.5, "shape": {(1, 2): 3}})
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(TypeError, match=r"shape\[0\] contains itself"):
        read_record(Record, {"name": "r", "step": 1, "loss": 0.5, "shape": looped})


@dataclass(frozen=True, kw_only=True)
class Floats:
    __pydantic_config__ = UNKNOWN_FIELDS_REFUSED
    x: float
    maybe: float | None = None
    either: float | int = 0
    many: tuple[float, ...] = ()
    named: dict[str, float] = field(default_factory=dict)
    text_or_number: str | float = ""
    anything: dict[str, Any] = field(default_factory=dict)


def _same(a: object, b: object) -> bool:
    return repr(a) == repr(b)  # nan != nan, but their reprs agree


def test_non_finite_floats_are_written_as_strict_json_and_read_back():
    nan, inf = float("nan"), float("inf")
    record = Floats(
        x=nan, maybe=-inf, either=inf, many=(1.0, nan), named={"loss": nan}, anything={"a": inf}
    )
    dumped = dump_record(record)
    assert dumped == {
        "x": "NaN",
        "maybe": "-Infinity",
        "either": "Infinity",
        "many": [1.0, "NaN"],
        "named": {"loss": "NaN"},
        "text_or_number": "",
        "anything": {"a": "Infinity"},  # pydantic alone wrote None here
    }
    text = json.dumps(dumped, allow_nan=False)  # strict JSON
    back = read_record(Floats, json.loads(text))
    assert _same(back, dataclasses.replace(record, anything={"a": "Infinity"}))
    # What json.loads makes of a bare NaN token is read too.
    assert _same(read_record(Floats, json.loads('{"x": NaN}')).x, nan)


def test_non_finite_strings_are_read_only_where_a_float_is_due():
    assert read_record(Floats, {"x": 1, "text_or_number": "NaN"}).text_or_number == "NaN"
    with pytest.raises(ValidationError, match="step"):
        read_record(Record, {"name": "r", "step": "NaN", "loss": 0.5})
    with pytest.raises(ValidationError, match="name"):  # a str field keeps refusing a float
        read_record(Record, {"name": float("nan"), "step": 1, "loss": 0.5})
    with pytest.raises(ValidationError, match="x"):  # only the three spellings
        read_record(Floats, {"x": "nan"})
    assert _same(read_record(float, "-Infinity"), float("-inf"))


def test_an_int_too_large_for_a_float_field_is_refused_naming_it():
    with pytest.raises(ValueError, match=r"x is an int of about 401 digits.*inf"):
        read_record(Floats, {"x": 10**400})
    with pytest.raises(ValueError, match=r"named\['a'\] is an int .* -inf"):
        read_record(Floats, {"x": 1, "named": {"a": -(10**400)}})
    # An int field, or one that takes any JSON, keeps the int as it is.
    assert read_record(Floats, {"x": 1, "anything": {"a": 10**400}}).anything == {"a": 10**400}
    assert read_record(list[int], [10**400]) == [10**400]
    assert read_record(Floats, {"x": 10**308}).x == 1e308


@dataclass(frozen=True, kw_only=True)
class Counts:
    n: int
    x: float
    flag: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def test_numpy_and_jax_scalars_are_dumped_as_their_python_values():
    record = Counts(
        n=np.int64(2**60 + 1),  # pyright: ignore[reportArgumentType]
        x=np.float32(0.5),  # pyright: ignore[reportArgumentType]
        flag=np.bool_(True),  # pyright: ignore[reportArgumentType]
        extra={"a": jnp.float32(1.5), "b": np.float64("nan"), "c": np.array(3)},
    )
    dumped = dump_record(record)
    assert dumped == {
        "n": 2**60 + 1,
        "x": 0.5,
        "flag": True,
        "extra": {"a": 1.5, "b": "NaN", "c": 3},
    }
    assert type(dumped["n"]) is int
    assert read_record(Counts, dumped).n == 2**60 + 1


def test_a_value_with_no_json_form_is_refused_naming_its_field():
    with pytest.raises(TypeError, match=r"extra\['b'\] holds a NumPy array of shape \(2,\)"):
        dump_record(Counts(n=1, x=1.0, extra={"b": np.array([1, 2])}))
    with pytest.raises(TypeError, match=r"extra\['o'\]\[1\] holds a builtins.object"):
        dump_record(Counts(n=1, x=1.0, extra={"o": [1, object()]}))

    @dataclass
    class Outer:
        inner: Counts

    with pytest.raises(TypeError, match=r"inner\.n holds a JAX array of shape \(3,\)"):
        dump_record(Outer(inner=Counts(n=jnp.zeros(3), x=1.0)))  # pyright: ignore[reportArgumentType]


def test_other_types_read_strictly():
    assert read_record(list[int], [1, 2]) == [1, 2]
    with pytest.raises(ValidationError):
        read_record(list[int], ["1"])


def test_dump_record_needs_a_dataclass_instance():
    with pytest.raises(TypeError, match="dataclass instance"):
        dump_record({"a": 1})
    with pytest.raises(TypeError, match="dataclass instance"):
        dump_record(Record)


class Point(TypedDict):
    x: float
    tags: list[str]


def test_a_typed_dict_is_read_as_a_dict():
    assert read_record(Point, {"x": 1, "tags": ["a"]}) == {"x": 1.0, "tags": ["a"]}
    with pytest.raises(ValidationError, match="tags"):
        read_record(Point, {"x": 1.0})


@dataclass
class Typed:
    n: int = 0
    x: float = 0.0
    s: str = ""
    b: bytes = b""
    xs: list[float] = field(default_factory=list)


@pytest.mark.parametrize(
    ("record", "match"),
    [
        (Typed(n=2.5), r"n is a builtins\.float \(2\.5\): Input should be a valid integer"),  # pyright: ignore[reportArgumentType]
        (Typed(x="oops"), r"x is a builtins\.str \('oops'\): Input should be a valid number"),  # pyright: ignore[reportArgumentType]
        (Typed(n=np.float64("nan")), r"n is a builtins\.str \('NaN'\)"),  # pyright: ignore[reportArgumentType]
        (Typed(xs=[1.0, "a"]), r"xs\[1\] is a builtins\.str \('a'\)"),  # pyright: ignore[reportArgumentType]
        (Typed(s="a\ud800"), r"s holds the lone surrogate '\\ud800'"),
        (Typed(b=b"\xff"), r"b holds a builtins\.bytes \(b'\\xff'\), which has no JSON form"),
        (Typed(n=True), r"n is a builtins\.bool \(True\): .*integer \(a bool is not a number\)"),  # pyright: ignore[reportArgumentType]
        (Typed(x=False), r"x is a builtins\.bool \(False\): .* \(a bool is not a number\)"),  # pyright: ignore[reportArgumentType]
        (Typed(xs=[1.0, True]), r"xs\[1\] is a builtins\.bool \(True\)"),  # pyright: ignore[reportArgumentType]
        (Typed(n=np.bool_(True)), r"n is a builtins\.bool \(True\): .* \(a bool is not a number\)"),  # pyright: ignore[reportArgumentType]
        (Typed(x=10**400), r"x is an int of about 401 digits, too large for a float"),  # pyright: ignore[reportArgumentType]
        (Typed(xs=[1.0, -(10**400)]), r"xs\[1\] is an int of about 401 digits.*-inf"),  # pyright: ignore[reportArgumentType]
    ],
    ids=[
        "float-in-int",
        "str-in-float",
        "nan-in-int",
        "str-in-list",
        "surrogate",
        "bytes",
        "bool-in-int",
        "bool-in-float",
        "bool-in-list",
        "numpy-bool-in-int",
        "int-too-large-for-float",
        "int-too-large-in-list",
    ],
)
def test_what_read_record_would_refuse_is_refused_when_dumped_naming_the_field(record, match):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # refused, not dumped with a warning
        with pytest.raises(TypeError, match=match):
            dump_record(record)


def test_a_bool_in_a_bool_field_and_a_large_int_in_an_int_field_are_dumped():
    assert dump_record(Counts(n=10**400, x=1.0, flag=True)) == {
        "n": 10**400,
        "x": 1.0,
        "flag": True,
        "extra": {},
    }


def test_a_lone_surrogate_is_refused_naming_where_in_nested_data():
    with pytest.raises(TypeError, match=r"extra\['k'\]\[0\] holds the lone surrogate"):
        dump_record(Counts(n=1, x=1.0, extra={"k": ["\udc00"]}))
    with pytest.raises(ValueError, match=r"record data for Typed: s holds the lone surrogate"):
        read_record(Typed, {"s": "\ud800"})


def test_a_mismatch_that_reads_back_is_dumped_without_a_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dumped = dump_record(Typed(n=np.int64(3), xs=(1.0, np.float32(2.5))))  # pyright: ignore[reportArgumentType]
    assert dumped["n"] == 3
    assert dumped["xs"] == [1.0, 2.5]
    assert read_record(Typed, dumped).n == 3
