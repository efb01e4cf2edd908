"""Finding ``make_mesh`` calls that leave the axis types to jax's default, in any text.

From jax 0.11, ``jax.make_mesh`` makes every axis ``AxisType.Explicit`` unless ``axis_types``
says otherwise, and a batch-sharded training step written for ``Auto`` axes then fails. This
check reads text, not syntax, so it covers documentation pages and docstrings as well as code.
Standard library only.
"""

import re

from ._source_files import SourceText


_CALL = re.compile(r"\bmake_mesh\s*\(")
_DEFINITION = re.compile(r"\bdef\s+$")
_KEYWORD = re.compile(r"^\s*([A-Za-z_]\w*)\s*=(?!=)")
# jax.make_mesh(axis_shapes, axis_names, axis_types=None, *, devices=None): the third positional
_AXIS_TYPES_POSITION = 3
_OPENING, _CLOSING = "([{", ")]}"


def _arguments(text: str, start: int) -> list[str]:
    """The top-level arguments of the call whose ``(`` is at ``start`` (to the end if unclosed)."""
    arguments: list[str] = []
    depth, begin = 0, start + 1
    for index in range(start + 1, len(text)):
        character = text[index]
        if character in _OPENING:
            depth += 1
        elif character in _CLOSING:
            if depth == 0:
                arguments.append(text[begin:index])
                break
            depth -= 1
        elif character == "," and depth == 0:
            arguments.append(text[begin:index])
            begin = index + 1
    else:
        arguments.append(text[begin:])
    return [argument for argument in arguments if argument.strip()]


def _names_axis_types(arguments: list[str]) -> bool:
    """Whether the call passes axis types, or might (an unpacked ``*args`` or ``**kwargs``)."""
    positional = 0
    for argument in arguments:
        if argument.lstrip().startswith("*"):
            return True
        keyword = _KEYWORD.match(argument)
        if keyword is None:
            positional += 1
        elif keyword.group(1) == "axis_types":
            return True
    return positional >= _AXIS_TYPES_POSITION


def unguarded_make_mesh_calls(text: str | SourceText) -> list[SourceText]:
    r"""The ``make_mesh`` calls in ``text`` that do not say which axis types they want.

    A call is guarded when it passes ``axis_types=``, gives a third positional argument (where
    ``jax.make_mesh`` takes the axis types), or unpacks ``*args``/``**kwargs`` that might hold
    them. A ``def make_mesh`` line is a definition, not a call. The text is read as text, so the check
    runs over Markdown pages and docstrings as well as code; parentheses inside strings are
    counted like any other.

    Args:
        text: The text to read, or a :class:`SourceText` (a documented text from
            :func:`documented_texts`), whose path and first line the findings then carry.

    Returns:
        One finding per unguarded call, its ``text`` the line where the call starts.

    Example:
        >>> from substrax.testing.source_scans import unguarded_make_mesh_calls
        >>> code = (
        ...     "mesh = jax.make_mesh((8,), ('data',))\n"
        ...     "mesh = jax.make_mesh((8,), ('data',), axis_types=(AxisType.Auto,))\n"
        ... )
        >>> [str(finding) for finding in unguarded_make_mesh_calls(code)]
        ["<text>:1: mesh = jax.make_mesh((8,), ('data',))"]
    """
    if isinstance(text, SourceText):
        path, first_line, scope, body = text.path, text.line, text.scope, text.text
    elif not isinstance(text, str):  # pyright: ignore[reportUnnecessaryIsInstance] - user input
        raise TypeError(f"text must be source text (a str or SourceText), not {text!r}")
    else:
        path, first_line, scope, body = "<text>", 1, "", text
    lines = body.splitlines()
    found: list[SourceText] = []
    for call in _CALL.finditer(body):
        before = body[body.rfind("\n", 0, call.start()) + 1 : call.start()]
        if _DEFINITION.search(before) or _names_axis_types(_arguments(body, call.end() - 1)):
            continue
        line = body.count("\n", 0, call.start())
        found.append(
            SourceText(path=path, line=first_line + line, scope=scope, text=lines[line].strip())
        )
    return found
