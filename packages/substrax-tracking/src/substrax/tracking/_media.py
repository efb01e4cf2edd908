"""Logged images: their pixels by one rule, their PNG files, and a thread that stores them."""

# ruff: noqa: ANN401  (logged values and SDK objects are typed Any on purpose)

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from substrax.support import optional

from ._values import number_kind


__all__ = [
    "ImageWriter",
    "image_pixels",
    "media_written",
    "save_image",
    "save_plot",
    "take_media_name",
]

_MOST_WAITING = 1 << 30  # bytes of pixels waiting to be stored before a call waits for the oldest


def image_pixels(image: Any) -> Any:
    """``image`` as uint8 pixels, the one rule of every logger.

    Floats (bfloat16 and ml_dtypes' others too) are clipped to ``[0, 1]`` and scaled (NaN is
    0), bools are 0 or 255, other integers are clipped to ``[0, 255]``.

    Example:
        >>> import numpy as np
        >>> from substrax.tracking._media import image_pixels
        >>> image_pixels(np.array([[-0.5, 0.5, 1.5]])).tolist(), image_pixels(np.array([[300]]))
        ([[0, 128, 255]], array([[255]], dtype=uint8))
    """
    import numpy as np  # noqa: PLC0415

    array = np.asarray(image)
    if array.dtype == np.uint8:
        return array
    if array.dtype.kind == "b":
        return array.astype(np.uint8) * np.uint8(255)
    kind = number_kind(array.dtype)
    if kind == "f":
        scaled = np.nan_to_num(np.clip(array.astype(np.float64), 0.0, 1.0), nan=0.0) * 255.0
        return np.rint(scaled).astype(np.uint8)
    if kind == "i" and array.dtype.kind == "V":  # an ml_dtypes integer (int4): numpy's first
        array = array.astype(np.int64)
    return np.clip(array, 0, 255).astype(np.uint8)  # the other integers (checked at the call)


def save_image(stem: Path, image: Any) -> Path:
    """Save ``image`` (H, W[, C]) as ``<stem>.png``, or ``<stem>.npy`` without matplotlib."""
    import numpy as np  # noqa: PLC0415

    stem.parent.mkdir(parents=True, exist_ok=True)
    array = np.asarray(image)
    if array.shape[2:] == (1,):  # (H, W, 1): gray
        array = array[..., 0]
    png = optional("matplotlib") is not None
    path = stem.parent / f"{stem.name}{'.png' if png else '.npy'}"
    try:
        if png:  # through Pillow, a dependency of matplotlib
            from PIL import Image  # noqa: PLC0415

            Image.fromarray(image_pixels(array)).save(path, format="PNG", compress_level=1)
        else:
            if array.dtype.kind == "V":  # ml_dtypes' (bfloat16): as numpy's, which np.load reads
                array = array.astype(np.float32 if number_kind(array.dtype) == "f" else np.int64)
            np.save(path, array)
    except BaseException:
        path.unlink(missing_ok=True)  # no file cut short (a full disk) under the image's name
        raise
    return path


def save_plot(path: Path, counts: list[int], edges: list[float], title: str) -> None:
    """Draw a histogram's ``counts`` over its bin ``edges`` into the PNG ``path`` (matplotlib).

    A file cut short (a full disk) is removed, and the error raised.
    """
    import numpy as np  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    figure = Figure(figsize=(5, 3))
    try:  # edges from -1e308 to 1e308: no axis spans them (ValueError, OverflowError)
        with np.errstate(over="ignore", invalid="ignore"):
            figure.add_subplot().stairs(counts, edges, fill=True)
            figure.axes[0].set_title(title)
            figure.savefig(path, dpi=80)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


_TAKEN: set[Path] = set()  # media files named, not written yet, by any FileLogger here
_TAKING = threading.Lock()


def take_media_name(path: Callable[[int], Path], index: int, suffix: str) -> Path:
    """The first free ``path(index)``, ``path(index + 1)``... (``suffix`` "": an image's stem).

    An image logged again under its name and step is numbered past the files already there and
    those still being written, by any thread and by every ``FileLogger`` of the process (two in
    one folder, named ``exp`` and ``exp.val``, can reach one file name), so each one is kept.
    An image's file is its stem's ``.png``, or ``.npy`` without matplotlib. Call
    :func:`media_written` once the file is written, or its writing failed.
    """
    with _TAKING:
        while True:
            taken = path(index)
            ends = ("",) if suffix else (".png", ".npy")
            files = [taken.with_name(taken.name + end) for end in ends]
            if taken not in _TAKEN and not any(f.exists() for f in files):
                _TAKEN.add(taken)
                return taken
            index += 1


def media_written(path: Path) -> None:
    """``path`` is written (or lost): its file, if any, now tells that the name is taken."""
    with _TAKING:
        _TAKEN.discard(path)


class ImageWriter:
    """Store logged images in a thread of their own, in order: the call only copies the array."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._pool: ThreadPoolExecutor | None = None
        self._jobs: deque[tuple[Future[object], int]] = deque()
        self._waiting = 0  # bytes
        self._error: BaseException | None = None
        self._lock = threading.Lock()

    def submit(self, store: Callable[[Any], object], image: Any) -> None:
        """Have ``store(copy)`` run in the thread, ``copy`` a numpy copy of ``image``."""
        import numpy as np  # noqa: PLC0415

        array = np.array(image)  # the caller may reuse (or donate) its buffer once this returns
        with self._lock:
            while self._jobs and (
                self._jobs[0][0].done() or self._waiting + array.nbytes > _MOST_WAITING
            ):
                self._take()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(1, thread_name_prefix=self._name)
            self._jobs.append((self._pool.submit(store, array), array.nbytes))
            self._waiting += array.nbytes

    def _take(self) -> None:
        job, size = self._jobs.popleft()
        self._waiting -= size
        self._error = self._error or job.exception()

    def wait(self) -> None:
        """Wait until every image submitted is stored, end the thread, and raise a store's error."""
        with self._lock:
            while self._jobs:
                self._take()
            if self._pool is not None:
                self._pool.shutdown()
                self._pool = None
            error, self._error = self._error, None
        if error is not None:
            raise error
