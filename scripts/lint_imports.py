"""Run import-linter over the parts of the ``substrax`` namespace.

grimp builds its graph from a namespace package's portions only when ``substrax`` is a pure
(PEP 420) namespace; in the workspace the meta-package's ``__init__`` makes it a regular package.
The meta-package imports no part eagerly, so the graph loses nothing when it is left out here.

Usage: ``uv run python scripts/lint_imports.py`` (the arguments of ``lint-imports`` pass through).
"""

import sys
from pathlib import Path


_META_SRC = Path(__file__).resolve().parents[1] / "packages" / "substrax" / "src"


def main() -> int:
    """Drop the meta-package from the path, then run ``lint-imports``."""
    sys.path[:] = [entry for entry in sys.path if Path(entry or ".").resolve() != _META_SRC]
    from importlinter.cli import lint_imports  # noqa: PLC0415 - after the path is set

    return lint_imports(no_cache=True, no_logo=True)


if __name__ == "__main__":
    sys.exit(main())
