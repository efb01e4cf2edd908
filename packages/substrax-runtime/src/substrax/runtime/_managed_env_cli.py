"""``python -m substrax.runtime.managed_env``: write the managed env file, or show what it sets.

``show --json`` prints each variable's value, origin file and whether the file manages it.

Exit 0 when done, 1 when the file cannot be written, 2 for bad usage or input (a prefix, a
``--set`` with a newline in its value, a name ``--set`` twice or an option given twice, an env file that cannot be read or is not UTF-8, an
empty path, an ``--output`` that is a directory or lies under a file, an ``--env-root`` that is
not a directory); errors are one line,
``python -m substrax.runtime.managed_env: error: <message>``. ``write --output`` through a
symbolic link writes the file the link points to, and the link stays.
"""

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path

from substrax.support import (
    CommandFailedError,
    UsageError,
    add_json_flag,
    emit,
    run_command,
    write_atomically,
)

from ._managed_env import (
    BACKEND_CHOICES,
    check_prefix,
    managed_environment,
    render,
    resolve_backend,
)


PROG = "python -m substrax.runtime.managed_env"


def _assignment(text: str, *, refusal: str) -> tuple[str, str]:
    """``NAME=value`` split at its first ``=``; no ``=`` is a :class:`UsageError` saying ``refusal``."""
    name, sep, value = text.partition("=")
    if not sep:
        raise UsageError(refusal)
    return name, value


def _path(text: str) -> Path:
    """A path argument; an empty one is refused (``Path("")`` would be the working directory)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("the path is empty; pass a file's path")
    return Path(text)


def _read_shell_file(path: Path) -> dict[str, str | None]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot read {path}: {error.strerror or error}") from error
    except UnicodeDecodeError as error:
        raise UsageError(
            f"cannot read {path}: it is not UTF-8 text (byte {error.start}); pass an env file "
            f"written by `{PROG} write`, or convert it to UTF-8"
        ) from None
    env: dict[str, str | None] = {}
    for raw in text.splitlines():
        try:
            words = shlex.split(raw, comments=True)
        except ValueError as error:  # an unclosed quote
            raise UsageError(f"{path}: cannot read line {raw!r}: {error}") from None
        if not words:
            continue
        if words[0] == "unset":
            env.update(dict.fromkeys(words[1:]))
            continue
        assignment = words[1] if words[0] == "export" and len(words) > 1 else words[0]
        name, value = _assignment(
            assignment, refusal=f"{path}: cannot read line {raw!r}; expected NAME=value"
        )
        env[name] = value
    return env


def _show(args: argparse.Namespace) -> int:
    try:
        check_prefix(args.prefix)
    except ValueError as error:
        raise UsageError(str(error)) from error
    env_file: Path = args.env_file
    env = _read_shell_file(env_file)
    managed = set((env.get(f"{args.prefix}_MANAGED_ENV_VARS") or "").split())
    origin = dict.fromkeys(env, str(env_file))
    for user_env in args.user_env:
        for name, value in _read_shell_file(user_env).items():
            env[name] = value
            origin[name] = str(user_env)
    lines: list[str] = []
    data: dict[str, dict[str, str | bool | None]] = {}
    for name in sorted(env):
        value = env[name]
        shown = "(unset)" if value is None else value
        tag = "" if name in managed else "  [not managed]"
        lines.append(f"{name}={shown}  # {origin[name]}{tag}")
        data[name] = {"value": value, "origin": origin[name], "managed": name in managed}
    emit(data, "\n".join(lines), as_json=args.json)
    return 0


def _parse_set(values: Sequence[str]) -> dict[str, str]:
    """``--set`` values by name; a name set twice is refused (the last would win unseen)."""
    overrides: dict[str, str] = {}
    for item in values:
        name, value = _assignment(item, refusal=f"--set {item!r} must be NAME=VALUE")
        if name in overrides:
            raise UsageError(
                f"--set {name} is given twice ({name}={overrides[name]!r} and {name}={value!r}); "
                "set each name once"
            )
        overrides[name] = value
    return overrides


class _Once(argparse.Action):
    """Store an option's value; the option given twice is a usage error (argparse keeps the last)."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        earlier: object = getattr(namespace, self.dest, None)
        if earlier is not None:
            parser.error(f"{option_string} is given twice ({earlier} and {values}); pass it once")
        setattr(namespace, self.dest, values)


def _write(args: argparse.Namespace) -> int:
    output: Path = args.output.resolve()  # through a symbolic link: write the file it names
    if output.is_dir():
        raise UsageError(
            f"--output {args.output} is a directory; pass the env file's path, e.g. "
            f"{args.output / f'.{args.prefix.lower()}.env'}"
        )
    for path in output.parents:
        if path.exists() and not path.is_dir():
            raise UsageError(
                f"--output {args.output}: {path} is a file, not a directory; pass a path in a "
                "directory"
            )
    if args.env_root is not None and not args.env_root.is_dir():
        what = "is not a directory" if args.env_root.exists() else "does not exist"
        raise UsageError(f"--env-root {args.env_root} {what}; pass the project's root directory")
    root: Path = args.env_root or output.parent
    try:
        env = managed_environment(
            args.prefix,
            resolve_backend(args.backend),
            env_root=str(root.resolve()),
            overrides=_parse_set(args.overrides),
        )
    except ValueError as error:
        raise UsageError(str(error)) from error
    try:
        write_atomically(output, render(env))
    except OSError as error:
        raise CommandFailedError(f"cannot write {output}: {error.strerror or error}") from error
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG)
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="write the managed env file")
    write.add_argument("--prefix", required=True, action=_Once)
    write.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    write.add_argument("--output", required=True, type=_path, action=_Once)
    write.add_argument("--env-root", type=_path, default=None, action=_Once)
    write.add_argument("--set", dest="overrides", action="append", default=[], metavar="N=V")
    show = commands.add_parser("show", help="show the variables a shell ends up with")
    show.add_argument("--prefix", required=True, action=_Once)
    show.add_argument("--env-file", required=True, type=_path, action=_Once)
    show.add_argument("--user-env", action="append", default=[], type=_path)
    add_json_flag(show)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``write`` or ``show`` command; returns the exit status (0, 1 or 2).

    argparse's own usage errors exit 2 from inside ``parse_args``, as for every substrax command.

    Example:
        >>> import contextlib, io
        >>> from substrax.runtime.managed_env import main
        >>> with contextlib.redirect_stderr(io.StringIO()) as err:
        ...     main(["show", "--prefix", "P", "--env-file", "/no/such/file.env"])
        2
        >>> print(err.getvalue(), end="")
        python -m substrax.runtime.managed_env: error: cannot read /no/such/file.env: No such file or directory
    """
    args = _parser().parse_args(argv)
    command = _write if args.command == "write" else _show
    return run_command(PROG, lambda: command(args))
