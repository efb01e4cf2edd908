"""Directories the CLI writes to, refused up front when a plain file stands in the way."""

from pathlib import Path


class DirectoryPathError(NotADirectoryError):
    """A path that must be (or become) a directory is a file, or lies under one.

    Attributes:
        path: The directory asked for.
        blocker: The existing file in the way (``path`` itself or one of its parents).
        what: What the directory is for, e.g. ``"--into"``.
    """

    def __init__(self, path: Path, blocker: Path, *, what: str, fix: str) -> None:
        self.path, self.blocker, self.what = path, blocker, what
        if blocker == path:
            message = f"{what} {path} is a file, not a directory; {fix}"
        else:
            message = f"{what} {path} cannot be a directory: {blocker} is a file; {fix}"
        super().__init__(message)

    def __str__(self) -> str:
        return str(self.args[0])


DirectoryPathError.__module__ = "substrax.compute"  # its public home


def require_directory(path: Path, *, what: str, fix: str) -> Path:
    """``path`` when it is a directory or can be created as one (nothing is created).

    Raises:
        DirectoryPathError: ``path`` or one of its parents is an existing non-directory.

    Example:
        >>> import tempfile
        >>> file = Path(tempfile.mkdtemp()) / "notes.txt"
        >>> _ = file.write_text("x")
        >>> require_directory(file / "out", what="--into", fix="pass a directory")
        Traceback (most recent call last):
        ...
        substrax.compute.DirectoryPathError: --into .../notes.txt/out cannot be a directory: .../notes.txt is a file; pass a directory
    """
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                raise DirectoryPathError(path, candidate, what=what, fix=fix)
            break
    return path
