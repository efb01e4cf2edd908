"""Saving a logged image to a file, for the file log and the remote backends."""

# ruff: noqa: ANN401  (logged values, arrays and SDK objects of any framework are typed Any on purpose)

from __future__ import annotations

from pathlib import Path
from typing import Any

from substrax.support import optional


__all__ = ["save_image"]

_GRAY, _COLOR = 2, 3


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
        array = np.clip(array, 0.0, 1.0) if array.dtype.kind == "f" else array
        mpimage.imsave(path, array, cmap="gray" if array.ndim == _GRAY else None)
    return path
