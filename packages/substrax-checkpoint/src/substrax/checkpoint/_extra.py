"""What a checkpoint record's ``extra`` may hold: JSON data that reads back as it was saved."""

import math
from collections.abc import Mapping
from typing import Final, cast


NONFINITE_METRICS_KEY: Final = "nonfinite_metrics"
"""The ``extra`` key under which a save records its non-finite metrics, as text (``"nan"``...)."""
RESERVED_METADATA_KEYS: Final = frozenset(
    {"format", "format_version", "step", "epoch", "items", "libraries", "producer", "metrics"}
    | {"created_at", "checkpoint_version", NONFINITE_METRICS_KEY}
)
"""The keys a save refuses in ``extra``: the record's own, and where it records non-finite metrics."""
_RECORD_KEYS: Final = RESERVED_METADATA_KEYS - {NONFINITE_METRICS_KEY}  # a record holds its own
_DEEPEST: Final = 100  # levels of containers in ``extra``


def check_extra(extra: Mapping[str, object]) -> None:
    """Refuse ``extra`` unless a save takes it: JSON data with none of the record's own keys.

    Every key of it (and of the objects it holds) is a non-empty str, and every value None, a
    bool, an int, a finite float, a str, or a list (not a tuple) or mapping of these that holds
    no cycle, so that the record reads back as it was saved (NaN and infinity are not JSON:
    ``str(value)`` keeps them). No top-level key is in ``RESERVED_METADATA_KEYS``, which holds
    ``"nonfinite_metrics"`` (where a save records the metrics that are not finite).

    Raises:
        TypeError: ``extra`` is not a mapping, or a key or value is not JSON data (named by path).
        ValueError: a float is not finite, a key is empty or reserved, or a value holds itself.

    Example:
        >>> from substrax.checkpoint import check_extra
        >>> check_extra({"step": 3})
        Traceback (most recent call last):
        ...
        ValueError: extra keys ['step'] are reserved by CheckpointMetadata; rename them ...
        >>> check_extra({"history": [0.5, float("nan")]})
        Traceback (most recent call last):
        ...
        ValueError: extra['history'][1] is nan, which JSON cannot hold; store str(value) instead
    """
    _check_extra(extra, RESERVED_METADATA_KEYS)


def check_record_extra(extra: Mapping[str, object]) -> None:
    """``check_extra`` less the save's own key: the check of a record's ``extra``."""
    _check_extra(extra, _RECORD_KEYS)


def _check_extra(extra: Mapping[str, object], reserved: frozenset[str]) -> None:
    if not isinstance(extra, Mapping):  # pyright: ignore[reportUnnecessaryIsInstance] - user input
        raise TypeError(f"extra must be a mapping of str keys to JSON data, not {extra!r}")
    _check_json(extra, "extra", {})
    clashes = sorted(set(extra) & reserved)
    if clashes:
        why = ""
        if NONFINITE_METRICS_KEY in clashes:
            why = f" ({NONFINITE_METRICS_KEY!r} is where the store records non-finite metrics)"
        raise ValueError(
            f"extra keys {clashes} are reserved by CheckpointMetadata{why}; rename them "
            f"(reserved: {sorted(RESERVED_METADATA_KEYS)})"
        )


def check_text(where: str, text: str) -> None:
    r"""Refuse ``text`` (named ``where``) unless it is UTF-8: JSON readers refuse a lone surrogate.

    ``os.fsdecode`` gives one for each byte of a file name that is not UTF-8.

    Example:
        >>> import os
        >>> from substrax.checkpoint._extra import check_text
        >>> check_text("extra['files'][0]", os.fsdecode(b"shard-\xff"))
        Traceback (most recent call last):
        ...
        ValueError: extra['files'][0] is 'shard-\udcff', whose character '\udcff' is a lone ...
    """
    if text.isascii():
        return
    try:
        text.encode()
    except UnicodeEncodeError as error:
        raise ValueError(
            f"{where} is {text!r}, whose character {text[error.start]!r} is a lone surrogate "
            "(os.fsdecode's stand-in for a byte of a file name that is not UTF-8), which no JSON "
            "record reads back; store os.fsencode(value).decode('utf-8', 'backslashreplace') "
            "(or value.encode('utf-8', 'backslashreplace').decode()) instead"
        ) from None


def _check_json(value: object, where: str, outer: dict[int, str]) -> None:
    """Refuse ``value`` at ``where`` (in the containers ``outer`` names by id) unless JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where} is {value}, which JSON cannot hold; store str(value) instead")
    if isinstance(value, str):
        check_text(where, value)
    if value is None or isinstance(value, bool | int | float | str):
        return
    if isinstance(value, tuple):
        raise TypeError(f"{where} is a tuple, which reads back as a list; pass a list")
    if not isinstance(value, list | Mapping):
        raise TypeError(
            f"{where} holds a value of type {type(value).__name__!r}, not JSON data (None, bool, "
            "int, float, str, list or dict); store a number or str(value)"
        )
    _check_container(cast("list[object] | Mapping[object, object]", value), where, outer)


def _check_container(
    value: "list[object] | Mapping[object, object]", where: str, outer: dict[int, str]
) -> None:
    """Refuse the list or mapping ``value`` at ``where`` unless JSON data (see ``_check_json``)."""
    if id(value) in outer:
        raise ValueError(f"{where} is {outer[id(value)]} itself: a cycle JSON cannot hold")
    if len(outer) == _DEEPEST:  # a JSON reader recurses once a level: Python's fails near 1000
        raise ValueError(
            f"{where[:60]}... nests containers more than {_DEEPEST} levels deep, more than a "
            "record reads back; flatten it (e.g. a list of entries)"
        )
    outer = {**outer, id(value): where}
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_json(item, f"{where}[{index}]", outer)
        return
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"{where} has the key {key!r}, not a str; JSON keys are text")
        if not key:
            raise ValueError(f"{where} has an empty key; name each entry")
        check_text(f"a key of {where}", key)
        _check_json(item, f"{where}[{key!r}]", outer)
