"""ConsoleLogger: one aligned, readable line per call, through stdlib ``logging``."""

# ruff: noqa: ANN401  (logged values and SDK objects are typed Any on purpose)

from __future__ import annotations

import json
import logging
import sys
import threading
import weakref
from collections import deque
from collections.abc import Mapping
from typing import Any, TextIO

from substrax.support import optional

from ._base import Logger, histogram_of
from ._log_files import RunLogHandler, json_ready
from ._values import checked_scalars, drain_at_exit, read_scalar, value_ready


__all__ = ["ConsoleLogger"]

_SMALL = 1e-3  # a number below it, but 0, is printed with an exponent
_OWNER = "substrax_console"  # LogRecord attribute: the id of the ConsoleLogger that logged a line
_STYLE = "substrax_style"  # LogRecord attribute: the rich style of a line
_LEVELS_LOCK = threading.Lock()
_LEVELS_SET: dict[str, int] = {}  # the level ConsoleLogger set on a stdlib logger, by name


def _set_level(logger: logging.Logger, level: int) -> None:
    """Set ``level`` on ``logger`` unless another set one on it or on a parent below the root."""
    parent = logger.parent
    while parent is not None and parent is not logging.root and parent.level == logging.NOTSET:
        parent = parent.parent
    with _LEVELS_LOCK:
        ours = _LEVELS_SET.get(logger.name)
        if parent is not None and parent is not logging.root:  # a parent's level applies
            if ours is not None and logger.level == ours:
                logger.setLevel(logging.NOTSET)
            _LEVELS_SET.pop(logger.name, None)
        elif logger.level in (logging.NOTSET, ours):
            _LEVELS_SET[logger.name] = level = level if ours is None else min(level, ours)
            logger.setLevel(level)


def _handled_elsewhere(record: logging.LogRecord) -> bool:
    """Whether a handler other than a ConsoleLogger's takes ``record`` (the application's)."""
    logger: logging.Logger | None = logging.getLogger(record.name)
    while logger is not None:
        for handler in logger.handlers:
            ours = isinstance(handler, _ConsoleHandler | RunLogHandler)  # a file log: ours too
            if not ours and record.levelno >= handler.level:
                return True
        logger = logger.parent if logger.propagate else None
    return False


class _ConsoleHandler(logging.Handler):
    """One ConsoleLogger's lines and messages (with no ``stream``: those no other handler takes)."""

    def __init__(self, owner: ConsoleLogger, level: int, stream: TextIO | None, rich: Any) -> None:
        super().__init__(level)
        self._owner = weakref.ref(owner)
        self._id = id(owner)
        self._label = owner.name
        self._stream = stream
        self._rich = rich

    def live(self) -> bool:
        owner = self._owner()
        return owner is not None and not owner.closed

    def _takes(self, record: logging.LogRecord) -> bool:
        if not self.live():
            return False
        owner = getattr(record, _OWNER, None)
        if owner is not None:
            return owner == self._id
        handlers = logging.getLogger(record.name).handlers
        live = (h for h in handlers if isinstance(h, _ConsoleHandler) and h.live())
        return next(live, self) is self

    def emit(self, record: logging.LogRecord) -> None:
        if not self._takes(record) or (self._stream is None and _handled_elsewhere(record)):
            return
        try:
            level = "" if record.levelno == logging.INFO else f"{record.levelname}: "
            line = f"[{self._label}] {level}{self.format(record)}"
            style = str(getattr(record, _STYLE, ""))
            if self._rich is not None:
                self._rich.print(
                    f"[{style}]{line}[/]" if style else line, markup=bool(style), soft_wrap=True
                )
            else:
                (self._stream if self._stream is not None else sys.stdout).write(line + "\n")
        except Exception:  # logging's own policy: report, never raise
            self.handleError(record)


def _fmt(value: float) -> str:
    return f"{value:>10.4g}" if abs(value) >= _SMALL or value == 0 else f"{value:>10.3e}"


def _step(step: int | None) -> str:
    return f"step {step:>7} | " if step is not None else ""


class ConsoleLogger(Logger):
    r"""Print each call as one aligned line (in rich colours on a terminal, with rich installed).

    Every line and message is a record of :attr:`python_logger`, so the application's handlers
    and filters see it; with no ``stream``, only the records no other handler takes are printed.
    The logger's level is set to ``level`` unless it, or a parent below the root, has one. A jax
    array is printed once computed. It has no ``log_artifact``.

    Args:
        name: the name printed at the start of each line.
        stream: where to print; default: ``sys.stdout`` at each call (see above).
        level: ``logging.INFO`` prints every line; a higher level prints only messages.
        use_rich: draw with rich; default: when rich is installed and the stream is a terminal.
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: print on every process, not only process 0.

    Example:
        >>> import io
        >>> from substrax.tracking import ConsoleLogger
        >>> out = io.StringIO()
        >>> logger = ConsoleLogger("demo", stream=out)
        >>> logger.log_scalars({"loss": 0.25, "acc": 0.91}, step=3)
        >>> logger.warning("loss went %s", "up")
        >>> print(out.getvalue(), end="")
        [demo] step       3 | loss       0.25 | acc       0.91
        [demo] WARNING: loss went up
        >>> logger.close()
    """

    def __init__(
        self,
        name: str = "substrax",
        *,
        stream: TextIO | None = None,
        level: int = logging.INFO,
        use_rich: bool | None = None,
        process_index: int | None = None,
        all_processes: bool = False,
    ) -> None:
        super().__init__(name, process_index=process_index, all_processes=all_processes)
        self._stream = stream
        self.level = level
        if use_rich is None:
            target = stream if stream is not None else sys.stdout
            use_rich = bool(getattr(target, "isatty", lambda: False)())
        console = optional("rich.console") if use_rich else None  # an extra: else plain lines
        rich = console.Console(file=stream, highlight=False) if console is not None else None
        self._handler: _ConsoleHandler | None = None
        # lines not printed yet: (step, [(name, value)], "") for scalars, (None, line, style)
        self._held: deque[tuple[int | None, list[tuple[str, Any]] | str, str]] = deque()
        self._warned_unreadable: set[str] = set()
        if self.active:
            self._handler = _ConsoleHandler(self, level, stream, rich)
            _set_level(self.python_logger, level)
            for handler in list(self.python_logger.handlers):  # those of loggers never closed
                if isinstance(handler, _ConsoleHandler) and not handler.live():
                    self.python_logger.removeHandler(handler)
            self.python_logger.addHandler(self._handler)

    def _line(self, body: str, style: str = "") -> None:
        self._held.append((None, body, style))
        self._print_held(wait=False)

    def _print_held(self, *, wait: bool) -> None:
        """Print the held lines in order; without ``wait``, up to a jax value still computed."""
        held = self._held
        while held:
            step, body, style = held[0]
            if not isinstance(body, str):
                if not wait and not all(value_ready(value) for _, value in body):
                    return
                warned = self._warned_unreadable
                numbers = [(key, read_scalar(repr(self), key, v, step, warned)) for key, v in body]
                parts = [f"{key} {_fmt(number)}" for key, number in numbers if number is not None]
                body = _step(step) + " | ".join(parts) if parts else ""
            held.popleft()
            if body:
                self.python_logger.info(body, extra={_OWNER: id(self), _STYLE: style})

    def _message(
        self, level: int, msg: object, args: tuple[object, ...], kwargs: dict[str, Any]
    ) -> None:
        # its own: another ConsoleLogger of the name, on another stream, does not print it
        kwargs["extra"] = {**(kwargs.get("extra") or {}), _OWNER: id(self)}
        kwargs.setdefault("stacklevel", 4)  # the record names the caller of info() & co.
        super()._message(level, msg, args, kwargs)

    def close(self) -> None:
        """Print the lines held behind jax values (waiting for them), then stop printing."""
        if not self.closed:  # its handler prints only while it is open
            self._print_held(wait=True)
        super().close()

    def _close(self) -> None:
        if self._handler is not None:
            self.python_logger.removeHandler(self._handler)

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        items = checked_scalars(metrics, step)
        if any(type(value) is not float for _, value in items):  # a jax array, read later
            drain_at_exit(self)
        self._held.append((step, items, ""))
        self._print_held(wait=False)

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        try:
            text = json.dumps(dict(params), default=str, sort_keys=True)
        except TypeError:  # keys of several types (1 and "b"), or not JSON's: shown as text
            text = json.dumps(json_ready(params), sort_keys=True)
        self._line("hyperparams " + text, "bold")

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._line(f"{_step(step)}{name}: {text}")

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        shapes = ", ".join(str(tuple(image.shape)) for image in images)
        self._line(f"{_step(step)}{name}: image {shapes}")

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        s = histogram_of(name, values)
        self._line(
            f"{_step(step)}{name}: histogram n={s['count']} min={s['min']:.4g} "
            f"max={s['max']:.4g} mean={s['mean']:.4g} std={s['std']:.4g}"
        )

    def flush(self) -> None:
        """Print the lines held behind jax values (waiting for them), then flush the stream."""
        if not self.closed:
            self._print_held(wait=True)
        (self._stream if self._stream is not None else sys.stdout).flush()
