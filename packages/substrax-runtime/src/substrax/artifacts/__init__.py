"""substrax.artifacts: where a run writes its outputs, never the working tree. Imports no jax.

Example:
    >>> import tempfile
    >>> from substrax.artifacts import resolve_output_dir
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     location = resolve_output_dir("fno_darcy", env={"AVITAI_OUTPUT_DIR": directory})
    ...     location.source, location.path.name
    ('environment', 'fno_darcy')
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read),
# and loads now.
lazy_exports(__name__, eager=True)
