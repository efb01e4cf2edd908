"""substrax.examples: list a repository's example scripts. Imports no jax.

Example:
    >>> from pathlib import Path
    >>> from substrax.examples import discover_examples
    >>> discover_examples  # doctest: +ELLIPSIS
    <function discover_examples at ...>
"""

from ._discover import discover_examples as discover_examples
from ._errors import ExamplesRootNotADirectoryError as ExamplesRootNotADirectoryError


__all__ = ["ExamplesRootNotADirectoryError", "discover_examples"]
