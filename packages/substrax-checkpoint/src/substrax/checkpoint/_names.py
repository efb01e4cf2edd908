r"""Leaf names a store with ``use_ocdbt=False`` cannot hold, refused before anything is written.

Orbax writes each array leaf (a Python number too; a str goes in its JSON metadata) as a
directory named ``tree.`` and the leaf's keys joined with ``.``, which TensorStore's file driver
opens as a path: ``/`` and ``\`` separate folders there, and the file system's rules apply.
"""

import re
from collections.abc import Mapping

import jax

from ._metadata import WRAPPER
from ._protocol import PyTree
from ._trees import leaf_path


_NAME_MAX = 255  # bytes in one file name (Linux, macOS)
_LOCK_SUFFIX = ".__lock"  # TensorStore's lock files: no folder may end with it
_ARRAY_FILES = re.compile(r"zarr\.json|\.zarray|\.zattrs|\.zgroup|c|\d+(\.\d+)*")
"""The names zarr gives an array's own files (metadata, chunks) inside its directory."""


def _refuse(item: str, path: tuple[object, ...], why: str) -> ValueError:
    return ValueError(
        f"item {item!r} leaf {jax.tree_util.keystr(path)} cannot be stored with "
        f"use_ocdbt=False: {why}; rename the key, or open the store with use_ocdbt=True "
        "(the default), which stores any key"
    )


def _folders(item: str, path: tuple[object, ...]) -> list[str]:
    """The folders of the leaf at ``path``, refused (``ValueError``) where they are no file path."""
    name = f"{WRAPPER}.{leaf_path(path, '.')}"
    for char, why in (("\\", "TensorStore reads '\\' as '/'"), ("\0", "a NUL ends a file path")):
        if char in name:
            raise _refuse(item, path, f"its keys hold {char!r} ({why})")
    folders = name.removesuffix("/").split("/")  # TensorStore drops one trailing "/"
    for folder in folders:
        if folder in ("", ".", ".."):
            why = "'//' in a key" if not folder else f"a folder named {folder!r}"
            raise _refuse(item, path, f"its keys join to the path {name!r}, with {why}")
        if folder.endswith(_LOCK_SUFFIX):
            raise _refuse(
                item, path, f"the folder {folder!r} ends with TensorStore's {_LOCK_SUFFIX!r}"
            )
        if len(folder.encode()) > _NAME_MAX:
            raise _refuse(item, path, f"the file name {folder[:40]!r}... is over {_NAME_MAX} bytes")
    return folders


def check_file_names(items: Mapping[str, PyTree]) -> None:
    """Refuse (``ValueError`` naming the leaf) a leaf a store without OCDBT cannot write or read.

    Besides a name that is no file path, a leaf whose folder holds another leaf's array files
    (``{"a": x, "a/c/0": y}``: ``c/0`` is ``a``'s chunk), and two leaves whose top folders nest
    by ``.`` (``tree.x`` and ``tree.x.y``, from ``{"x/": x, "x": {"y": y}}``), which orbax's
    restore in the writing store takes for one tree it cannot build.
    """
    for item, tree in items.items():
        pairs, _ = jax.tree_util.tree_flatten_with_path(tree)
        arrays: dict[tuple[object, ...], list[str]] = {}
        for path, leaf in pairs:
            if not isinstance(leaf, str):
                arrays[path] = _folders(item, path)
        folders = {"/".join(parts): path for path, parts in arrays.items()}
        tops = {tuple(parts[0].split(".")): path for path, parts in arrays.items()}
        for path, parts in arrays.items():
            for end in range(1, len(parts)):
                owner = folders.get("/".join(parts[:end]))
                if owner is not None and _ARRAY_FILES.fullmatch(parts[end]):
                    where = f"{parts[end]!r} holds the leaf {jax.tree_util.keystr(owner)}'s data"
                    raise _refuse(item, path, f"its folder {where}")
            top = parts[0].split(".")
            for end in range(1, len(top)):
                owner = tops.get(tuple(top[:end]))
                if owner is not None:
                    raise _refuse(
                        item,
                        path,
                        f"its folder {parts[0]!r} extends the leaf {jax.tree_util.keystr(owner)}'s "
                        f"{'.'.join(top[:end])!r} by '.', and orbax's restore cannot tell them apart",
                    )
