"""Reading TOML files with errors that name them, and pydantic errors told as TOML paths.

pydantic is imported only where a pydantic error is told, never by ``read_toml``.
"""

import json
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args, get_origin

from ._errors import ConfigFileError


if TYPE_CHECKING:
    from pydantic import BaseModel
    from pydantic_core import ErrorDetails


ROOT_PATH = "tool.substrax.compute"

_AT = re.compile(r"\s*\(at line (?P<line>\d+), column (?P<column>\d+)\)$")
_AT_END = " (at end of document)"


def _end_of(text: str) -> tuple[int, int]:
    r"""The 1-based line and column just past the end of ``text`` (where tomllib stopped).

    Example:
        >>> from substrax.compute._toml import _end_of
        >>> _end_of('a = "'), _end_of("a = 1\n[x")
        ((1, 6), (2, 3))
    """
    line = text.count("\n") + 1
    return line, len(text) - (text.rfind("\n") + 1) + 1


def read_toml(path: Path) -> dict[str, Any]:
    r"""The TOML document in ``path``.

    Raises:
        ConfigFileError: The file is not valid TOML (with its line and column) or can't be read.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.compute._toml import read_toml
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     bad = Path(directory) / "pyproject.toml"
        ...     _ = bad.write_text("[tool]\nname = \n")
        ...     read_toml(bad)
        Traceback (most recent call last):
        ...
        substrax.compute.ConfigFileError: .../pyproject.toml:2:8: not valid TOML: Invalid value; fix the file and retry
    """
    try:
        with path.open("rb") as file:
            return tomllib.load(file)
    except tomllib.TOMLDecodeError as error:
        text = str(error)
        at = _AT.search(text)
        if at is not None:
            line, column = int(at["line"]), int(at["column"])
            raise ConfigFileError(path, text[: at.start()], line=line, column=column) from None
        reason = text.removesuffix(_AT_END)  # tomllib's only other form: at the end
        line, column = _end_of(path.read_bytes().decode())
        raise ConfigFileError(path, reason, line=line, column=column) from None
    except UnicodeDecodeError as error:
        data = bytes(error.object)
        line = data.count(b"\n", 0, error.start) + 1
        column = error.start - data.rfind(b"\n", 0, error.start)
        raise ConfigFileError(path, "not UTF-8 text", line=line, column=column) from None
    except OSError as error:
        raise ConfigFileError(path, error.strerror or str(error)) from None


_KINDS: Mapping[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a float",
    list: "an array",
    dict: "a table",
}


def toml_kind(value: object) -> str:
    """What ``value`` is, in TOML's words (``"a string"``), for a refusal.

    Example:
        >>> from substrax.compute._toml import toml_kind
        >>> toml_kind("x"), toml_kind([1]), toml_kind(True)
        ('a string', 'an array', 'a boolean')
    """
    return _KINDS.get(type(value), f"a {type(value).__name__}")


def model_at(loc: tuple[int | str, ...], root: "type[BaseModel]") -> "type[BaseModel] | None":
    """The model class the key path ``loc`` points into, walking ``root``'s annotations."""
    from pydantic import BaseModel  # noqa: PLC0415 - only when a config is validated

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


def reason(error: "ErrorDetails", root: "type[BaseModel]") -> str:
    """What is wrong, in words, for one pydantic error of a TOML table."""
    kind = error["type"]
    loc = error["loc"]
    got = error.get("input")
    if kind == "extra_forbidden":
        model = model_at(loc[:-1], root)
        retired: Mapping[str, str] = getattr(model, "RETIRED", {})  # a key 0.1.22 read, and why not
        if str(loc[-1]) in retired:
            return retired[str(loc[-1])]
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
    """The TOML path of a pydantic error location under ``prefix``."""
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
