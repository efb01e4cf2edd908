"""``run_example``: run one example script in its own interpreter, outputs redirected.

An example that cannot run here (it needs a GPU, or an extra that is not installed) says so
instead of failing: it exits with :data:`EXIT_UNAVAILABLE` (77, the "skipped" status of
automake and CTest) after writing the reason as its last line on stderr. The run is then
``unavailable`` rather than failed, and :func:`unavailable_reason` returns that reason.
"""

import json
import secrets
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, Self, cast

from substrax.support import check_seconds, check_type

from ._child import ChildResult, run_python
from ._errors import ExampleNotFoundError, ExampleTimeoutError
from ._output import STDERR_TAIL_LINES


if TYPE_CHECKING:
    from substrax.runtime import JaxRuntime
    from substrax.typing import JsonValue

EXIT_UNAVAILABLE: Final = 77
"""The exit status of an example that cannot run here; its last stderr line gives the reason."""

UNAVAILABLE_PREFIX: Final = "unavailable:"
"""An optional prefix of that reason line (``unavailable: needs a GPU``), dropped when read."""

# a line, then main()'s JSON; each run's ends with a token of its own, which the example does
# not see (printing the marker itself and exiting before main() returns cannot fake a summary)
_SUMMARY_MARKER: Final = "substrax.testing: main() returned:"

# Runs in the child: load the example as multiprocessing's spawned children load a main script
# (the module ``__mp_main__``, also registered as ``__main__``, its file the example's and no
# spec), so its ``if __name__ == "__main__":`` block does not run and a spawned child (a
# "spawn" pool) imports the functions sent to it. Then call main() and print the marker line and
# its JSON, on lines of their own. The example sees what a script run would: ``sys.argv ==
# [path]`` (so an argparse main() reads no arguments), its own directory first on sys.path unless
# PYTHONSAFEPATH is set, in place of the working directory (the repository root) that ``python
# -c`` puts there as "" (the entries PYTHONPATH names stay, the repository root too if named).
_CALL_MAIN = """\
import json, sys, types
from pathlib import Path

path, marker = Path(sys.argv[1]), __SUMMARY_MARKER__ + " " + sys.argv[2]
sys.argv = [str(path)]
if not sys.flags.safe_path and sys.path[:1] == [""]:
    sys.path[0] = str(path.parent)
module = types.ModuleType("__mp_main__")
module.__file__ = str(path)
module.__spec__ = None
sys.modules["__main__"] = sys.modules["__mp_main__"] = module
exec(compile(path.read_bytes(), str(path), "exec"), module.__dict__)  # no .pyc beside it, as a script
if not callable(getattr(module, "main", None)):
    sys.exit(f"{path} defines no main(); run it with call_main=False")


def plain(value):
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()  # numpy and jax arrays; a 0-d array becomes a scalar
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"main() returned a {type(value).__name__}, which is not JSON")


summary = json.dumps(module.main(), default=plain)
# "\\n" first: main() may have left a line unfinished (progress dots)
sys.stdout.write("\\n" + marker + "\\n" + summary + "\\n")
sys.stdout.flush()
""".replace("__SUMMARY_MARKER__", repr(_SUMMARY_MARKER))


@dataclass(frozen=True, slots=True, kw_only=True)
class ExampleRun:
    """One example's run.

    Attributes:
        path: The example script.
        output_dir: Where its outputs went (``AVITAI_OUTPUT_DIR`` in the child).
        result: The child interpreter's result.
        summary: What ``main()`` returned, as JSON, when the example ran with
            ``call_main=True`` and succeeded; otherwise ``None``.
    """

    path: Path
    output_dir: Path
    result: ChildResult
    summary: "JsonValue | None"

    @property
    def unavailable(self) -> str | None:
        """The reason the example gave for not running here, or None.

        Set when it exited with :data:`EXIT_UNAVAILABLE`: its last non-empty stderr line,
        without the ``unavailable:`` prefix (``"(no reason given)"`` when stderr was empty).
        """
        return unavailable_reason(self.result)

    @property
    def status(self) -> str:
        """``"succeeded"``, ``"unavailable: <reason>"`` or ``"failed"``."""
        if self.result.succeeded:
            return "succeeded"
        reason = self.unavailable
        return "failed" if reason is None else f"unavailable: {reason}"

    def check(self) -> Self:
        """Return this run if the example exited with status 0.

        Raises:
            ChildFailedError: The example failed, or was unavailable; the message ends with
                its stderr tail.
        """
        self.result.check()
        return self

    def check_or_skip(self, signatures: Sequence[str] = ()) -> Self:
        """In a test: skip it when the example was unavailable, else :meth:`check` the run.

        Args:
            signatures: Also take a failure whose stderr holds one of these texts
                (case-insensitive) as unavailable, as :func:`unavailable_reason` does.

        Returns:
            This run, when it succeeded.

        Raises:
            pytest.skip.Exception: The example was unavailable; the reason reads
                ``unavailable: <reason>`` (for a signature: the stderr line that holds it).
            ChildFailedError: The example failed.
        """
        import pytest  # noqa: PLC0415 - only tests call this

        reason = unavailable_reason(self.result, signatures)
        if reason is not None and self.result.returncode != EXIT_UNAVAILABLE:
            lines = self.result.stderr.splitlines()  # a signature: name the line that holds it
            reason = next(
                (line.strip() for line in reversed(lines) if reason.lower() in line.lower()),
                reason,  # it spans a line break: the signature as given
            )
        if reason is not None:
            pytest.skip(f"unavailable: {reason}")
        return self.check()


def unavailable_reason(
    run: "ExampleRun | ChildResult", signatures: Sequence[str] = ()
) -> str | None:
    """Why a run could not run here, or None when it ran (or failed for another reason).

    A run that exited with :data:`EXIT_UNAVAILABLE` gives its last non-empty stderr line
    (without an ``unavailable:`` prefix). Otherwise, for a failed run, the first of
    ``signatures`` found case-insensitively in its stderr is the reason, as given (as in
    substrax 0.1.22). A run that succeeded is never unavailable.

    Args:
        run: An example's run, or a child interpreter's result.
        signatures: Texts that mark a missing capability in a failed run's stderr, such as
            ``"MissingExtraError"`` or ``"Unable to initialize backend 'cuda'"``.

    Returns:
        The reason, or None.

    Example:
        >>> from substrax.testing import run_python, unavailable_reason
        >>> program = "import sys; sys.exit('unavailable: needs 8 GPUs')"
        >>> unavailable_reason(run_python(program, timeout=60)) is None  # exit status 1
        True
        >>> program = "import sys; print('needs 8 GPUs', file=sys.stderr); sys.exit(77)"
        >>> unavailable_reason(run_python(program, timeout=60))
        'needs 8 GPUs'
        >>> program = "import wandb_not_installed"
        >>> unavailable_reason(run_python(program, timeout=60), ["CUDA", "no module named"])
        'no module named'
    """
    if isinstance(signatures, str) or not all(isinstance(t, str) and t for t in signatures):  # pyright: ignore[reportUnnecessaryIsInstance] - user input
        raise TypeError(f"signatures must be a sequence of non-empty texts, not {signatures!r}")
    result = run.result if isinstance(run, ExampleRun) else run
    lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
    if result.returncode == EXIT_UNAVAILABLE:
        reason = lines[-1] if lines else "(no reason given)"
        if reason.lower().startswith(UNAVAILABLE_PREFIX):
            reason = reason[len(UNAVAILABLE_PREFIX) :].strip() or "(no reason given)"
        return reason
    if result.succeeded:
        return None
    found = result.stderr.lower()
    return next((signature for signature in signatures if signature.lower() in found), None)


def _text(stream: str | bytes | None) -> str:
    if isinstance(stream, bytes):
        return stream.decode(errors="replace")
    return stream or ""


def run_example(
    path: Path | str,
    *,
    repo_root: Path | str,
    output_dir: Path | str,
    timeout: float,
    call_main: bool,
    runtime: "JaxRuntime | None" = None,
    env: Mapping[str, str] | None = None,
) -> ExampleRun:
    """Run one example in a fresh interpreter, with its outputs sent to ``output_dir``.

    The child runs in ``repo_root`` with ``AVITAI_OUTPUT_DIR=output_dir``, so an example that
    resolves its outputs with ``substrax.artifacts.resolve_output_dir`` never writes into the
    repository. With ``call_main``, the file is loaded as a spawned multiprocessing child loads
    a main script (the module ``__mp_main__``, registered as ``__main__`` too, so its ``if
    __name__ == "__main__":`` block does not run and a "spawn" pool's children can import its
    functions), its ``main()`` is called, and the JSON of what it returns, printed on a line of
    its own after a marker line, becomes ``ExampleRun.summary``; otherwise the file runs as a
    script. Either way the example sees what a script run sees:
    ``sys.argv == [path]`` (``main()`` gets no command-line arguments), the script's directory
    first on ``sys.path`` unless ``PYTHONSAFEPATH`` is set (in ``env`` or this environment),
    and the repository root kept off ``sys.path`` unless ``PYTHONPATH`` names it (``"."`` in
    ``env``), so an import resolves as it would for a user.

    Args:
        path: The example script, absolute or relative to ``repo_root``.
        repo_root: The repository root (the child's working directory).
        output_dir: Where the example writes; created if missing.
        timeout: Seconds before the example is killed.
        call_main: Call the example's ``main()`` and keep its result.
        runtime: JAX settings of the child (default: CPU, see ``run_python``).
        env: Extra environment variables for the child.

    Returns:
        The run; a failed example is returned, not raised (call ``.check()``).

    Raises:
        TypeError: ``timeout`` is not a number, or ``call_main`` not a bool.
        ValueError: ``timeout`` is not a positive finite number of seconds (nothing is
            created), or ``env`` sets a different ``AVITAI_OUTPUT_DIR``.
        ExampleNotFoundError: ``path`` does not exist (a ``FileNotFoundError``).
        ExampleTimeoutError: The example ran past ``timeout``.

    Example (in a test, where pytest gives ``tmp_path``; it runs a whole example, so it is
    shown here rather than run as a doctest)::

        run = run_example(
            Path("examples/quick_start.py"),
            repo_root=Path.cwd(),
            output_dir=tmp_path,
            timeout=300,
            call_main=True,
        )
        assert run.check().summary["final_loss"] < 0.1
    """
    from substrax.artifacts import OUTPUT_DIR_ENV  # noqa: PLC0415 - keep the package import light

    check_seconds("timeout", timeout, positive=True)  # before output_dir is created
    check_type("call_main", call_main, bool, "True or False")
    path, repo_root, output_dir = Path(path), Path(repo_root), Path(output_dir)
    script = (path if path.is_absolute() else repo_root / path).resolve()
    if not script.is_file():
        raise ExampleNotFoundError(script)
    target = output_dir.resolve()
    extra = dict(env or {})
    given = extra.get(OUTPUT_DIR_ENV)
    if given is not None and Path(given).resolve() != target:
        raise ValueError(
            f"env sets {OUTPUT_DIR_ENV}={given!r} but output_dir is {str(target)!r}; "
            f"pass only output_dir"
        )
    target.mkdir(parents=True, exist_ok=True)
    extra[OUTPUT_DIR_ENV] = str(target)
    program: str | Path = _CALL_MAIN if call_main else script
    token = secrets.token_hex(8)
    args = (str(script), token) if call_main else ()
    try:
        result = run_python(
            program, *args, timeout=timeout, runtime=runtime, env=extra, cwd=repo_root
        )
    except subprocess.TimeoutExpired as expired:
        tail = "\n".join(_text(expired.stderr).splitlines()[-STDERR_TAIL_LINES:])
        raise ExampleTimeoutError(script, timeout, tail) from expired
    summary = _summary(script, result.stdout, token) if call_main and result.succeeded else None
    return ExampleRun(path=script, output_dir=target, result=result, summary=summary)


def _summary(script: Path, stdout: str, token: str) -> "JsonValue":
    """main()'s JSON: the line after the run's last marker line (an exit hook may print after it)."""
    lines = stdout.splitlines()
    marks = [i for i, line in enumerate(lines) if line == f"{_SUMMARY_MARKER} {token}"]
    if not marks or marks[-1] + 1 >= len(lines):
        raise ValueError(
            f"{script}: the example exited 0 but printed no summary (no {_SUMMARY_MARKER!r} "
            "line followed by JSON on stdout): does it exit (sys.exit(0), os._exit) before "
            "main() returns, or replace sys.stdout (a logger's redirect, a file) and leave it "
            "replaced? Restore sys.stdout before main() returns"
        )
    line = lines[marks[-1] + 1]
    try:
        return cast("JsonValue", json.loads(line))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{script}: the line after the summary marker is not JSON: {line!r} ({error.msg}); "
            "another thread printed between them"
        ) from error
