"""Who made a counted call: ``by_package`` keys, and ``started`` weights for functions of your own.

Both look at Python frames only (a frame's module and its code's qualified name); importing this
module imports no jax.
"""

import weakref
from collections.abc import Callable, Iterable, Sequence
from types import FrameType
from typing import Final, cast


DEFAULT_EXCLUDED: Final = (
    "jax",
    "jaxlib",
    "numpy",
    "threading",
    "queue",
    "contextlib",
    "functools",
)
"""Packages ``by_package`` looks through to find the code that made a call."""

type Keys = Callable[[FrameType], str]
"""Maps the frame a call was made in (the innermost one) to the key it is counted under."""

type WeightFn = Callable[[FrameType], int]
"""Counts started Python functions: given the frame of each function started in the block (each
call; a generator when it first runs, not at its resumes), how many to count under its kind (0:
not counted)."""


def module_of(frame: FrameType) -> str:
    """The name of the module a frame runs in (``"?"`` when it has none)."""
    name = frame.f_globals.get("__name__")
    return name if isinstance(name, str) else "?"


def within(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or one of its submodules."""
    return module == package or module.startswith(package + ".")


def _function_of(frame: FrameType) -> str:
    """The dotted name of the function a frame runs: ``module.qualname``."""
    return f"{module_of(frame)}.{frame.f_code.co_qualname}"


_NAMED: Final[weakref.WeakKeyDictionary[Keys, frozenset[str]]] = weakref.WeakKeyDictionary()
"""The ``named`` functions of each keys function ``by_package`` built."""


def named_functions(keys: Keys) -> frozenset[str]:
    """The functions ``keys`` counts under their own names (a keys function of ``by_package``)."""
    try:
        return _NAMED.get(keys, frozenset())
    except TypeError:  # a keys function of your own that cannot be weakly referenced
        return frozenset()


def jitted_name(callee: object) -> str | None:
    """``module.qualname`` of the function a jitted ``callee`` wraps (None where it wraps none)."""
    wrapped = getattr(callee, "__wrapped__", None)
    module, name = getattr(wrapped, "__module__", None), getattr(wrapped, "__qualname__", None)
    return f"{module}.{name}" if isinstance(module, str) and isinstance(name, str) else None


def _check_names(what: str, names: object) -> tuple[str, ...]:
    """``names`` as a tuple; refuses a text, a non-iterable, a non-str and an impossible name.

    A name no module can have is empty, has an empty part (``"mylib."``) or a space.
    """
    if isinstance(names, str | bytes):  # its letters would be taken as names
        kind = "text" if isinstance(names, str) else "bytes"
        raise TypeError(f"{what} must be a sequence of names, not the {kind} {names!r}")
    if not isinstance(names, Iterable):
        raise TypeError(f"{what} must be a sequence of names, not {names!r}")
    chosen = tuple(cast("Iterable[object]", names))
    for name in chosen:
        if not isinstance(name, str):
            raise TypeError(f"{what} must hold names (str), not {name!r} ({type(name).__name__})")
        if not all(name.split(".")) or any(letter.isspace() for letter in name):
            raise ValueError(
                f"{what} must be non-empty dotted names, like 'substrax.spmd', not {name!r} (an "
                "empty part or a space: no module has that name)"
            )
    return cast("tuple[str, ...]", chosen)


def by_package(
    *packages: str,
    named: Sequence[str] = (),
    excluded: Sequence[str] = DEFAULT_EXCLUDED,
    other: str = "other",
) -> Keys:
    """Build a keys function that names the package (or function) whose code made each call.

    The stack is walked outward from the call. A call made with one of the ``named`` functions
    (``"module.qualname"``) on the stack is counted under the nearest one's name, whatever it
    was made through (a helper in a listed package too). A ``jax.jit`` function's dispatch is
    counted under the name of the function it wraps where that is named (its Python code does
    not run when it dispatches, so it is on no stack); its compile, under its caller's key. Otherwise, with ``packages``, the key is the most
    specific listed package that the first matching frame's module belongs to
    (``"substrax.spmd"`` for code in ``substrax.spmd._train_step``), and ``other`` when no frame
    matches. Without ``packages``, the key is the top-level package of the first frame outside
    ``excluded``. For a started-function kind (a weight function), the walk begins at the
    started function's own frame.

    Args:
        *packages: Dotted package or module names to attribute calls to.
        named: Dotted function names (``"mylib.train.step"``) counted under their own name.
        excluded: Packages looked through (jax's own code, say) when no ``packages`` are given.
        other: The key of a call made by none of ``packages``.

    Returns:
        A keys function for :func:`counted_calls`.

    Raises:
        ValueError: A package or function name that no module has: empty, with an empty part
            (``"mylib."``) or a space.
        TypeError: ``named`` or ``excluded`` is one text or bytes (not a sequence of them) or
            not a sequence, a name is not a str, or ``other`` is not a non-empty str.

    Example:
        >>> import sys
        >>> from substrax.testing import by_package
        >>> frame = eval("sys._getframe()", {"__name__": "mylib.train", "sys": sys})
        >>> by_package("mylib", "mylib.train")(frame), by_package("mylib")(frame)
        ('mylib.train', 'mylib')
        >>> by_package("json")(frame), by_package("mylib", named=("mylib.train.<module>",))(frame)
        ('other', 'mylib.train.<module>')
    """
    if not isinstance(other, str) or not other:  # pyright: ignore[reportUnnecessaryIsInstance]
        raise TypeError(f"other must be a non-empty str (the key of other calls), not {other!r}")
    _check_names("packages", packages)
    functions = frozenset(_check_names("named", named))
    excluded = _check_names("excluded", excluded)  # a generator would be used up at once
    listed = sorted(packages, key=len, reverse=True)  # the most specific first

    def keys(frame: FrameType) -> str:
        current: FrameType | None = frame
        while functions and current is not None:  # the nearest named function, anywhere
            if (function := _function_of(current)) in functions:
                return function
            current = current.f_back
        current = frame
        while current is not None:
            module = module_of(current)
            if listed:
                for package in listed:
                    if within(module, package):
                        return package
            elif not any(within(module, skipped) for skipped in excluded):
                return module.partition(".")[0]
            current = current.f_back
        return other

    _NAMED[keys] = functions
    return keys


def started(*names: str) -> WeightFn:
    """A weight function counting the starts of the named functions, or of any in a package.

    Give it to :func:`counted_calls` as the weight of a kind of your own: each Python function
    started in the block whose dotted name (``"module.qualname"``) is one of ``names``, or whose
    module is within one of them, counts once under that kind. Calls are counted, not resumes: a
    generator (or coroutine) counts once, when it first runs, however many items it yields, and
    one started before the block counts nothing in it.

    Args:
        *names: Dotted function, module or package names.

    Returns:
        The weight function.

    Raises:
        ValueError: No name, or one no module has (empty, ``"mylib."``, a space).
        TypeError: A name is not a str.

    Example:
        >>> import json
        >>> from substrax.testing import by_package, counted_calls, started
        >>> keys = by_package("json", named=("json.dumps",))
        >>> with counted_calls(keys, weights={"calls": started("json.dumps")}) as calls:
        ...     text = json.dumps([1])
        >>> calls.packages("calls")["json.dumps"]
        1
    """
    if not names:
        raise ValueError("started() needs at least one function or package name, like 'mylib'")
    chosen = _check_names("names", names)

    def weight(frame: FrameType) -> int:
        module = module_of(frame)
        if any(within(module, name) for name in chosen):
            return 1
        return int(_function_of(frame) in chosen)

    return weight
