"""An uncaught exception marks every open logger failed before the process dies."""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Any, Protocol


__all__ = ["failed_by", "forget", "watch"]

type _ExceptHook = Callable[[type[BaseException], BaseException, TracebackType | None], object]


class _Failable(Protocol):
    def mark_failed(self) -> None: ...


_OPEN: weakref.WeakSet[_Failable] = weakref.WeakSet()
_LOCK = threading.Lock()
_CALLING = threading.local()  # .on while _hook runs (a hook it hands over to may call it back)
_previous: _ExceptHook | None = None  # the hook ours hands over to
_ORIGINAL: list[_ExceptHook] = []  # the hook before ours was first installed
_installed = False


def failed_by(error: BaseException | None) -> bool:
    """Whether a run that ``error`` ended has failed: any exception but a clean ``SystemExit``.

    Example:
        >>> from substrax.tracking._failure import failed_by
        >>> failed_by(ValueError("nan loss")), failed_by(SystemExit(0)), failed_by(SystemExit(3))
        (True, False, True)
    """
    if isinstance(error, SystemExit):
        return error.code not in (0, None)
    return error is not None


def _hand_over(
    hook: _ExceptHook, above: object, error: tuple[type[BaseException], BaseException, Any]
) -> None:
    """Call ``hook``, unless it is Python's own and ``above`` is W&B's (which printed the traceback)."""
    wandb = type(getattr(above, "__self__", None)).__module__.startswith("wandb.")
    if not (hook is sys.__excepthook__ and wandb):
        hook(*error)


def _hook(
    exc_type: type[BaseException], exc: BaseException, traceback: TracebackType | None
) -> None:
    """``sys.excepthook``: mark the open loggers failed, then hand over to the previous hook."""
    error = (exc_type, exc, traceback)
    if getattr(_CALLING, "on", False):  # called back by a hook ours was put above
        _hand_over(_ORIGINAL[0] if _ORIGINAL else sys.__excepthook__, _previous, error)
        return
    _CALLING.on = True
    try:
        if failed_by(exc):
            for logger in list(_OPEN):
                logger.mark_failed()
    finally:
        try:  # a hook put above ours (W&B's) called it: the traceback may be printed already
            _hand_over(_previous or sys.__excepthook__, sys.excepthook, error)
        finally:
            _CALLING.on = False


def watch(logger: _Failable) -> None:
    """Mark ``logger`` failed if the process dies of an uncaught exception while it is open.

    Example:
        >>> from substrax.tracking._failure import forget, watch
        >>> class Run:
        ...     failed = False
        ...     def mark_failed(self) -> None:
        ...         self.failed = True
        >>> run = Run()
        >>> watch(run)  # the run trains; an uncaught exception now marks it failed
        >>> forget(run)  # closed
        >>> run.failed
        False
    """
    global _previous, _installed
    with _LOCK:
        _OPEN.add(logger)
        if sys.excepthook is not _hook:  # not installed yet, or replaced since
            if not _installed:
                _ORIGINAL[:] = [sys.excepthook]
            _previous, _installed = sys.excepthook, True
            sys.excepthook = _hook


def forget(logger: _Failable) -> None:
    """Stop watching ``logger``; put the previous ``sys.excepthook`` back when none is left."""
    global _previous, _installed
    with _LOCK:
        _OPEN.discard(logger)
        if _installed and not _OPEN and sys.excepthook is _hook:
            sys.excepthook = _previous or sys.__excepthook__
            if _ORIGINAL and _ORIGINAL[0] is not sys.excepthook:  # ours is in that hook's chain
                _previous, _installed = _ORIGINAL[0], True
            else:
                _previous, _installed = None, False
                _ORIGINAL.clear()
