"""substrax.artifacts: where a run writes its outputs, never the working tree. Imports no jax.

Example:
    >>> import tempfile
    >>> from substrax.artifacts import resolve_output_dir
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     location = resolve_output_dir("fno_darcy", env={"AVITAI_OUTPUT_DIR": directory})
    ...     location.source, location.path.name
    ('environment', 'fno_darcy')
"""

from ._output_dir import (
    OUTPUT_DIR_ENV as OUTPUT_DIR_ENV,
    OutputLocation as OutputLocation,
    OutputSource as OutputSource,
    resolve_output_dir as resolve_output_dir,
)


__all__ = ["OUTPUT_DIR_ENV", "OutputLocation", "OutputSource", "resolve_output_dir"]
