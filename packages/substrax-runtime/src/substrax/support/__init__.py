"""substrax.support: the building blocks every part shares, so each thing is done one way.

Atomic file writes, ``with`` for closeable objects, optional SDK imports that name their extra,
the command-line convention (exit codes, error lines, ``--json``, tables), validated numbers,
the min/max mode, errors declared by their fields that survive pickling, a package's names
listed once in its ``__init__.pyi`` and loaded on first use, and old module paths kept
importable with a deprecation warning. Imports no jax. Parts and plugins may rely on these names; they follow
substrax-runtime's version.

Example:
    >>> from substrax.support import Mode, check_int, format_table
    >>> check_int("max_to_keep", 3, minimum=1)
    3
    >>> Mode("min").better(0.1, 0.2)
    True
"""

from ._lazy import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read);
# each loads from its module on first use (PEP 562): a part that only checks a number (the
# runtime, whose import stays under 5% of jax's) never pays for argparse, json or tempfile.
lazy_exports(__name__)
