"""Hyperparameters as every logger takes them: checked at the call, and merged one rule."""

# ruff: noqa: ANN401  (logged values are typed Any on purpose)

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, cast

from ._errors import LoggedTypeError


__all__ = ["check_hyperparams", "merge_params", "param_leaves"]


def check_hyperparams(params: Mapping[str, Any], prefix: str = "") -> None:
    r"""Refuse a key or a string of ``params`` (JSON data) that UTF-8 cannot encode (a lone surrogate).

    Raises:
        LoggedTypeError: naming the key (nested keys joined with dots).

    Example:
        >>> from substrax.tracking._hparams import check_hyperparams
        >>> check_hyperparams({"opt": {"name": "adam"}})
        >>> check_hyperparams({"opt": {"name": "bad\ud800"}})
        Traceback (most recent call last):
        ...
        substrax.tracking.LoggedTypeError: hyperparameter 'opt.name' must be a str that UTF-8 can encode, got one holding '\ud800' at 3
    """
    for key, value in params.items():
        name = f"{prefix}{key}"
        nested = isinstance(value, Mapping)
        for text in (key,) if nested else (key, *_strings(value)):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as error:
                holding = f"holding {text[error.start]!r} at {error.start}"
                got = f"a key {holding}" if text is key else f"one {holding}"
                raise LoggedTypeError(
                    f"hyperparameter {name!r}", value, "a str that UTF-8 can encode", got
                ) from None
        if nested:
            check_hyperparams(cast("Mapping[str, Any]", value), f"{name}.")


def _strings(value: Any) -> list[str]:
    """Every string of a JSON value: itself, or the keys and strings it holds."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        items = cast("Mapping[str, Any]", value).items()
        return [text for key, inner in items for text in (key, *_strings(inner))]
    if isinstance(value, list):
        return [text for item in cast("list[Any]", value) for text in _strings(item)]
    return []


def merge_params(into: dict[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """Merge ``params`` into ``into`` (and return it): mappings key by key, later leaves winning.

    Every logger keeps a run's hyperparameters by this rule, so that two calls
    ``{"opt": {"b1": 0.9}}`` and ``{"opt": {"b2": 0.99}}`` keep both keys everywhere.

    Example:
        >>> from substrax.tracking._hparams import merge_params
        >>> merge_params({"opt": {"b1": 0.9}, "lr": 1}, {"opt": {"b2": 0.99}, "lr": 2})
        {'opt': {'b1': 0.9, 'b2': 0.99}, 'lr': 2}
    """
    for key, value in params.items():
        held = into.get(key)
        if isinstance(value, Mapping) and isinstance(held, dict):
            merge_params(cast("dict[str, Any]", held), cast("Mapping[str, Any]", value))
        elif isinstance(value, Mapping):
            into[key] = merge_params({}, cast("Mapping[str, Any]", value))
        else:
            into[key] = value
    return into


def param_leaves(
    params: Mapping[str, Any], prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Each leaf of nested hyperparameters, with its key path (``("opt", "lr")``)."""
    for key, value in params.items():
        path = (*prefix, str(key))
        if isinstance(value, Mapping):
            yield from param_leaves(value, path)
        else:
            yield path, value
