r"""Static checks a repository runs over its own sources, at the import path substrax 0.1.22 gave it.

This module's path is an interface: ``substrax.testing.source_scans`` is where 0.1.22 users
import the scans from. It holds no logic; the implementation lives in the private modules
``_source_files``, ``_source_checks``, ``_names``, ``_mesh_calls`` and ``_documented``. Like
them, it imports only the standard library (and ``substrax.support``, which imports nothing
else): no jax, flax, numpy or pytest, so a repository can run its checks in any environment.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from substrax.testing.source_scans import (
    ...     import_time_lines,
    ...     python_files,
    ...     writes_environment,
    ... )
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     _ = Path(directory, "app.py").write_text("import os\nos.environ['A'] = '1'\n")
    ...     found = [
    ...         str(finding)
    ...         for path in python_files(Path(directory))
    ...         for finding in import_time_lines(path, writes_environment)
    ...     ]
    >>> found
    [".../app.py:2: os.environ['A'] = '1'"]
"""

from ._documented import PAGE_SUFFIXES, documented_texts
from ._mesh_calls import unguarded_make_mesh_calls
from ._source_checks import (
    Predicate,
    configures_logging,
    import_time_lines,
    is_main_guard,
    matching_lines,
    writes_environment,
)
from ._source_files import (
    BUILD_OUTPUTS,
    EXCLUDED_DIRECTORIES,
    SourceNotFoundError,
    SourceText,
    python_files,
)


__all__ = [
    "BUILD_OUTPUTS",
    "EXCLUDED_DIRECTORIES",
    "PAGE_SUFFIXES",
    "Predicate",
    "SourceNotFoundError",
    "SourceText",
    "configures_logging",
    "documented_texts",
    "import_time_lines",
    "is_main_guard",
    "matching_lines",
    "python_files",
    "unguarded_make_mesh_calls",
    "writes_environment",
]
