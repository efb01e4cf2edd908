"""substrax.records: typed JSON records, read strictly. Imports no jax.

Importing this package imports no pydantic either: it is loaded when a record is first read or
dumped.

Example:
    >>> from dataclasses import dataclass
    >>> from substrax.records import UNKNOWN_FIELDS_REFUSED, dump_record, read_record
    >>> @dataclass(frozen=True)
    ... class Run:
    ...     __pydantic_config__ = UNKNOWN_FIELDS_REFUSED
    ...     name: str
    ...     steps: int
    >>> read_record(Run, dump_record(Run(name="a", steps=3)))
    Run(name='a', steps=3)
"""

from substrax.support import lazy_exports


# Every public name is listed once, in __init__.pyi beside this file (what type checkers read),
# and loads now.
lazy_exports(__name__, eager=True)
