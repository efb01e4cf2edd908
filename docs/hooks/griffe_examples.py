"""griffe extension: render ``Example:`` sections as examples, like ``Examples:``.

substrax's docstrings say ``Example:`` above their doctest lines. griffe's Google parser only
knows the plural as the examples section and turns anything else into an admonition of plain
Markdown, where a doctest line such as ``[x for x in y]`` reads as a link. This extension
renames the singular title before griffe parses the docstring, so the lines render as code.
"""

import re

import griffe


_SINGULAR = re.compile(r"^(\s*)Example:\s*$", re.MULTILINE)


class ExampleSections(griffe.Extension):
    """Rename ``Example:`` section titles to ``Examples:`` on every loaded object."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: object) -> None:  # noqa: ARG002
        """Rewrite the object's docstring before it is parsed."""
        docstring = obj.docstring
        if docstring is not None and "Example:" in docstring.value:
            docstring.value = _SINGULAR.sub(r"\1Examples:", docstring.value)
