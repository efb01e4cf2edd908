"""substrax.typing: the shared type aliases and protocols. Imports no jax.

Example:
    >>> from substrax.typing import JsonValue
    >>> value: JsonValue = {"loss": [0.5, 0.25], "done": True}
    >>> value["done"]
    True
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read),
# and loads now.
lazy_exports(__name__, eager=True)
