"""``run_example``: run one example script in its own interpreter, outputs redirected."""

import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Self

from ._child import ChildResult, run_python
from ._errors import ExampleNotFoundError, ExampleTimeoutError
from ._output import STDERR_TAIL_LINES


if TYPE_CHECKING:
    from substrax.runtime import JaxRuntime
    from substrax.typing import JsonValue

# Runs in the child: load the example under a fixed module name, call main(), print its JSON.
_CALL_MAIN = """\
import importlib.util, json, sys
from pathlib import Path

path = Path(sys.argv[1])
sys.path.insert(0, str(path.parent))
spec = importlib.util.spec_from_file_location("_substrax_example", path)
module = importlib.util.module_from_spec(spec)
sys.modules["_substrax_example"] = module
spec.loader.exec_module(module)
if not callable(getattr(module, "main", None)):
    sys.exit(f"{path} defines no main(); run it with call_main=False")


def plain(value):
    tolist = getattr(value, "tolist", None)
    if callable(tolist):
        return tolist()  # numpy and jax arrays; a 0-d array becomes a scalar
    if isinstance(value, (tuple, set, frozenset)):
        return list(value)
    raise TypeError(f"main() returned a {type(value).__name__}, which is not JSON")


print(json.dumps(module.main(), default=plain))
"""


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

    def check(self) -> Self:
        """Return this run if the example exited with status 0.

        Raises:
            ChildFailedError: The example failed; the message ends with its stderr tail.
        """
        self.result.check()
        return self


def _text(stream: str | bytes | None) -> str:
    if isinstance(stream, bytes):
        return stream.decode(errors="replace")
    return stream or ""


def run_example(
    path: Path,
    *,
    repo_root: Path,
    output_dir: Path,
    timeout: float,
    call_main: bool,
    runtime: "JaxRuntime | None" = None,
    env: Mapping[str, str] | None = None,
) -> ExampleRun:
    """Run one example in a fresh interpreter, with its outputs sent to ``output_dir``.

    The child runs in ``repo_root`` with ``AVITAI_OUTPUT_DIR=output_dir``, so an example that
    resolves its outputs with ``substrax.artifacts.resolve_output_dir`` never writes into the
    repository. With ``call_main``, the file is loaded as the module ``_substrax_example``, its
    ``main()`` is called and the JSON of what it returns becomes ``ExampleRun.summary``;
    otherwise the file runs as a script.

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
        ExampleNotFoundError: ``path`` does not exist (a ``FileNotFoundError``).
        ValueError: ``env`` sets a different ``AVITAI_OUTPUT_DIR``.
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
    args = (str(script),) if call_main else ()
    try:
        result = run_python(
            program, *args, timeout=timeout, runtime=runtime, env=extra, cwd=repo_root
        )
    except subprocess.TimeoutExpired as expired:
        tail = "\n".join(_text(expired.stderr).splitlines()[-STDERR_TAIL_LINES:])
        raise ExampleTimeoutError(script, timeout, tail) from expired
    summary = result.last_json() if call_main and result.succeeded else None
    return ExampleRun(path=script, output_dir=target, result=result, summary=summary)
