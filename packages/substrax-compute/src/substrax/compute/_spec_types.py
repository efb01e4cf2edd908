"""The validated field types of the job spec and the config: counts, names, paths and argv.

Each refusal is a plain ``ValueError``, as pydantic asks; it names what a value must be.

Example:
    >>> from pydantic import TypeAdapter, ValidationError
    >>> from substrax.compute._spec_types import Argv
    >>> try:
    ...     TypeAdapter(Argv).validate_python(("bash", "-c", "echo hi"))
    ... except ValidationError as error:
    ...     print(error.errors()[0]["msg"])
    Value error, runs a shell string (bash -c ...); write the command as an argv list instead
"""

import math
import re
from pathlib import PurePosixPath
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator

from ._records import COMPONENT


_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED_PATHS = (PurePosixPath("/outputs"), PurePosixPath("/project"))
_SHELLS = frozenset({"sh", "bash", "zsh", "dash", "ksh", "fish", "csh", "tcsh"})


def _positive(value: float) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError("must be positive and finite")
    return value


MAX_NODES = 1024
"""The most nodes a job may ask for; a count beyond it is a typo, not a cluster."""
MAX_ACCELERATORS = 64
"""The most accelerators one node may ask for."""
MAX_MEMORY_MIB = 1 << 24
"""The most memory a job may ask for per node, in MiB (16 TiB)."""


def _at_most(maximum: int) -> AfterValidator:
    def check(value: int) -> int:
        if not 1 <= value <= maximum:
            raise ValueError(f"must be between 1 and {maximum}")
        return value

    return AfterValidator(check)


def _component(value: str) -> str:
    if not COMPONENT.fullmatch(value) or value in {".", ".."}:
        raise ValueError("must be one name of letters, digits, '.', '_' or '-' (no '/' or '..')")
    return value


def _env_name(value: str) -> str:
    if not _ENV_NAME.fullmatch(value):
        raise ValueError("must be an environment variable name")
    return value


def _mount_path(value: str) -> str:
    path = PurePosixPath(value)
    if not path.is_absolute() or ".." in path.parts or str(path) != value or path == path.parent:
        raise ValueError("must be an absolute, normalised path other than '/'")
    for reserved in _RESERVED_PATHS:
        if path == reserved or reserved in path.parents or path in reserved.parents:
            raise ValueError(f"must not overlap {reserved}, which the worker owns")
    return value


def _is_dash_c(arg: str) -> bool:
    return arg.startswith("-") and not arg.startswith("--") and "c" in arg


def _relative_file(value: str) -> str:
    path = PurePosixPath(value)
    if not value or path.is_absolute() or ".." in path.parts or path.as_posix() != value:
        raise ValueError("must be a file path relative to the project, normalised, without '..'")
    return value


def _nul_reason(value: str) -> str:
    return (
        f"holds a NUL character (\\0) at index {value.index(chr(0))}, which no program's "
        "argument or environment variable can hold; remove it"
    )


def _env_value(value: str) -> str:
    if "\0" in value:
        raise ValueError(_nul_reason(value))
    return value


def _argv(value: tuple[str, ...]) -> tuple[str, ...]:
    if not value or not value[0]:
        raise ValueError("must be a non-empty list of arguments (argv), e.g. ['python', 'x.py']")
    for index, arg in enumerate(value):
        if "\0" in arg:
            raise ValueError(f"argument {index} ({arg!r}) {_nul_reason(arg)}")
    program = PurePosixPath(value[0]).name
    if program in _SHELLS and any(_is_dash_c(arg) for arg in value[1:]):
        raise ValueError(
            f"runs a shell string ({value[0]} -c ...); write the command as an argv list instead"
        )
    return value


type Positive = Annotated[float, AfterValidator(_positive)]
type NodeCount = Annotated[int, _at_most(MAX_NODES)]
type AcceleratorCount = Annotated[int, _at_most(MAX_ACCELERATORS)]
type MemoryMiB = Annotated[int, _at_most(MAX_MEMORY_MIB)]
type Component = Annotated[str, AfterValidator(_component)]
type EnvName = Annotated[str, AfterValidator(_env_name)]
type EnvValue = Annotated[str, AfterValidator(_env_value)]


def _listed(value: object) -> object:
    """A list given for a tuple field, as its tuple (0.1.22's dataclass took ``argv=[...]``)."""
    return tuple(value) if isinstance(value, list) else value  # pyright: ignore[reportUnknownArgumentType]


type Argv = Annotated[tuple[str, ...], BeforeValidator(_listed), AfterValidator(_argv)]
type RelativeFile = Annotated[str, AfterValidator(_relative_file)]
type MountPath = Annotated[str, AfterValidator(_mount_path)]
