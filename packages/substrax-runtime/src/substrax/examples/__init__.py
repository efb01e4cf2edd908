"""substrax.examples: list a repository's example scripts. Imports no jax.

Example:
    >>> from pathlib import Path
    >>> from substrax.examples import discover_examples
    >>> discover_examples  # doctest: +ELLIPSIS
    <function discover_examples at ...>
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read),
# and loads now.
lazy_exports(__name__, eager=True)
