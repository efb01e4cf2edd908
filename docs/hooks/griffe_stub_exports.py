"""griffe extension: a part's public names are the ones its ``__init__.pyi`` lists.

Each part lists its re-exports once, in the stub beside its package ``__init__.py``; at run time
``substrax.support.lazy_exports`` reads that stub for ``__all__``. griffe reads source statically
and merges the stub in, but sees no ``__all__``, and so takes the stub's imported names for
private ones. This extension gives each such package the stub's names as its exports, read by
the same function the run time uses, so mkdocstrings documents exactly what ``__all__`` lists.
"""

from pathlib import Path

import griffe

from substrax.support._lazy import STUB_NAME, read_stub


class StubExports(griffe.Extension):
    """Set each package's exports to the names its ``__init__.pyi`` re-exports."""

    def on_module(self, *, mod: griffe.Module, **kwargs: object) -> None:  # noqa: ARG002
        """Give a package with a stub beside its ``__init__.py`` the stub's names as exports."""
        source = mod.filepath
        if not isinstance(source, Path) or source.stem != "__init__":
            return
        stub = source.with_name(STUB_NAME)
        if stub.is_file():
            mod.exports = list(read_stub(str(stub)))
