"""Typed JSON records read strictly: unknown fields refused, no coercion from strings."""

# record_type may be a generic alias (list[int]) at run time, and records hold user values:
# the isinstance checks below are the validation.
# pyright: reportUnnecessaryIsInstance=false

import dataclasses
import functools
import json
import math
import re
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final, cast


if TYPE_CHECKING:
    from pydantic import ConfigDict, TypeAdapter
    from pydantic_core import SchemaSerializer


# A plain dict (pydantic's ConfigDict is a TypedDict), so that importing this module imports no
# pydantic: it is loaded when a record is first read or dumped.
UNKNOWN_FIELDS_REFUSED: "ConfigDict" = {"extra": "forbid"}
"""Set as a record dataclass's ``__pydantic_config__`` so a misspelled key is refused."""

NON_FINITE_TEXT: Final = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
"""How a record writes a non-finite float (strict JSON has none), as the tracking log does."""

# A float is at most ~1.8e308: an int of 309 digits or more may be too large for one.
_LONG_INT: Final = re.compile(r"\d{309}")


@functools.cache
def _adapter(record_type: object) -> "TypeAdapter[Any]":
    from pydantic import TypeAdapter  # noqa: PLC0415 - pydantic only when a record is validated

    return TypeAdapter(cast("Any", record_type))


@functools.cache
def _serializer(record_type: type) -> "SchemaSerializer":
    # The record's own schema, serialised keeping NaN and infinities as floats wherever they are
    # (pydantic's default makes them None where a field is Any): _non_finite_as_text spells them.
    from pydantic import BaseModel  # noqa: PLC0415 - pydantic only when a record is dumped
    from pydantic_core import SchemaSerializer  # noqa: PLC0415

    if issubclass(record_type, BaseModel):
        schema = record_type.__pydantic_core_schema__
    else:
        schema = _adapter(record_type).core_schema
    return SchemaSerializer(schema, {"ser_json_inf_nan": "constants"})


def _type_name(record_type: object) -> str:
    return record_type.__qualname__ if isinstance(record_type, type) else repr(record_type)


def _step(path: str, part: object, *, attribute: bool = False) -> str:
    """``path`` one step deeper: a field's name at the top, then ``['key']``, ``[index]``, ``.field``."""
    if not path and isinstance(part, str):
        return part
    return f"{path}.{part}" if attribute else f"{path}[{part!r}]"


def _where(path: str) -> str:
    return path or "the data itself"


def _describe(value: object) -> str:
    kind = type(value)
    return f"a {kind.__module__}.{kind.__qualname__} ({value!r:.60})"


def read_record[T](record_type: type[T], data: object) -> T:
    """Validate JSON-shaped ``data`` as ``record_type`` with strict JSON semantics.

    ``data`` goes through ``json.dumps`` and pydantic's strict JSON mode: numbers are never
    read from strings, a bool is not a number, an int is accepted for a float, tuples come from
    arrays, enums are read by value and datetimes from ISO strings. A record whose
    ``__pydantic_config__`` is ``UNKNOWN_FIELDS_REFUSED`` refuses unknown keys.

    Non-finite floats read back as ``dump_record`` writes them: where a field takes a float,
    the strings ``"NaN"``, ``"Infinity"`` and ``"-Infinity"`` are read as those floats (the one
    exception to "no numbers from strings"); a field that also takes strings keeps the string.
    Python's ``float("nan")`` (what ``json.loads`` makes of a bare ``NaN``) is accepted too. An
    int too large for a float field (it would read as ``inf``) is refused.

    Args:
        record_type: The record's type (a dataclass, pydantic model, TypedDict, ...).
        data: The decoded JSON (e.g. ``json.loads(text)``).

    Returns:
        The validated record.

    Raises:
        pydantic.ValidationError: ``data`` does not fit (a ``ValueError``), naming each field.
        ValueError: an int in ``data`` is too large for the float field it is read into.
        TypeError: ``data`` is not JSON-serialisable (naming where), or validation returned
            another type.

    Example:
        >>> from dataclasses import dataclass
        >>> from substrax.records import UNKNOWN_FIELDS_REFUSED, read_record
        >>> @dataclass(frozen=True)
        ... class Point:
        ...     __pydantic_config__ = UNKNOWN_FIELDS_REFUSED
        ...     x: float
        ...     tags: tuple[str, ...] = ()
        >>> read_record(Point, {"x": 1, "tags": ["a"]})
        Point(x=1.0, tags=('a',))
        >>> read_record(Point, {"x": "NaN"})
        Point(x=nan, tags=())
    """
    try:
        text = json.dumps(data)  # NaN and infinities as the NaN tokens pydantic's parser reads
    except (TypeError, ValueError) as error:
        reason = _non_json(data, "", set()) or str(error)
        raise TypeError(
            f"record data for {_type_name(record_type)} is not JSON: {reason}; "
            "pass decoded JSON (dicts with str keys, lists, str, int, float, bool, None), "
            "e.g. json.loads(text)"
        ) from error
    adapter = _adapter(record_type)
    from pydantic import ValidationError  # noqa: PLC0415

    try:
        record = _validate(adapter, text)
    except ValidationError as error:  # an older pydantic refuses a long int for a float itself
        for detail in error.errors(include_url=False):
            given = detail.get("input")
            if detail["type"] == "float_type" and _too_large(given):
                path = functools.reduce(_step, detail["loc"], "")
                raise _overflow(record_type, path, given) from None
        raise
    if _LONG_INT.search(text):
        # where the record's type holds a float, pydantic dumps the inf it made of a long int
        dumped = adapter.dump_python(record, mode="json", warnings=False)
        _refuse_overflow(record_type, json.loads(text), dumped, "")
    if isinstance(record_type, type) and not isinstance(record, record_type):
        raise TypeError(
            f"validating as {record_type.__name__} returned {type(record).__name__}, not the type"
        )
    return cast("T", record)


def _non_json(value: object, path: str, open_ids: set[int]) -> str:
    """Where ``value`` stops being JSON, and why (``""`` if it is JSON)."""
    if value is None or isinstance(value, str | int | float):
        return ""
    if not isinstance(value, list | tuple | dict):
        hint = "; convert it with .item()" if hasattr(value, "item") else ""
        return f"{_where(path)} is {_describe(value)}{hint}"
    if id(value) in open_ids:
        return f"{_where(path)} contains itself"
    if isinstance(value, dict):
        children = list(cast("dict[object, object]", value).items())
    else:
        children = list(enumerate(cast("list[object] | tuple[object, ...]", value)))
    open_ids.add(id(value))
    found = ""
    for key, item in children:
        if isinstance(value, dict) and not (key is None or isinstance(key, str | int | float)):
            found = f"{_where(path)} has the key {_describe(key)}; JSON keys are strings"
        else:
            found = _non_json(item, _step(path, key), open_ids)
        if found:
            break
    open_ids.discard(id(value))
    return found


def _validate(adapter: "TypeAdapter[Any]", text: str) -> object:
    """Validate ``text``, reading ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` where a float is due."""
    from pydantic import ValidationError  # noqa: PLC0415

    holder: list[Any] | None = None  # the data, parsed once a non-finite string needs replacing
    while True:
        try:
            return adapter.validate_json(text, strict=True)
        except ValidationError as error:
            holder = [json.loads(text)] if holder is None else holder
            replaced = False
            for detail in error.errors(include_url=False):
                given = detail.get("input")
                loc = (0, *detail["loc"])
                if detail["type"] != "float_type":
                    continue
                if isinstance(given, str) and given in NON_FINITE_TEXT:
                    replaced |= _replace(holder, loc, given, NON_FINITE_TEXT[given])
                elif (
                    isinstance(given, int) and not isinstance(given, bool) and not _too_large(given)
                ):
                    # an older pydantic-core refuses a JSON int past 64 bits for a float
                    replaced |= _replace(holder, loc, given, float(given))
            if not replaced:
                raise
            text = json.dumps(holder[0])


def _replace(holder: list[Any], loc: tuple[int | str, ...], given: object, value: float) -> bool:
    """Put ``value`` for ``given`` where ``loc`` leads in ``holder``; False if it leads elsewhere."""
    parent: Any = None
    key: int | str = 0
    node: Any = holder
    for part in loc:  # a part naming no key of ``node`` is a union member's tag: not a step
        if isinstance(node, dict) and isinstance(part, str) and part in node:
            parent, key, node = node, part, cast("dict[str, Any]", node)[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            parent, key, node = node, part, cast("list[Any]", node)[part]
    if parent is None or node != given:
        return False
    parent[key] = value
    return True


def _too_large(value: object) -> bool:
    """Whether ``value`` is an int past the largest float."""
    return (
        isinstance(value, int) and not isinstance(value, bool) and abs(value) > sys.float_info.max
    )


def _overflow(record_type: object, path: str, data: int) -> ValueError:
    """The refusal of an int at ``path`` too large for the float field it is read into."""
    digits = int(data.bit_length() * math.log10(2)) + 1
    return ValueError(
        f"record data for {_type_name(record_type)}: {_where(path)} is an int of about "
        f"{digits} digits, too large for a float (it would read as "
        f"{'-' if data < 0 else ''}inf); store a number within ±1.8e308"
    )


def _refuse_overflow(record_type: object, data: object, dumped: object, path: str) -> None:
    """Refuse an int of ``data`` that the record holds as an infinite float."""
    if isinstance(data, int) and not isinstance(data, bool):
        if isinstance(dumped, float) and math.isinf(dumped):
            raise _overflow(record_type, path, data)
    elif isinstance(data, dict) and isinstance(dumped, dict):
        dumped_items = cast("dict[object, object]", dumped)
        for key, item in cast("dict[object, object]", data).items():
            if key in dumped_items:
                _refuse_overflow(record_type, item, dumped_items[key], _step(path, key))
    elif isinstance(data, list) and isinstance(dumped, list):
        pairs = zip(cast("list[object]", data), cast("list[object]", dumped), strict=False)
        for index, (item, dumped_item) in enumerate(pairs):
            _refuse_overflow(record_type, item, dumped_item, _step(path, index))


def dump_record(record: object) -> dict[str, Any]:
    """Dump a dataclass (or pydantic model) record as JSON-ready data.

    Strict JSON: ``json.dumps(dump_record(r), allow_nan=False)`` works. A non-finite float is
    written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (as the tracking log
    writes them), which ``read_record`` reads back as the float where the field is a float.
    A NumPy or JAX scalar (``np.int64(3)``, ``jnp.float32(1.5)``) is written as its Python
    value.

    Args:
        record: A dataclass instance or pydantic model instance.

    Returns:
        A dict of JSON values (paths and datetimes as strings, enums by value).

    Raises:
        TypeError: ``record`` is not a dataclass or pydantic model instance, or a value in it
            has no JSON form (an array, a traced value, an arbitrary object), naming the field.

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
    except (PydanticSerializationError, TypeError):
        # Find what failed: an array or object with no JSON form is refused, naming its field;
        # NumPy or JAX scalars in typed fields are converted without pydantic's warnings.
        scalars = _check_leaves(record)
        try:
            dumped = serializer.to_python(
                record, mode="json", warnings=not scalars, fallback=_scalar
            )
        except (PydanticSerializationError, TypeError) as error:
            raise TypeError(f"dump_record: {error}") from error
    return cast("dict[str, Any]", _non_finite_as_text(dumped))


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
    raise TypeError(f"{_describe(value)} has no JSON form")


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
                    f"dump_record: {_where(path)} holds {kind} array of shape {shape} (or a traced "
                    "value), not a JSON value; store a list (array.tolist()) or a scalar, read "
                    "outside jit"
                )
            scalars = True
            continue
        try:
            to_jsonable_python(leaf, inf_nan_mode="constants")
        except Exception as error:  # pydantic's reason, named with the field
            raise TypeError(
                f"dump_record: {_where(path)} holds {_describe(leaf)}, which has no JSON form "
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
        yield from _leaves(child, _step(path, part, attribute=fields is not None), open_ids)
    open_ids.discard(id(value))


def _non_finite_as_text(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _non_finite_as_text(v) for k, v in cast("dict[str, object]", value).items()}
    if isinstance(value, list):
        return [_non_finite_as_text(v) for v in cast("list[object]", value)]
    return value
