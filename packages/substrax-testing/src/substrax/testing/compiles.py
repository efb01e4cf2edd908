"""Counting XLA compilations, at the import path substrax 0.1.22 gave it.

This module's path is an interface: ``substrax.testing.compiles`` is where 0.1.22 users import
``compiled_programs``, ``expect_compiles`` and ``CompileCountError`` from. It holds no logic;
all are also in :mod:`substrax.testing`, and the implementation lives in
``substrax.testing._compiles``.

Example:
    >>> from substrax.testing.compiles import BACKEND_COMPILE_EVENT, expect_compiles
    >>> BACKEND_COMPILE_EVENT
    '/jax/core/compile/backend_compile_duration'
"""

from ._compiles import (
    BACKEND_COMPILE_EVENT,
    compiled_programs,
    expect_compiles,
)
from ._errors import CompileCountError


__all__ = ["BACKEND_COMPILE_EVENT", "CompileCountError", "compiled_programs", "expect_compiles"]
