"""Dump a record as strict JSON data that ``read_record`` reads back."""

# Records hold user values: the isinstance checks below are the validation.
# pyright: reportUnnecessaryIsInstance=false

import dataclasses
import functools
import math
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

from ._records import describe_value, lone_surrogate, path_step, read_record, type_adapter, where_in


if TYPE_CHECKING:
    from pydantic_core import SchemaSerializer


@functools.cache
def _serializer(record_type: type) -> "SchemaSerializer":
    # The record's own schema, serialised keeping NaN and infinities as floats wherever they are
    # (pydantic's default makes them None where a field is Any): _strict_json spells them.
    from pydantic import BaseModel  # noqa: PLC0415 - pydantic only when a record is dumped
    from pydantic_core import SchemaSerializer  # noqa: PLC0415

    if issubclass(record_type, BaseModel):
        schema = record_type.__pydantic_core_schema__
    else:
        schema = type_adapter(record_type).core_schema
    return SchemaSerializer(schema, {"ser_json_inf_nan": "constants"})


def dump_record(record: object) -> dict[str, Any]:
    """Dump a dataclass (or pydantic model) record as JSON-ready data.

    Strict JSON: ``json.dumps(dump_record(r), allow_nan=False)`` works. A non-finite float is
    written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (as the tracking log
    writes them), which ``read_record`` reads back as the float where the field is a float.
    A NumPy or JAX scalar (``np.int64(3)``, ``jnp.float32(1.5)``) is written as its Python
    value. What ``read_record`` would refuse is refused here, naming the field: a value not of
    its field's type (``2.5`` in an ``int`` field, ``"oops"`` in a ``float`` one, a bool in
    either: a bool is not a number), an int too large for its ``float`` field, a str holding a
    lone surrogate, bytes that are no UTF-8.

    Args:
        record: A dataclass instance or pydantic model instance.

    Returns:
        A dict of JSON values (paths and datetimes as strings, enums by value).

    Raises:
        TypeError: ``record`` is not a dataclass or pydantic model instance, or a value in it
            has no JSON form (an array, a traced value, an arbitrary object, a lone surrogate)
            or would not read back as its field's type, naming the field.

    Example:
        >>> from dataclasses import dataclass
        >>> from substrax.records import dump_record
        >>> @dataclass
        ... class Point:
        ...     x: float
        >>> dump_record(Point(x=1.5))
        {'x': 1.5}
        >>> dump_record(Point(x=float("nan")))
        {'x': 'NaN'}
    """
    from pydantic import BaseModel  # noqa: PLC0415 - pydantic only when a record is dumped
    from pydantic_core import PydanticSerializationError  # noqa: PLC0415

    if not isinstance(record, BaseModel) and (
        not dataclasses.is_dataclass(record) or isinstance(record, type)
    ):
        raise TypeError(f"dump_record takes a dataclass instance, got {type(record).__name__}")
    serializer = _serializer(type(record))
    try:  # the common case: no mismatch, nothing to convert in a typed field
        dumped = serializer.to_python(record, mode="json", warnings="error", fallback=_scalar)
    except (PydanticSerializationError, TypeError, UnicodeDecodeError, OverflowError):
        # Find what failed: an array or object with no JSON form is refused, naming its field;
        # NumPy or JAX scalars in typed fields are converted without pydantic's warnings, and
        # a value not of its field's type is refused where read_record would refuse it.
        _check_leaves(record)
        try:
            dumped = serializer.to_python(record, mode="json", warnings=False, fallback=_scalar)
        except OverflowError:  # an int too large for its float field: read_record names it
            _refuse_unreadable(record, _python_as_json(serializer, record))
            raise TypeError(
                f"dump_record: {type(record).__qualname__} holds an int too large "
                "for a float field; store a number within ±1.8e308"
            ) from None
        except (PydanticSerializationError, TypeError) as error:
            raise TypeError(f"dump_record: {error}") from error
        strict = cast("dict[str, Any]", _strict_json(dumped, ""))
        _refuse_unreadable(record, strict)
        return strict
    strict = cast("dict[str, Any]", _strict_json(dumped, ""))
    if any(type(leaf) is bool for _, leaf in _leaves(record, "", set())):
        # pydantic writes a bool in an int or float field as 1 or 1.0, which read_record refuses
        _refuse_unreadable(record, _python_as_json(serializer, record))
    return strict


def _python_as_json(serializer: "SchemaSerializer", record: object) -> dict[str, Any]:
    """``record`` dumped keeping ints and bools as they are (JSON mode makes numbers of them)."""
    from pydantic_core import to_jsonable_python  # noqa: PLC0415

    dumped = serializer.to_python(record, warnings=False, fallback=_scalar)
    return cast(
        "dict[str, Any]", _strict_json(to_jsonable_python(dumped, inf_nan_mode="constants"), "")
    )


def _refuse_unreadable(record: object, dumped: dict[str, Any]) -> None:
    """TypeError naming each value of ``dumped`` that ``read_record`` would refuse."""
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        read_record(type(record), dumped)
    except ValidationError as error:
        found = "; ".join(
            f"{where_in(functools.reduce(path_step, d['loc'], ''))} is "
            f"{describe_value(d['input'])}: {d['msg']}"
            + (" (a bool is not a number)" if isinstance(d["input"], bool) else "")
            for d in error.errors(include_url=False)
        )
        raise TypeError(
            f"dump_record: {type(record).__qualname__} would not read back ({found}); store "
            "values of the fields' types"
        ) from None
    except ValueError as error:  # an int too large for its float field, named
        raise TypeError(f"dump_record: {error}") from None


def _array_kinds() -> tuple[type, ...]:
    """NumPy's and JAX's array and scalar types, where loaded (this module imports neither)."""
    kinds: list[type] = []
    if (np := sys.modules.get("numpy")) is not None:
        kinds += [np.generic, np.ndarray]
    if (jax := sys.modules.get("jax")) is not None:
        kinds.append(jax.Array)
    return tuple(kinds)


def _is_scalar(value: object) -> bool:
    """A concrete NumPy or JAX value of shape ()."""
    jax = sys.modules.get("jax")
    if jax is not None and isinstance(value, jax.core.Tracer):
        return False
    return isinstance(value, _array_kinds()) and getattr(value, "shape", None) == ()


def _scalar(value: object) -> object:
    """Pydantic's fallback: a NumPy or JAX scalar as its Python value."""
    if _is_scalar(value):
        return cast("Any", value).item()
    raise TypeError(f"{describe_value(value)} has no JSON form")


def _check_leaves(record: object) -> bool:
    """Whether ``record`` holds NumPy or JAX scalars; TypeError naming a value with no JSON form."""
    from pydantic_core import to_jsonable_python  # noqa: PLC0415

    scalars = False
    kinds = _array_kinds()
    for path, leaf in _leaves(record, "", set()):
        if isinstance(leaf, kinds):
            if not _is_scalar(leaf):
                kind = "a NumPy" if type(leaf).__module__.startswith("numpy") else "a JAX"
                shape = getattr(leaf, "shape", "?")
                raise TypeError(
                    f"dump_record: {where_in(path)} holds {kind} array of shape {shape} (or a traced "
                    "value), not a JSON value; store a list (array.tolist()) or a scalar, read "
                    "outside jit"
                )
            scalars = True
            continue
        try:
            to_jsonable_python(leaf, inf_nan_mode="constants")
        except Exception as error:  # pydantic's reason, named with the field
            raise TypeError(
                f"dump_record: {where_in(path)} holds {describe_value(leaf)}, which has no JSON form "
                f"({error}); store a JSON value (str, number, bool, list, dict) instead"
            ) from error
    return scalars


def _leaves(value: object, path: str, open_ids: set[int]) -> Iterator[tuple[str, object]]:
    """Each value in a record that is no record, mapping or collection, with where it is."""
    from pydantic import BaseModel  # noqa: PLC0415

    fields: list[str] | None = None
    if isinstance(value, BaseModel):
        fields = [*type(value).model_fields, *(value.model_extra or {})]
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [f.name for f in dataclasses.fields(value)]
    if fields is not None:
        children = [(name, getattr(value, name)) for name in fields]
    elif isinstance(value, Mapping):
        children = list(cast("Mapping[object, object]", value).items())
    elif isinstance(value, list | tuple | set | frozenset):
        children = list(enumerate(cast("list[object]", value)))
    else:
        yield path, value
        return
    if id(value) in open_ids:
        return
    open_ids.add(id(value))
    for part, child in children:
        yield from _leaves(child, path_step(path, part, attribute=fields is not None), open_ids)
    open_ids.discard(id(value))


def _strict_json(value: object, path: str) -> object:
    """``value`` with non-finite floats as text; TypeError naming a lone surrogate's place."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, str) and (reason := lone_surrogate(value, path)):
        raise TypeError(f"dump_record: {reason}")
    if isinstance(value, dict):
        items = cast("dict[str, object]", value).items()
        return {k: _strict_json(v, path_step(path, k)) for k, v in items}
    if isinstance(value, list):
        items = enumerate(cast("list[object]", value))
        return [_strict_json(v, path_step(path, i)) for i, v in items]
    return value
