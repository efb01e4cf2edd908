"""``run_python``: run code in a fresh interpreter with the JAX settings a test chooses."""

import contextlib
import dataclasses
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Self, cast

from substrax.support import check_seconds

from ._output import describe, tail


if TYPE_CHECKING:
    from substrax.runtime import JaxRuntime
    from substrax.typing import JsonValue


@dataclass(frozen=True, slots=True)  # by position too, in 0.1.22's order
class ChildResult:
    """What a child interpreter did: its command line, exit status, output and duration.

    Attributes:
        argv: The command line that ran.
        returncode: The exit status (negative for a signal).
        stdout: Everything the child printed to stdout.
        stderr: Everything the child printed to stderr.
        seconds: Wall-clock duration of the run.

    Example:
        >>> from substrax.testing import run_python
        >>> run_python("print('[1, 2]')", timeout=60).check().last_json()
        [1, 2]
    """

    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def succeeded(self) -> bool:
        """Whether the child exited with status 0."""
        return self.returncode == 0

    def check(self) -> Self:
        """Return this result if the child exited with status 0.

        Returns:
            This result, so calls chain: ``run_python(...).check().last_json()``.

        Raises:
            ChildFailedError: The child exited with a non-zero status; the message ends with
                the last 40 lines of its stderr.
        """
        from ._errors import ChildFailedError  # noqa: PLC0415 - _errors imports this module

        if self.returncode != 0:
            raise ChildFailedError(self)
        return self

    def _last_line(self) -> str:
        lines = [line for line in self.stdout.splitlines() if line.strip()]
        if not lines:
            raise ValueError(
                f"child {describe(self.argv)} printed nothing on stdout; print the result as the "
                f"last line, e.g. print(json.dumps(result)); stderr tail:\n{tail(self.stderr, 5)}"
            )
        return lines[-1]

    def last_json(self) -> "JsonValue":
        """Parse the last non-empty stdout line as JSON.

        Returns:
            The parsed value.

        Raises:
            ValueError: stdout is empty or its last line is not JSON.
        """
        line = self._last_line()
        try:
            return json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"the last stdout line of the child is not JSON: {line!r} ({error.msg}); "
                "print json.dumps(...) last"
            ) from error

    def last_json_as[T](self, shape: type[T]) -> T:
        """Validate the last non-empty stdout line against ``shape`` in strict JSON mode.

        Args:
            shape: Any type pydantic can validate: a dataclass, a ``TypedDict``,
                ``dict[str, int]``, a pydantic model...

        Returns:
            The validated value.

        Raises:
            ValueError: stdout is empty, or the line does not match ``shape``
                (``pydantic.ValidationError`` is a ``ValueError``).

        Example:
            >>> from substrax.testing import run_python
            >>> run = run_python("import json; print(json.dumps({'loss': 0.5}))", timeout=60)
            >>> run.check().last_json_as(dict[str, float])
            {'loss': 0.5}
        """
        from pydantic import TypeAdapter  # noqa: PLC0415 - keep the package import light

        return TypeAdapter(shape).validate_json(self._last_line(), strict=True)


def json_objects(stdout: str) -> list[dict[str, "JsonValue"]]:
    r"""Every JSON object a child printed on ``stdout``, one a line, in order.

    A native library may print to the same stdout as the child's Python code (gloo writes its
    connection notes there from another thread), so an object is looked for anywhere on its line:
    a note can land before it or after it, before its newline.

    Example:
        >>> from substrax.testing import json_objects
        >>> json_objects('[Gloo] Rank {"step": 3}0 is connected\nplain text\n{"loss": 0.5}\n')
        [{'step': 3}, {'loss': 0.5}]
    """
    decoder = json.JSONDecoder()
    objects: list[dict[str, JsonValue]] = []
    for line in stdout.splitlines():
        start = line.find('{"')
        if start < 0:
            continue
        try:
            found, _ = decoder.raw_decode(line, start)
        except json.JSONDecodeError:
            continue
        if isinstance(found, dict):
            objects.append(cast("dict[str, JsonValue]", found))
    return objects


def with_child_defaults(runtime: "JaxRuntime | None", env: Mapping[str, str]) -> "JaxRuntime":
    from substrax.runtime import JaxRuntime  # noqa: PLC0415 - keep the package import light

    chosen = runtime if runtime is not None else JaxRuntime()
    changes: dict[str, object] = {}
    if chosen.platforms is None and "JAX_PLATFORMS" not in env:
        changes["platforms"] = ("cpu",)
    if chosen.preallocate is None and "XLA_PYTHON_CLIENT_PREALLOCATE" not in env:
        changes["preallocate"] = False
    return dataclasses.replace(chosen, **changes) if changes else chosen


def run_python(
    program: str | Path,
    *args: str,
    timeout: float,
    runtime: "JaxRuntime | None" = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> ChildResult:
    """Run Python code or a script in a fresh interpreter under chosen JAX settings.

    The child's environment is ``substrax.runtime.child_environment(runtime, env)``: the
    parent's variables without any ``JAX_*``/``XLA_*``, then ``env``, then the runtime's.
    Unless ``runtime`` or ``env`` chooses otherwise, the child runs on CPU without
    preallocating accelerator memory, and without the compilation cache where this process
    turns it off (as a test session does). Its output is read as UTF-8, a byte that is not UTF-8
    replaced by U+FFFD.

    Args:
        program: Source code (run with ``python -c``) or the path of a script.
        *args: Command-line arguments for the program (``sys.argv[1:]``).
        timeout: Seconds to wait before killing the child.
        runtime: JAX settings of the child.
        env: Extra environment variables (before the runtime's).
        cwd: Working directory of the child (default: the current one).

    Returns:
        The finished run; a non-zero exit is returned, not raised (call ``.check()``).

    Raises:
        TypeError: ``timeout`` is not a number.
        ValueError: ``timeout`` is not a positive finite number of seconds.
        subprocess.TimeoutExpired: The child ran past ``timeout`` (it is killed).
        RuntimeConfigurationError: The runtime conflicts with ``env`` (e.g. an XLA flag
            with two values); raised before the child starts.

    Example:
        >>> from substrax.runtime import JaxRuntime
        >>> from substrax.testing import run_python
        >>> program = "import json, jax; print(json.dumps(jax.device_count()))"
        >>> run_python(program, runtime=JaxRuntime(cpu_devices=4), timeout=120).check().last_json()
        4
    """
    from substrax.runtime import child_environment  # noqa: PLC0415 - keep the package import light

    check_seconds("timeout", timeout, positive=True)
    extra = dict(env or {})
    child_env = child_environment(with_child_defaults(runtime, extra), extra)
    if isinstance(program, Path):
        argv = (sys.executable, str(program), *args)
    else:
        argv = (sys.executable, "-c", program, *args)
    started = time.perf_counter()
    stdout, stderr, returncode = _communicate(argv, child_env, cwd, timeout)
    return ChildResult(
        argv=argv,
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        seconds=time.perf_counter() - started,
    )


def _kill_group(process: "subprocess.Popen[bytes]") -> None:
    """Kill the child's process group: the child and whatever it started and left running."""
    with contextlib.suppress(ProcessLookupError, PermissionError):  # no one left in it
        os.killpg(process.pid, signal.SIGKILL)


def _text(file: "IO[bytes]") -> str:
    """What a child wrote to ``file``, read as its pipe in text mode would be (universal newlines)."""
    file.seek(0)
    return io.TextIOWrapper(io.BytesIO(file.read()), encoding="utf-8", errors="replace").read()


def _communicate(
    argv: tuple[str, ...], env: Mapping[str, str], cwd: Path | None, timeout: float
) -> tuple[str, str, int]:
    """Run ``argv`` in a session of its own; its output once it exited, its group killed.

    Its output goes to files, not pipes: a process it left holding them (even one in a session
    of its own, out of the group's reach) never holds up its result. What it left in its group
    is killed once it exits; on a timeout the whole group is killed.
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            process.wait()
            raise subprocess.TimeoutExpired(argv, timeout, _text(out), _text(err)) from None
        finally:
            if process.poll() is None:  # interrupted (KeyboardInterrupt): leave nothing running
                _kill_group(process)
                process.wait()
        _kill_group(process)  # the child exited: its group's stragglers go too
        return _text(out), _text(err), process.returncode


_CUDA_PROBE = "import jax; print(jax.default_backend())"


def cuda_is_visible(*, timeout: float = 120.0) -> bool:
    """Whether jax can start its CUDA backend here, probed in a fresh interpreter.

    Args:
        timeout: Seconds to wait for the probe.

    Returns:
        ``True`` when a child with ``platforms=("cuda",)`` starts and reports a GPU backend.

    Example:
        >>> from substrax.testing import cuda_is_visible
        >>> cuda_is_visible() in (True, False)
        True
    """
    from substrax.runtime import JaxRuntime  # noqa: PLC0415 - keep the package import light

    try:
        run = run_python(_CUDA_PROBE, runtime=JaxRuntime(platforms=("cuda",)), timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return run.succeeded and run.stdout.strip().endswith("gpu")
