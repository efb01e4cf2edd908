r"""Write and show a shell file of managed JAX settings: ``python -m substrax.runtime.managed_env``.

``write`` renders a file that ``export``\ s or ``unset``\ s ``<P>_BACKEND``, ``<P>_ENV_ROOT`` and
the JAX variables for a backend (``auto`` resolves it from the machine), listing every variable it
manages in ``<P>_MANAGED_ENV_VARS``; an activation script sources it. ``show`` prints what a
shell would end up with after sourcing it and then any user env files (``NAME=value`` lines).

Example:
    >>> env = managed_environment("PROJ", "cuda12", env_root="/srv/proj")
    >>> env["XLA_PYTHON_CLIENT_PREALLOCATE"], env["XLA_CLIENT_MEM_FRACTION"]
    ('false', '0.75')
    >>> print(render(managed_environment("PROJ", "cpu", env_root="/p")).splitlines()[3])
    export JAX_PLATFORMS=cpu
"""
    >>> from substrax.runtime.managed_env import managed_environment, render

import argparse
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal, get_args


type Backend = Literal["cpu", "cuda12", "metal"]
type BackendChoice = Literal["auto", "cpu", "cuda12", "metal"]

BACKEND_CHOICES: tuple[str, ...] = get_args(BackendChoice.__value__)

_JAX_VARIABLES = (
    "JAX_PLATFORMS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION",
)


def nvidia_gpu_visible(*, timeout: float = 10.0) -> bool:
    """Whether ``nvidia-smi -L`` lists at least one GPU (``False`` when it is missing or fails).

    Example:
        >>> isinstance(nvidia_gpu_visible(), bool)
        True
    """
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return False
    try:
        result = subprocess.run(
            [executable, "-L"], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and any(
        line.startswith("GPU ") for line in result.stdout.splitlines()
    )


def resolve_backend(
    choice: str, *, system: str | None = None, machine: str | None = None, gpu: bool | None = None
) -> Backend:
    """Resolve ``auto`` to cuda12 (Linux with a visible GPU), metal (Darwin arm64) or cpu.

    Args:
        choice: ``auto``, ``cpu``, ``cuda12`` or ``metal``.
        system: ``platform.system()`` by default.
        machine: ``platform.machine()`` by default.
        gpu: Whether an NVIDIA GPU is visible; probed with ``nvidia_gpu_visible`` by default.

    Returns:
        The concrete backend.

    Raises:
        ValueError: ``choice`` is not one of the four.

    Example:
        >>> resolve_backend("auto", system="Darwin", machine="arm64")
        'metal'
    """
    if choice not in BACKEND_CHOICES:
        raise ValueError(f"backend {choice!r} is not one of {', '.join(BACKEND_CHOICES)}")
    if choice != "auto":
        return choice  # type: ignore[return-value]
    system = platform.system() if system is None else system
    machine = platform.machine() if machine is None else machine
    if system == "Darwin" and machine == "arm64":
        return "metal"
    if system == "Linux" and (nvidia_gpu_visible() if gpu is None else gpu):
        return "cuda12"
    return "cpu"


def _check_prefix(prefix: str) -> None:
    if not prefix or not prefix.replace("_", "A").isalnum() or not prefix.isupper():
        raise ValueError(f"prefix {prefix!r} must be upper-case letters, digits and underscores")


def managed_environment(
    prefix: str,
    backend: Backend,
    *,
    env_root: str,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str | None]:
    """The variables the file manages: a value to export, or ``None`` to unset.

    Args:
        prefix: The project's prefix, e.g. ``"SUBSTRAX"``.
        backend: ``cpu``, ``cuda12`` or ``metal``.
        env_root: The project's root, exported as ``<P>_ENV_ROOT``.
        overrides: Extra ``NAME: value`` pairs (``--set``), managed too.

    Returns:
        The managed variables, ``<P>_MANAGED_ENV_VARS`` listing them all.

    Raises:
        ValueError: The prefix, backend or an override name is invalid.

    Example:
        >>> managed_environment("P", "cpu", env_root="/p")["XLA_CLIENT_MEM_FRACTION"] is None
        True
    """
    _check_prefix(prefix)
    if backend not in ("cpu", "cuda12", "metal"):
        raise ValueError(f"backend {backend!r} must be cpu, cuda12 or metal (resolve auto first)")
    env: dict[str, str | None] = {f"{prefix}_BACKEND": backend, f"{prefix}_ENV_ROOT": env_root}
    if backend == "cpu":
        env.update(dict.fromkeys(_JAX_VARIABLES))
        env["JAX_PLATFORMS"] = "cpu"
    else:
        # On accelerators: no preallocation, and leave a quarter of memory to other processes.
        env["JAX_PLATFORMS"] = "cuda" if backend == "cuda12" else None
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        env["XLA_CLIENT_MEM_FRACTION"] = "0.75"
    for name, value in (overrides or {}).items():
        if not name or not name.replace("_", "A").isalnum() or name[0].isdigit():
            raise ValueError(f"--set name {name!r} is not a shell variable name")
        env[name] = value
    managed = f"{prefix}_MANAGED_ENV_VARS"
    env[managed] = " ".join(sorted([*env, managed]))
    return env


def render(env: Mapping[str, str | None]) -> str:
    """Render variables as ``export``/``unset`` lines for a POSIX shell.

    Example:
        >>> print(render({"A": "x y", "B": None}))
        # Managed by python -m substrax.runtime.managed_env; regenerate rather than edit.
        export A='x y'
        unset B
        <BLANKLINE>
    """
    lines = ["# Managed by python -m substrax.runtime.managed_env; regenerate rather than edit."]
    for name, value in env.items():
        lines.append(f"unset {name}" if value is None else f"export {name}={shlex.quote(value)}")
    return "\n".join(lines) + "\n"


def _read_shell_file(path: Path) -> dict[str, str | None]:
    env: dict[str, str | None] = {}
    for raw in path.read_text().splitlines():
        words = shlex.split(raw, comments=True)
        if not words:
            continue
        if words[0] == "unset":
            env.update(dict.fromkeys(words[1:]))
            continue
        assignment = words[1] if words[0] == "export" and len(words) > 1 else words[0]
        name, sep, value = assignment.partition("=")
        if not sep:
            raise ValueError(f"{path}: cannot read line {raw!r}; expected NAME=value")
        env[name] = value
    return env


def _show(prefix: str, env_file: Path, user_envs: Sequence[Path]) -> str:
    env = _read_shell_file(env_file)
    managed = set((env.get(f"{prefix}_MANAGED_ENV_VARS") or "").split())
    origin = dict.fromkeys(env, str(env_file))
    for user_env in user_envs:
        for name, value in _read_shell_file(user_env).items():
            env[name] = value
            origin[name] = str(user_env)
    lines: list[str] = []
    for name in sorted(env):
        value = env[name]
        shown = "(unset)" if value is None else value
        tag = "" if name in managed else "  [not managed]"
        lines.append(f"{name}={shown}  # {origin[name]}{tag}")
    return "\n".join(lines) + "\n"


def _parse_set(values: Sequence[str]) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"--set {item!r} must be NAME=VALUE")
        pairs[name] = value
    return pairs


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``write`` or ``show`` command; returns the exit status.

    Example:
        >>> main(["show", "--help"])  # doctest: +SKIP
    """
    parser = argparse.ArgumentParser(prog="python -m substrax.runtime.managed_env")
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="write the managed env file")
    write.add_argument("--prefix", required=True)
    write.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    write.add_argument("--output", required=True, type=Path)
    write.add_argument("--env-root", type=Path, default=None)
    write.add_argument("--set", dest="overrides", action="append", default=[], metavar="N=V")
    show = commands.add_parser("show", help="show the variables a shell ends up with")
    show.add_argument("--prefix", required=True)
    show.add_argument("--env-file", required=True, type=Path)
    show.add_argument("--user-env", action="append", default=[], type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "write":
            output: Path = args.output
            root: Path = args.env_root or output.resolve().parent
            env = managed_environment(
                args.prefix,
                resolve_backend(args.backend),
                env_root=str(root.resolve()),
                overrides=_parse_set(args.overrides),
            )
            output.parent.mkdir(parents=True, exist_ok=True)
            output.write_text(render(env))
        else:
            sys.stdout.write(_show(args.prefix, args.env_file, args.user_env))
    except (ValueError, argparse.ArgumentTypeError, OSError) as error:
        parser.error(str(error))
    return 0


if __name__ == "__main__":
    sys.exit(main())
