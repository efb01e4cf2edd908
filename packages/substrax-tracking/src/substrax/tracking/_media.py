"""Saving a logged image to a file, for the file log and the remote backends."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

from pathlib import Path
from typing import Any

from substrax.support import optional


__all__ = ["image_pixels", "save_image"]

_GRAY, _COLOR = 2, 3


def image_pixels(image: Any) -> Any:
    """``image`` as uint8 pixels, the one rule of every logger.

    Floats are clipped to ``[0, 1]`` and scaled (NaN is 0), bools are 0 or 255, other integers
    are clipped to ``[0, 255]``; ``uint8`` is kept. (TensorBoard's writer scaled integers by 255
    and wrapped floats outside ``[0, 1]``.)

    Example:
        >>> import numpy as np
        >>> from substrax.tracking._media import image_pixels
        >>> image_pixels(np.array([[-0.5, 0.5, 1.5]])).tolist(), image_pixels(np.array([[300]]))
        ([[0, 128, 255]], array([[255]], dtype=uint8))
    """
    import numpy as np  # noqa: PLC0415

    array = np.asarray(image)
    kind = array.dtype.kind
    if array.dtype == np.uint8:
        return array
    if kind == "b":
        return array.astype(np.uint8) * np.uint8(255)
    if kind == "f":
        scaled = np.nan_to_num(np.clip(array.astype(np.float64), 0.0, 1.0), nan=0.0) * 255.0
        return np.rint(scaled).astype(np.uint8)
    return np.clip(array, 0, 255).astype(np.uint8)  # the other integers (checked at the call)


def save_image(stem: Path, image: Any) -> Path:
    """Save ``image`` (H, W[, C]) as ``<stem>.png`` (matplotlib) or ``<stem>.npy`` without it; return the path.

    Example:
        >>> import tempfile, pathlib, numpy as np
        >>> from substrax.tracking._media import save_image
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     save_image(pathlib.Path(directory) / "x", np.zeros((2, 2))).suffix
        '.png'
    """
    import numpy as np  # noqa: PLC0415

    stem.parent.mkdir(parents=True, exist_ok=True)
    array = np.asarray(image)
    if array.ndim == _COLOR and array.shape[-1] == 1:
        array = array[..., 0]
    mpimage = optional("matplotlib.image")
    path = stem.parent / (stem.name + (".npy" if mpimage is None else ".png"))
    if mpimage is None:
        np.save(path, array)
    else:
        pixels = image_pixels(array)
        mpimage.imsave(path, pixels, cmap="gray" if array.ndim == _GRAY else None, vmin=0, vmax=255)
    return path
