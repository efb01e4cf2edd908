"""Resolve where a run writes its outputs: never the working tree."""

import errno
import functools
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import Literal, get_args

from substrax.support import check_type


OUTPUT_DIR_ENV = "AVITAI_OUTPUT_DIR"

type OutputSource = Literal["argument", "environment", "run_default"]

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)  # by position too, in 0.1.22's order
class OutputLocation:
    """A resolved output directory and where the choice came from.

    Attributes:
        path: The directory (it exists).
        source: ``"argument"``, ``"environment"`` or ``"run_default"``.

    Raises:
        TypeError: ``path`` is not a ``Path``, or ``source`` not a str.
        ValueError: ``source`` is not one of the three above.

    Example:
        >>> from pathlib import Path
        >>> from substrax.artifacts import OutputLocation
        >>> OutputLocation(path=Path("/tmp/x"), source="argument").source
        'argument'
    """

    path: Path
    source: OutputSource

    def __post_init__(self) -> None:
        check_type("path", self.path, Path, "a pathlib.Path")
        allowed = get_args(OutputSource.__value__)
        if check_type("source", self.source, str, f"one of {allowed}") not in allowed:
            raise ValueError(f"source={self.source!r} must be one of {allowed}")


def _check_name(name: str) -> PurePath:
    if not isinstance(name, str):  # pyright: ignore[reportUnnecessaryIsInstance]
        hint = " (a directory of your own goes in explicit=)" if isinstance(name, PurePath) else ""
        raise TypeError(f"output name must be a str naming the run's outputs, got {name!r}{hint}")
    if not name.strip():
        raise ValueError(f"output name must be a non-empty relative path, got {name!r}")
    if "\0" in name:
        raise ValueError(
            f"output name {name!r} holds a NUL character, which no path may; remove it"
        )
    relative = PurePath(name)
    if relative.is_absolute() or relative.anchor or ".." in relative.parts:
        raise ValueError(
            f"output name {name!r} must be a relative path inside the output directory, "
            "without '..'"
        )
    if not relative.parts:  # "." or "./.": the output root itself, shared by every run
        raise ValueError(
            f"output name {name!r} names no directory of its own; name the run's outputs, "
            "e.g. resolve_output_dir('fno_darcy'), or pass explicit= for an exact directory"
        )
    return relative


@functools.cache
def _run_directory(temp_root: str, pid: int) -> Path:
    # One directory per process and temporary root, created on first use; keyed by the process
    # id too, so that a forked child makes its own instead of sharing its parent's.
    del pid
    return Path(tempfile.mkdtemp(prefix="avitai-run-", dir=temp_root))


def _refuse_broken_links(path: Path, given: str) -> None:
    """A ValueError naming ``given`` where a link on ``path`` leads nowhere, or loops.

    Checked before anything is created: following a dangling link would create its target (a
    run meant for an unmounted volume would write to the local disk).
    """
    for link in (path, *path.parents):
        if not link.is_symlink():
            continue
        try:
            os.stat(link)  # noqa: PTH116  (the errno tells a loop from a missing target)
        except OSError as error:
            if error.errno not in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                raise
            where = ":" if link == path else f" leads to {str(path)!r}, but"
            if error.errno == errno.ELOOP:
                raise ValueError(
                    f"{given}{where} {str(link)!r} is a symbolic link that loops back on itself "
                    f"(to {str(link.readlink())!r}); point it at a directory, or remove it"
                ) from None
            raise ValueError(
                f"{given}{where} {str(link)!r} is a symbolic link to "
                f"{str(link.readlink())!r}, a path that does not exist; create the link's "
                "target directory (mount its volume), or remove the link"
            ) from None


def _make(path: Path, given: str) -> None:
    """Create ``path``; a ValueError naming ``given`` where a file or broken link is in its way."""
    _refuse_broken_links(path, given)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError) as error:
        chain = (path, *path.parents)
        blocker = next((p for p in chain if p.exists() and not p.is_dir()), path)
        where = ":" if blocker == path else f" leads to {str(path)!r}, but"
        raise ValueError(
            f"{given}{where} {str(blocker)!r} is a file, not a directory; choose a directory "
            "(or a path that does not exist yet), or move the file away"
        ) from error


def resolve_output_dir(
    name: str, *, explicit: Path | str | None = None, env: Mapping[str, str] | None = None
) -> OutputLocation:
    """Pick (and create) the directory a run writes ``name``'s outputs to.

    In order: ``explicit`` (resolved); ``$AVITAI_OUTPUT_DIR/name``, where the variable must be
    absolute; ``<tmp>/avitai-run-XXXX/name`` under a run directory created once per process (a
    forked child makes its own).
    It never defaults into the working directory.

    Args:
        name: A non-empty relative path naming the run's outputs, e.g. ``"fno_darcy"``.
        explicit: A directory chosen by the caller; used as given (``name`` is not appended).
        env: The environment to read; defaults to ``os.environ``.

    Returns:
        The created directory and its source.

    Raises:
        ValueError: ``name`` is empty, ``"."``, absolute or climbs with ``..``; ``explicit``
            is empty; ``AVITAI_OUTPUT_DIR`` is not absolute; any of them holds a NUL
            character; or a file, or a symbolic link to a path that does not exist (or one
            that loops), stands where the directory (or one above it) would be; nothing is
            created then, not even a dangling link's target.

    Example:
        >>> import tempfile
        >>> from substrax.artifacts import resolve_output_dir
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     location = resolve_output_dir("demo", env={"AVITAI_OUTPUT_DIR": directory})
        ...     location.source, location.path.name, location.path.is_dir()
        ('environment', 'demo', True)
    """
    relative = _check_name(name)
    environ = os.environ if env is None else env
    if explicit is not None:
        if not str(explicit).strip():  # Path("") is the working directory
            raise ValueError(
                f"explicit={explicit!r} names no directory; pass one, such as 'outputs/run1', "
                "or None for the default"
            )
        given = f"explicit={str(explicit)!r}"
        if "\0" in str(explicit):
            raise ValueError(f"{given} holds a NUL character, which no path may; remove it")
        path = Path(explicit).expanduser().absolute()
        _refuse_broken_links(path, given)  # resolve() would follow a dangling link
        path, source = path.resolve(), "argument"
    elif raw := environ.get(OUTPUT_DIR_ENV, ""):
        given = f"{OUTPUT_DIR_ENV}={raw!r} with output name {name!r}"
        if "\0" in raw:
            raise ValueError(
                f"{OUTPUT_DIR_ENV}={raw!r} holds a NUL character, which no path may; set it to "
                "an absolute directory"
            )
        root = Path(raw).expanduser()
        if not root.is_absolute():
            raise ValueError(
                f"{OUTPUT_DIR_ENV}={raw!r} must be an absolute path; set it to e.g. "
                f"{str(Path(raw).resolve())!r}"
            )
        path, source = root / relative, "environment"
    else:
        run = _run_directory(tempfile.gettempdir(), os.getpid())
        given = f"output name {name!r} under the run directory {str(run)!r}"
        path, source = run / relative, "run_default"
    _make(path, given)
    _LOG.info("outputs of %s go to %s (%s)", name, path, source)
    return OutputLocation(path=path, source=source)
