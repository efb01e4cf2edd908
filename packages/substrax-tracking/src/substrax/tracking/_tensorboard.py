"""TensorBoardLogger: TensorBoard event files through tensorboardX."""

# ruff: noqa: ANN401  (logged values and SDK objects are typed Any on purpose)

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import socket
import time
import weakref
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from substrax.support import check_seconds, require, write_atomically

from ._base import Logger, check_resume_step
from ._event_file import EventFile, event, last_number
from ._hparams import merge_params
from ._log_files import hold_log, json_ready, let_go
from ._media import ImageWriter, image_pixels
from ._paths import ensure_writable_dir, log_stem
from ._values import checked_scalars, drain_at_exit, histogram_counts, read_scalar, value_ready


__all__ = ["TensorBoardLogger"]

_logger = logging.getLogger(__name__)
_BINS = 64  # a histogram's, as the file log's
_FLOAT32_MAX = 3.4028234663852886e38  # the largest value of TensorBoard's scalars
_NOT_IN_TAG = re.compile(r"[^-/\w.]")  # what tensorboardX replaces by "_" in a tag


def _mark_restart(events: EventFile, step: int) -> None:
    """Write TensorBoard's restart marker: its readers drop the steps >= ``step`` read before."""
    from tensorboardX.proto.event_pb2 import (  # noqa: PLC0415
        SessionLog,  # pyright: ignore[reportAttributeAccessIssue]  (generated: no stub)
    )

    start = SessionLog(status=SessionLog.START)
    for _ in range(2):  # TensorBoard's Python loader takes a run's first START for its beginning
        events.add(event(wall_time=time.time(), step=step, session_log=start))


def _shown(value: Any) -> Any:
    """A hyperparameter as TensorBoard shows it: a bool, number or str as it is, others as a str.

    TensorBoard holds a number as a double: an int past ``2**53``, which a double rounds (a seed
    shown one off), is shown as its str.
    """
    plain = isinstance(value, bool | float | str) or (
        isinstance(value, int) and -(2**53) <= value <= 2**53
    )
    return value if plain else str(value)  # a mapping, a list or None: shown as its str


class TensorBoardLogger(Logger):
    """Write TensorBoard event files (scalars, hyperparameters, text, images, histograms).

    A jax array is written once computed. Each :meth:`log_hyperparams` call writes all this
    logger was given (merged key by key, later values winning) to :attr:`hparams_file`. A name
    that is not a legal tag is logged as tensorboardX makes it one (``"a b"`` as ``"a_b"``),
    with a warning.
    ``resume_step=S`` writes TensorBoard's restart marker at step ``S + 1``, so that its readers
    drop the earlier attempt's events of steps after ``S``.

    Args:
        name: the run name.
        log_dir: the directory of the event files (created); ``tensorboard --logdir`` it.
        flush_secs: the most seconds between a write and the event file's flush (> 0).
        process_index: this process's index (see :func:`current_process_index`).
        all_processes: write on every process.
        resume_step: the step of the checkpoint a resumed run restored (None: a new run).

    Raises:
        TypeError: ``resume_step`` is not an int.
        ValueError: ``resume_step`` is negative, or ``flush_secs`` is not a finite number > 0.
        ImportError: tensorboardX is not installed (the ``tensorboard`` extra).
        LogDirNotWritableError: ``log_dir`` cannot be created or written.
        FileLogBusyError: another open TensorBoardLogger (of any process) writes this run.

    Example:
        >>> import tempfile
        >>> from substrax.tracking import TensorBoardLogger
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     with TensorBoardLogger("demo", directory) as logger:
        ...         logger.log_scalar("loss", 0.5, step=1)
    """

    def __init__(
        self,
        name: str,
        log_dir: str | os.PathLike[str],
        *,
        flush_secs: float = 10.0,
        process_index: int | None = None,
        all_processes: bool = False,
        resume_step: int | None = None,
    ) -> None:
        require(
            "tensorboardX",
            who="TensorBoardLogger",
            distribution="substrax-tracking",
            extra="tensorboard",
        )
        super().__init__(name, process_index=process_index, all_processes=all_processes)
        self.resume_step = check_resume_step(resume_step)
        self.log_dir = Path(log_dir).resolve()
        self._flush_secs = check_seconds("flush_secs", flush_secs, positive=True)
        from tensorboardX import summary  # noqa: PLC0415  (the optional extra, checked above)

        self._summaries: Any = summary
        self._writer: EventFile | None = None
        self._hparams: dict[str, Any] = {}  # every call's, merged (a resumed run's first)
        self._hparams_waiting = self._hparams_warned = False  # a full disk refused them
        self.hparams_file = self.log_dir / f"events.hparams.tfevents.{log_stem(name)}"
        self._hparams_json = self.log_dir / f".{log_stem(name)}.hparams.json"
        stem = log_stem(name, self.process_index, all_processes=all_processes)
        self._lock_path = self.log_dir / f".{stem}.lock"  # each process's own, with all_processes
        self._let_go: weakref.finalize[Any, Any] | None = None  # the lock, at close or drop
        if self.active:
            ensure_writable_dir(self.log_dir, "TensorBoardLogger")
            # two open loggers of one name would write one run: their series mixed in one curve
            held = hold_log(
                self._lock_path, self.log_dir, name, "TensorBoardLogger", "TensorBoard run"
            )
            if held is not None:
                self._let_go = weakref.finalize(self, let_go, self._lock_path, held)
                self._let_go.atexit = False  # a forked child's exit must not remove its parent's
            earlier = next(self.log_dir.glob("events.out.tfevents.*"), None) is not None
            events = self._events()  # the first event file, opened now
            if resume_step is not None:
                if not earlier:
                    _logger.warning(
                        f"TensorBoardLogger({name!r}): resume_step={resume_step}, but "
                        f"{self.log_dir} holds no event file of an earlier attempt; check that "
                        "log_dir is the first attempt's"
                    )
                if resume_step + 1 < 2**63:  # no later step otherwise
                    _mark_restart(events, resume_step + 1)
                with contextlib.suppress(OSError, ValueError):  # none, or unreadable: {}
                    found = json.loads(self._hparams_json.read_text(encoding="utf-8"))
                    if isinstance(found, dict):  # the earlier attempt's
                        self._hparams = cast("dict[str, Any]", found)
        # (name, value, step, time) of the scalars not written yet: from a jax value not computed
        self._held: deque[tuple[str, Any, int | None, float]] = deque()
        self._warned_unreadable: set[str] = set()
        self._huge: set[str] = set()  # names warned about: a value past float32
        self._empty_histograms: set[str] = set()  # warned about: no finite value
        self._partial_histograms: set[str] = set()  # warned about: some values not finite
        self._started = time.time()
        self._images = ImageWriter(f"TensorBoardLogger({name!r}) images")
        self._tags: dict[str, str] = {}  # each name logged, and its tag
        self._tagged: dict[str, str] = {}  # each tag, and the first name logged as it

    def _tag(self, name: str) -> str:
        """The tag tensorboardX stores ``name`` as; a change, or two names meeting, warned once."""
        tag = self._tags.get(name)
        if tag is not None:
            return tag
        tag = self._tags[name] = _NOT_IN_TAG.sub("_", name).lstrip("/")
        first = self._tagged.setdefault(tag, name)
        if tag != name:
            _logger.warning(f"{self!r}: {name!r} is not a TensorBoard tag; it is logged as {tag!r}")
        if first != name:
            _logger.warning(
                f"{self!r}: {first!r} and {name!r} are both logged as the tag {tag!r}, in one "
                "series; give them names that differ in letters, digits, '_', '-', '.' or '/'"
            )
        return tag

    def _events(self) -> EventFile:
        """The event file, opened at the first call."""
        if self._writer is None:
            # sorts after log_dir's files (read in name order); the pid parts two processes
            number = last_number(self.log_dir) + 1
            host = socket.gethostname()
            name = f"events.out.tfevents.{int(time.time())}.{host}.{number:06d}.{os.getpid()}"
            self._writer = EventFile(self.log_dir / name, self._flush_secs, repr(self))
        return self._writer

    def _write_scalars(self, metrics: Mapping[str, Any], step: int | None) -> None:
        now = time.time()
        checked = checked_scalars(metrics, step)  # a call that raises writes nothing
        self._held.extend((key, number, step, now) for key, number in checked)
        self._write_held(wait=False)
        if self._held:
            drain_at_exit(self)

    def _write_held(self, *, wait: bool) -> None:
        """Write the held scalars in order; without ``wait``, up to a jax value still computed."""
        held = self._held
        while held:
            key, value, step, when = held[0]
            if not wait and not value_ready(value):
                return
            held.popleft()
            number = read_scalar(repr(self), key, value, step, self._warned_unreadable)
            if number is None:
                continue
            if abs(number) > _FLOAT32_MAX and math.isfinite(number) and key not in self._huge:
                self._huge.add(key)
                _logger.warning(
                    f"{self!r}: {key!r} = {number:g} at step {step} is past float32, which "
                    "TensorBoard stores: it shows as infinite (reported once a name)"
                )
            summary = self._summaries.scalar(self._tag(key), number)
            self._events().add_summary(summary, step, when)

    def _write_hyperparams(self, params: Mapping[str, Any]) -> None:
        merge_params(self._hparams, json_ready(params))  # mappings key by key
        self._hparams_waiting = True
        self._write_hparams()

    def _write_hparams(self) -> None:
        """Write all hyperparameters given so far; a full disk: warned once, tried at each flush."""
        from tensorboardX.record_writer import RecordWriter  # noqa: PLC0415
        from tensorboardX.summary import hparams  # noqa: PLC0415

        temporary = self.log_dir / f".{log_stem(self.name)}.hparams.tmp"
        now = self._started  # the file is read first: its time is the run's start
        try:
            # no event file ("tfevents") until renamed
            with contextlib.closing(RecordWriter(str(temporary))) as writer:
                writer.write(event(wall_time=now, file_version="brain.Event:2").SerializeToString())
                shown = {key: _shown(value) for key, value in self._hparams.items()}
                for summary in hparams(shown, {}):  # the experiment, session start, end
                    writer.write(event(wall_time=now, summary=summary).SerializeToString())
                writer.flush()
            temporary.replace(self.hparams_file)
            write_atomically(self._hparams_json, json.dumps(self._hparams))  # a resume's start
        except OSError as error:
            temporary.unlink(missing_ok=True)
            if not self._hparams_warned:
                self._hparams_warned = True
                _logger.warning(
                    f"{self!r} cannot write its hyperparameters to {self.hparams_file} "
                    f"({error}); they are written at the next flush with room"
                )
        else:
            self._hparams_waiting = False

    def _write_text(self, name: str, text: str, step: int | None) -> None:
        self._events().add_summary(self._summaries.text(name, text), step, time.time())

    def _write_images(self, name: str, images: list[Any], step: int | None) -> None:
        for index, image in enumerate(images):
            tag = self._tag(name) + ("" if len(images) == 1 else f"/{index}")
            store = functools.partial(self._store_image, self._events(), tag, step, time.time())
            self._images.submit(store, image)

    @staticmethod
    def _store_image(
        events: EventFile, tag: str, step: int | None, when: float, image: Any
    ) -> None:
        from tensorboardX.summary import image as image_summary  # noqa: PLC0415

        pixels = image_pixels(image)  # uint8: the writer then neither scales nor wraps it
        pixels = pixels[..., None] if pixels.ndim == 2 else pixels  # noqa: PLR2004  (gray)
        events.add_summary(image_summary(tag, pixels, dataformats="HWC"), step, when)

    def _write_histogram(self, name: str, values: Any, step: int | None) -> None:
        import numpy as np  # noqa: PLC0415

        array = np.asarray(values, dtype=np.float64).ravel()
        finite = array[np.isfinite(array)]  # NaN and infinity have no bin
        if 0 < finite.size < array.size and name not in self._partial_histograms:
            self._partial_histograms.add(name)
            _logger.warning(
                f"TensorBoardLogger({self.name!r}): histogram {name!r} at step {step} holds "
                f"{array.size - finite.size} values that are NaN or infinite, which TensorBoard's "
                "bins cannot hold; its histogram shows the finite ones (reported once a name)"
            )
        if finite.size:
            _, edges = histogram_counts(finite, _BINS)  # edges equal bins can span, or one bin
            with np.errstate(over="ignore", invalid="ignore"):  # its sum of squares of 1e308
                summary = self._summaries.histogram(self._tag(name), finite, bins=edges)
            self._events().add_summary(summary, step, time.time())
        elif name not in self._empty_histograms:
            self._empty_histograms.add(name)
            _logger.warning(
                f"TensorBoardLogger({self.name!r}): histogram {name!r} at step {step} has no "
                "finite value, which TensorBoard cannot show; it is not written (reported once "
                "a name)"
            )

    def flush(self) -> None:
        """Write every event logged so far (waiting for held jax values); fsync the event file."""
        if self.active and not self.closed:
            self._write_all()
            if self._writer is not None:
                self._writer.flush()

    def _write_all(self) -> None:
        self._write_held(wait=True)
        self._images.wait()
        if self._hparams_waiting:
            self._write_hparams()

    def _close(self) -> None:
        try:
            self._write_all()
        finally:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if self._let_go is not None:
                self._let_go()
