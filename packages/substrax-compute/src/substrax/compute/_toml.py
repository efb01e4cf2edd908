"""Pydantic validation errors told as TOML paths under ``[tool.substrax.compute]``."""

import json
import re
from typing import Annotated, Any, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import ErrorDetails


ROOT_PATH = "tool.substrax.compute"


class ComputeConfigError(ValueError):
    """A ``[tool.substrax.compute]`` key is unknown or holds a bad value.

    Attributes:
        path: The TOML path of the first offending key.
        reason: What is wrong with it.
        problems: Every ``(path, reason)`` found.
    """

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        self.path, self.reason = problems[0]
        super().__init__("\n".join(f"{path}: {reason}" for path, reason in problems))


ComputeConfigError.__module__ = "substrax.compute"  # its public home


def model_at(loc: tuple[int | str, ...], root: type[BaseModel]) -> type[BaseModel] | None:
    """The model class the key path ``loc`` points into, walking ``root``'s annotations."""
    current: Any = root
    for part in loc:
        while get_origin(current) is Annotated or hasattr(current, "__value__"):
            current = (
                get_args(current)[0] if get_origin(current) is Annotated else current.__value__
            )
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            current = field.annotation
        else:
            args = [a for a in get_args(current) if a is not type(None)]
            current = args[-1] if args else None
    args = [a for a in get_args(current) if a is not type(None)] or [current]
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if models else None


def reason(error: ErrorDetails, root: type[BaseModel]) -> str:
    kind = error["type"]
    loc = error["loc"]
    got = error.get("input")
    if kind == "extra_forbidden":
        model = model_at(loc[:-1], root)
        allowed = f"; allowed keys: {', '.join(model.model_fields)}" if model else ""
        return f"unknown key{allowed}"
    if kind == "missing":
        return "is required"
    message = str(error["msg"]).removeprefix("Value error, ")
    if kind == "tuple_type" and isinstance(got, str):
        what = "an argv list such as ['python', 'x.py']" if "commands" in loc else "a list"
        return f"must be {what}, not a string (no shell strings), got {json.dumps(got)}"
    if loc and loc[-1] == "[key]":
        message = f"key {message}"
    if isinstance(got, dict):
        return message
    return f"{message}, got {json.dumps(got)}"


def toml_path(loc: tuple[int | str, ...], prefix: str = ROOT_PATH) -> str:
    parts = [prefix]
    for part in loc:
        if part == "[key]":
            continue
        if isinstance(part, int):
            parts[-1] += f"[{part}]"
        elif re.fullmatch(r"[A-Za-z0-9_-]+", part):
            parts.append(part)
        else:
            parts.append(json.dumps(part))
    return ".".join(parts)
