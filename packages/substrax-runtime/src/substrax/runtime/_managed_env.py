"""The managed env file's contents: which backend, which variables, rendered for a shell.

The command line around them is ``_managed_env_cli``, run as ``python -m
substrax.runtime.managed_env``.
"""

import platform
import re
import shlex
import shutil
import subprocess
from collections.abc import Mapping
from typing import Literal, get_args

from ._xla_flags import HOST_DEVICE_COUNT_FLAG, device_count_conflict


type Backend = Literal["cpu", "cuda12", "metal"]
type BackendChoice = Literal["auto", "cpu", "cuda12", "metal"]

BACKEND_CHOICES: tuple[str, ...] = get_args(BackendChoice.__value__)

_JAX_VARIABLES = (
    "JAX_PLATFORMS",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_CLIENT_MEM_FRACTION",
)
_BACKEND_PLATFORMS = {"cpu": {"cpu"}, "cuda12": {"cuda", "gpu"}, "metal": {"metal"}}
_MEMORY_FRACTION = "XLA_CLIENT_MEM_FRACTION"
_DEPRECATED_MEMORY_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"


def nvidia_gpu_visible(*, timeout: float = 10.0) -> bool:
    """Whether ``nvidia-smi -L`` lists at least one GPU (``False`` when it is missing or fails).

    Example:
        >>> from substrax.runtime.managed_env import nvidia_gpu_visible
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
        >>> from substrax.runtime.managed_env import resolve_backend
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


def check_prefix(prefix: str) -> None:
    """Refuse a prefix that does not start a shell variable's name (``P``, ``MY_PROJ``).

    Raises:
        ValueError: ``prefix`` is not upper-case ASCII letters, digits and underscores, or
            starts with a digit.
    """
    if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", prefix):  # a shell variable name's start
        raise ValueError(
            f"prefix {prefix!r} must be upper-case ASCII letters, digits and underscores, "
            "not starting with a digit"
        )


def _check_value(name: str, value: str) -> None:
    """Refuse a value the env file (UTF-8, one variable a line) cannot hold."""
    if any(char in value for char in "\n\r\0"):
        raise ValueError(
            f"--set {name}={value!r}: the value holds a line break or NUL, which the env "
            "file (one variable a line) cannot hold; pass a single-line value"
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"{name}={value!r} holds text UTF-8 cannot encode (bytes the terminal could not "
            "decode); pass it as UTF-8"
        ) from None


def _release_keyword[T](
    name: str, value: T | None, release_name: str, release_value: T | None
) -> T | None:
    """One of a keyword and its 0.1.22 name; both given is a TypeError naming the two."""
    if value is not None and release_value is not None:
        raise TypeError(
            f"managed_environment got {name}={value!r} and {release_name}={release_value!r}, "
            f"which are the same setting ({release_name} is its 0.1.22 name); pass only {name}"
        )
    return release_value if value is None else value


def managed_environment(
    prefix: str,
    backend: Backend,
    *,
    env_root: str | None = None,
    overrides: Mapping[str, str] | None = None,
    project_root: str | None = None,
    extra: Mapping[str, str] | None = None,
) -> dict[str, str | None]:
    """The variables the file manages: a value to export, or ``None`` to unset.

    Args:
        prefix: The project's prefix, e.g. ``"SUBSTRAX"``.
        backend: ``cpu``, ``cuda12`` or ``metal``.
        env_root: The project's root, exported as ``<P>_ENV_ROOT``.
        overrides: Extra ``NAME: value`` pairs (``--set``), managed too; the deprecated
            ``XLA_PYTHON_CLIENT_MEM_FRACTION`` is written as ``XLA_CLIENT_MEM_FRACTION`` (jax
            refuses both), and ``<P>_BACKEND``/``<P>_ENV_ROOT`` only where they agree with
            ``backend``/``env_root``.
        project_root: ``env_root`` under its substrax 0.1.22 name.
        extra: ``overrides`` under its substrax 0.1.22 name.

    Returns:
        The managed variables, ``<P>_MANAGED_ENV_VARS`` listing them all.

    Raises:
        TypeError: Neither ``env_root`` nor ``project_root`` is given, or a setting is given
            under both its names.
        ValueError: The prefix, backend or an override name is invalid, an override's value
            holds a line break or NUL, an override contradicts ``backend``, ``env_root`` or
            the managed list, or both memory-fraction names are given two values.

    Example:
        >>> from substrax.runtime.managed_env import managed_environment
        >>> managed_environment("P", "cpu", env_root="/p")["XLA_CLIENT_MEM_FRACTION"] is None
        True
        >>> managed_environment("P", "cpu", project_root="/p", extra={"A": "1"})["A"]
        '1'
    """
    env_root = _release_keyword("env_root", env_root, "project_root", project_root)
    overrides = _release_keyword("overrides", overrides, "extra", extra)
    if env_root is None:
        raise TypeError(
            "managed_environment needs the project's root: pass env_root= (0.1.22: project_root=)"
        )
    check_prefix(prefix)
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
    _check_value(f"{prefix}_ENV_ROOT", env_root)
    managed = f"{prefix}_MANAGED_ENV_VARS"
    for name, value in _overrides(overrides or {}).items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ValueError(f"--set name {name!r} is not a shell variable name (ASCII)")
        _check_value(name, value)
        if name == managed:
            raise ValueError(
                f"--set {name}={value!r}: the file writes {name} itself (the variables it "
                "manages); drop the --set"
            )
        own = {f"{prefix}_BACKEND": "--backend", f"{prefix}_ENV_ROOT": "--env-root"}
        platforms = {platform.strip().lower() for platform in value.split(",")}
        if name == "JAX_PLATFORMS" and not platforms & _BACKEND_PLATFORMS[backend]:
            raise ValueError(
                f"--set JAX_PLATFORMS={value!r} names none of the platforms --backend {backend} "
                f"runs on ({', '.join(sorted(_BACKEND_PLATFORMS[backend]))}); drop the --set, or "
                "pass the --backend it means"
            )
        if name in own and env[name] != value:
            raise ValueError(
                f"--set {name}={value!r} contradicts the {name}={env[name]!r} the file writes "
                f"itself; drop the --set (pass {own[name]} instead)"
            )
        env[name] = value
    conflict = device_count_conflict(
        env.get("JAX_NUM_CPU_DEVICES"),
        _device_count_flag(env.get("XLA_FLAGS") or ""),
        count_from="--set",
        flag_from="--set XLA_FLAGS",
    )
    if conflict is not None:  # jax would take one and ignore the other
        raise ValueError(
            conflict.replace("JaxRuntime(cpu_devices=...)", "--set JAX_NUM_CPU_DEVICES")
        )
    env[managed] = " ".join(sorted([*env, managed]))
    return env


def _device_count_flag(flags: str) -> str | None:
    """The device-count flag's value in ``flags`` (XLA takes the last one given), or None."""
    found = None
    for token in flags.split():
        name, _, value = token.partition("=")
        if name == HOST_DEVICE_COUNT_FLAG:
            found = value
    return found


def _overrides(overrides: Mapping[str, str]) -> dict[str, str]:
    """``overrides`` with the deprecated memory-fraction name written as the current one.

    jax refuses to start on a GPU when both names are set, so the file holds one.
    """
    result = dict(overrides)
    if _DEPRECATED_MEMORY_FRACTION not in result:
        return result
    value = result.pop(_DEPRECATED_MEMORY_FRACTION)
    current = result.setdefault(_MEMORY_FRACTION, value)
    if current != value:
        raise ValueError(
            f"--set {_DEPRECATED_MEMORY_FRACTION}={value!r} and --set {_MEMORY_FRACTION}="
            f"{current!r} set one setting (the first is its deprecated name) to two values; "
            f"pass only --set {_MEMORY_FRACTION}=..."
        )
    return result


def render(env: Mapping[str, str | None]) -> str:
    """Render variables as ``export``/``unset`` lines for a POSIX shell.

    Example:
        >>> from substrax.runtime.managed_env import render
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
