"""Finding ``make_mesh`` calls that leave the axis types to jax's default, in any text.

From jax 0.11, ``jax.make_mesh`` makes every axis ``AxisType.Explicit`` unless ``axis_types``
says otherwise, and a batch-sharded training step written for ``Auto`` axes then fails. This
check finds calls in text, not syntax, so it covers documentation pages and docstrings as well as
code, and reads each call's arguments with Python's tokenizer. Standard library only.
"""

import io
import re
import tokenize
from bisect import bisect_right

from ._source_files import SourceText


_CALL = re.compile(r"\bmake_mesh\s*\(")
_DEFINITION = re.compile(r"\bdef\s+$")
_LINE_END = re.compile(r"\r\n|\r|\n")  # what Python's tokenizer ends a line with
_DOCTEST_PROMPT = re.compile(r"^\s*>>>\s")
_DOCTEST_CONTINUATION = re.compile(r"^[ \t]*\.\.\.(?:[ \t]|$)", re.MULTILINE)
# jax.make_mesh(axis_shapes, axis_names, axis_types=None, *, devices=None): the third positional
_AXIS_TYPES_POSITION = 3
_OPENING, _CLOSING = frozenset("([{"), frozenset(")]}")
_LAYOUT = frozenset({tokenize.COMMENT, tokenize.NL})

type _Argument = list[tokenize.TokenInfo]


def _arguments(call: str) -> list[_Argument] | None:
    """The top-level arguments of the call ``call`` opens with its ``(``, each as its tokens.

    Read with Python's tokenizer, so commas and brackets in strings and comments do not count.
    None if the call does not close (the text ends, or stops reading as Python, first).
    """
    arguments: list[_Argument] = [[]]
    depth = 0
    try:
        for token in tokenize.generate_tokens(io.StringIO(call).readline):
            if token.type in _LAYOUT:
                continue
            is_operator = token.type == tokenize.OP
            if is_operator and token.string in _CLOSING:
                depth -= 1
                if depth == 0:
                    return [argument for argument in arguments if argument]
            if is_operator and token.string == "," and depth == 1:
                arguments.append([])
            elif depth > 0:
                arguments[-1].append(token)
            if is_operator and token.string in _OPENING:
                depth += 1
    except tokenize.TokenError:
        pass  # the text ended inside the call
    return None


def _is_none(tokens: _Argument) -> bool:
    return [token.string for token in tokens] == ["None"]


def _names_axis_types(arguments: list[_Argument]) -> bool:
    """Whether the call passes axis types (not ``None``), or might (``*args``, ``**kwargs``)."""
    positional: list[_Argument] = []
    unpacks = False
    for argument in arguments:
        first = argument[0].string
        if first in {"*", "**"}:
            unpacks = True
        elif len(argument) > 1 and argument[1].string == "=":
            if first == "axis_types":
                return not _is_none(argument[2:])
        else:
            positional.append(argument)
    if len(positional) >= _AXIS_TYPES_POSITION:
        return not _is_none(positional[_AXIS_TYPES_POSITION - 1])
    return unpacks


def unguarded_make_mesh_calls(text: str | SourceText) -> list[SourceText]:
    r"""The ``make_mesh`` calls in ``text`` that do not say which axis types they want.

    A call is guarded when it passes ``axis_types=`` or a third positional argument (where
    ``jax.make_mesh`` takes the axis types) other than ``None``, or unpacks
    ``*args``/``**kwargs`` that might hold them. A ``def make_mesh`` line is a definition, not
    a call. Each call's arguments are read with Python's tokenizer from its ``(``, so commas
    and brackets in strings and comments do not count, and ``...`` prompts inside a doctest
    call (one on a ``>>>`` line) are skipped; the rest of the text is read as text, so the check
    runs over Markdown pages and docstrings as well as code. A call that does not close before
    the text ends (or stops reading as Python) is reported: the check cannot read it.

    Args:
        text: The text to read, or a :class:`SourceText` (a documented text from
            :func:`documented_texts`), whose path and first line the findings then carry.

    Returns:
        One finding per unguarded call, its ``text`` the line where the call starts (lines end
        where Python's end: ``\n``, ``\r\n`` or ``\r``).

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
    lines = _LINE_END.split(body)
    starts = [0, *(end.end() for end in _LINE_END.finditer(body))]
    found: list[SourceText] = []
    for call in _CALL.finditer(body):
        line = bisect_right(starts, call.start()) - 1
        before = body[starts[line] : call.start()]
        if _DEFINITION.search(before):
            continue
        rest = body[call.end() - 1 :]
        if _DOCTEST_PROMPT.match(before):
            rest = _DOCTEST_CONTINUATION.sub("", rest)
        arguments = _arguments(rest)
        if arguments is None or not _names_axis_types(arguments):
            shown = lines[line].strip()
            found.append(SourceText(path=path, line=first_line + line, scope=scope, text=shown))
    return found
