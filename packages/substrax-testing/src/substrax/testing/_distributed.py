"""``run_distributed``: one program in several local processes that form one jax job."""

# Callers are untyped at run time: the isinstance checks below are the validation.
# pyright: reportUnnecessaryIsInstance=false

import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from substrax.support import check_int, check_seconds

from ._child import ChildResult, json_objects, with_child_defaults


if TYPE_CHECKING:
    from substrax.runtime import JaxRuntime

# gloo (jax's CPU collectives) prints connection notes from C++ straight to stdout, piece by
# piece from another thread: "[Gloo] Rank 0 is connected to 1 peer ranks. Expected ...". A line
# of the child's own can land inside one, so a line holding a piece of a note keeps only the JSON
# objects in it.
_NATIVE_NOTE = re.compile(r"\[Gloo\] |peer ranks")
_MIN_PROCESSES = 2


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for a coordinator or a server in a test).

    Example:
        >>> from substrax.testing import free_port
        >>> 0 < free_port() < 65536
        True
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _without_native_notes(stdout: str) -> str:
    r"""``stdout`` without gloo's notes, keeping a JSON line that landed inside one.

    Example:
        >>> from substrax.testing._distributed import _without_native_notes
        >>> _without_native_notes('[Gloo] Rank {"a": 1}\n0 is connected to 1 peer ranks.\nok\n')
        '{"a": 1}\nok\n'
    """
    kept: list[str] = []
    for line in stdout.splitlines(keepends=True):
        if _NATIVE_NOTE.search(line) is None:
            kept.append(line)
        else:
            kept.extend(json.dumps(found) + "\n" for found in json_objects(line))
    return "".join(kept)


def run_distributed(
    program: str | Path,
    *args: str,
    num_processes: int,
    timeout: float,
    runtime: "JaxRuntime | None" = None,
    env: Mapping[str, str] | None = None,
    per_process_env: Mapping[int, Mapping[str, str]] | None = None,
    cwd: Path | None = None,
) -> list[ChildResult]:
    """Run ``program`` in ``num_processes`` fresh interpreters wired into one ``jax.distributed`` job.

    Each process gets the launcher variables ``substrax.runtime.initialize_distributed`` reads,
    ``JAX_COORDINATOR_ADDRESS=127.0.0.1:<free port>``, ``JAX_NUM_PROCESSES`` and
    ``JAX_PROCESS_ID``, on top of the environment ``run_python`` would give it; the program calls
    ``initialize_distributed()`` before using jax. All processes start together and are waited
    for together: a process whose peer never arrives is aborted by jax, and any process still
    running at ``timeout`` is killed with the rest before ``TimeoutExpired`` is raised. gloo's
    connection notes are dropped from each result's stdout, so ``last_json()`` reads the
    program's own last line.

    Args:
        program: Source code (run with ``python -c``) or the path of a script.
        *args: Command-line arguments, the same for every process.
        num_processes: How many processes (at least 2).
        timeout: Seconds the whole job may take.
        runtime: JAX settings of every process, e.g. ``JaxRuntime(cpu_devices=4)``.
        env: Extra environment variables for every process.
        per_process_env: Extra variables for some processes, by process id.
        cwd: Working directory of the processes.

    Returns:
        One result per process, in process-id order; failures are returned, not raised.

    Raises:
        TypeError: ``num_processes`` is not an int or ``timeout`` not a number.
        ValueError: ``num_processes`` is below 2 or ``timeout`` is not positive.
        subprocess.TimeoutExpired: The job ran past ``timeout`` (every process is killed).

    Example:
        >>> from substrax.runtime import JaxRuntime
        >>> from substrax.testing import run_distributed
        >>> program = (
        ...     "import json, jax; from substrax.runtime import initialize_distributed; "
        ...     "initialize_distributed(); print(json.dumps(jax.device_count()))"
        ... )
        >>> runs = run_distributed(
        ...     program, num_processes=2, runtime=JaxRuntime(cpu_devices=2), timeout=120
        ... )
        >>> [run.check().last_json() for run in runs]
        [4, 4]
    """
    from substrax.runtime import child_environment  # noqa: PLC0415 - keep the package import light

    check_int("num_processes", num_processes, minimum=_MIN_PROCESSES)
    check_seconds("timeout", timeout, positive=True)
    coordinator = f"127.0.0.1:{free_port()}"
    base = dict(env or {})
    if isinstance(program, Path):
        argv = (sys.executable, str(program), *args)
    else:
        argv = (sys.executable, "-c", program, *args)
    started = time.perf_counter()
    processes: list[subprocess.Popen[str]] = []
    try:
        for process_id in range(num_processes):
            extra = {
                **base,
                **dict((per_process_env or {}).get(process_id, {})),
                "JAX_COORDINATOR_ADDRESS": coordinator,
                "JAX_NUM_PROCESSES": str(num_processes),
                "JAX_PROCESS_ID": str(process_id),
            }
            child_env = child_environment(with_child_defaults(runtime, extra), extra)
            processes.append(
                subprocess.Popen(
                    argv,
                    env=child_env,
                    cwd=cwd,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        results: list[ChildResult] = []
        for process in processes:
            left = timeout - (time.perf_counter() - started)
            stdout, stderr = process.communicate(timeout=max(left, 0.001))
            results.append(
                ChildResult(
                    argv=argv,
                    returncode=process.returncode,
                    stdout=_without_native_notes(stdout),
                    stderr=stderr,
                    seconds=time.perf_counter() - started,
                )
            )
        return results
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
            for stream in (process.stdout, process.stderr):
                if stream is not None:
                    stream.close()
