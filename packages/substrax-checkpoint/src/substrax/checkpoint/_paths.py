"""Where a run's checkpoints go, and whether a store's path is a directory."""

from pathlib import Path

from ._read_errors import CheckpointStoreNotADirectoryError, CheckpointStoreNotFoundError


def resolve_checkpoint_dir(checkpoint_dir: Path | None, run_dir: Path | None) -> Path:
    """An explicit ``checkpoint_dir`` wins, else ``run_dir / "checkpoints"``; creates nothing.

    The result is absolute: a relative path is resolved against the working directory now, as
    ``OrbaxCheckpointStore`` resolves its directory, so a later ``chdir`` cannot move it.

    Example:
        >>> from pathlib import Path
        >>> from substrax.checkpoint import resolve_checkpoint_dir
        >>> resolve_checkpoint_dir(None, Path("/runs/a"))
        PosixPath('/runs/a/checkpoints')
        >>> resolve_checkpoint_dir(Path("ckpt"), None) == Path.cwd().resolve() / "ckpt"
        True
    """
    for name, given in (("checkpoint_dir", checkpoint_dir), ("run_dir", run_dir)):
        if isinstance(given, str) and not given.strip():  # Path("") would be the working dir
            raise ValueError(f"{name}={given!r} is empty; pass a directory, or None")
    if checkpoint_dir is not None:
        return Path(checkpoint_dir).expanduser().resolve()
    if run_dir is not None:
        return (Path(run_dir).expanduser() / "checkpoints").resolve()
    raise ValueError(
        "neither checkpoint_dir nor run_dir is set; pass the checkpoint directory or the run's "
        "output directory (e.g. substrax.artifacts.resolve_output_dir(...).path)"
    )


def check_store_directory(directory: Path) -> None:
    """Raise unless ``directory`` is an existing directory (what a reader opens)."""
    if directory.is_dir():
        return
    if directory.exists():
        raise CheckpointStoreNotADirectoryError(directory=directory)
    raise CheckpointStoreNotFoundError(directory=directory)


def make_store_directory(directory: Path) -> None:
    """Create ``directory`` (and its parents) for a writer; a file in its place is an error."""
    if directory.exists() and not directory.is_dir():
        raise CheckpointStoreNotADirectoryError(directory=directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:  # a parent is a file
        raise CheckpointStoreNotADirectoryError(directory=directory) from error
