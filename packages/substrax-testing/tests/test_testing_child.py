"""run_python and ChildResult: fresh interpreters, their environment and their output."""

import importlib.util
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pydantic
import pytest

from substrax.runtime import JaxRuntime, XlaFlagConflictError, default_compilation_cache_dir
from substrax.testing import ChildFailedError, ChildResult, cuda_is_visible, run_python


def _result(*, returncode=0, stdout="", stderr="") -> ChildResult:
    return ChildResult(
        argv=(sys.executable, "-c", "pass"),
        returncode=returncode,
        stdout=stdout,
        stderr=stderr,
        seconds=0.1,
    )


CUDA_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin")
ENV_PROGRAM = (
    "import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
    "if k.startswith(('JAX_', 'XLA_', 'SUBSTRAX_PROBE'))}))"
)


@pytest.mark.usefixtures("child_processes")
def test_the_child_gets_cpu_defaults_and_none_of_the_parents_jax_settings(monkeypatch):
    monkeypatch.setenv("JAX_ENABLE_X64", "true")
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
    monkeypatch.delenv("JAX_ENABLE_COMPILATION_CACHE", raising=False)  # the session's: off
    run = run_python(ENV_PROGRAM, timeout=60, env={"SUBSTRAX_PROBE": "1"}).check()
    assert run.last_json() == {
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(default_compilation_cache_dir()),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
        "SUBSTRAX_PROBE": "1",
    }
    assert run.argv[:2] == (sys.executable, "-c")
    assert run.seconds > 0


@pytest.mark.usefixtures("child_processes")
def test_the_runtime_and_env_choose_over_the_defaults(monkeypatch):
    monkeypatch.delenv("JAX_ENABLE_COMPILATION_CACHE", raising=False)
    runtime = JaxRuntime(cpu_devices=3, preallocate=True, xla_flags=("--xla_a=1",))
    run = run_python(ENV_PROGRAM, timeout=60, runtime=runtime, env={"JAX_PLATFORMS": "tpu"})
    assert run.check().last_json() == {
        "JAX_PLATFORMS": "tpu",
        "JAX_NUM_CPU_DEVICES": "3",
        "JAX_COMPILATION_CACHE_DIR": str(default_compilation_cache_dir()),
        "XLA_PYTHON_CLIENT_PREALLOCATE": "true",
        "XLA_FLAGS": "--xla_a=1",
    }


CACHE_PROGRAM = (
    "import json, jax; print(json.dumps([jax.config.jax_enable_compilation_cache, "
    "jax.config.jax_compilation_cache_dir]))"
)


@pytest.mark.usefixtures("child_processes")
def test_a_child_of_a_session_with_the_cache_off_keeps_it_off(monkeypatch, tmp_path):
    """A spec review: under the plugin (JAX_ENABLE_COMPILATION_CACHE=false), a child given
    JaxRuntime(cpu_devices=8) wrote jax's compilation cache into the user's cache directory."""
    monkeypatch.setenv("JAX_ENABLE_COMPILATION_CACHE", "false")  # as the plugin's session sets it
    run = run_python(CACHE_PROGRAM, timeout=120, runtime=JaxRuntime(cpu_devices=2))
    assert run.check().last_json() == [False, None]
    # a runtime naming its own directory turns it on there; so does env
    own = JaxRuntime(compilation_cache_dir=tmp_path)
    assert run_python(CACHE_PROGRAM, timeout=120, runtime=own).check().last_json() == [
        True,
        str(tmp_path),
    ]
    on = {"JAX_ENABLE_COMPILATION_CACHE": "true"}
    run = run_python(ENV_PROGRAM, timeout=60, env=on).check()
    assert run.last_json()["JAX_COMPILATION_CACHE_DIR"] == str(default_compilation_cache_dir())


def test_a_flag_conflict_raises_before_the_child_starts(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(XlaFlagConflictError):
        run_python(
            f"open({str(marker)!r}, 'w')",
            timeout=60,
            runtime=JaxRuntime(xla_flags=("--xla_a=1",)),
            env={"XLA_FLAGS": "--xla_a=2"},
        )
    assert not marker.exists()


@pytest.mark.usefixtures("child_processes")
def test_the_spec_example_runs_on_eight_emulated_devices():
    program = "import json, jax; print(json.dumps(jax.device_count()))"
    result = run_python(program, runtime=JaxRuntime(cpu_devices=8), timeout=120)
    assert result.check().last_json() == 8


@pytest.mark.usefixtures("child_processes")
def test_a_script_gets_its_arguments_and_cwd(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import json, os, sys\nprint(json.dumps([sys.argv[1:], os.getcwd()]))\n")
    run = run_python(script, "a", "b", timeout=60, cwd=tmp_path).check()
    assert run.argv == (sys.executable, str(script), "a", "b")
    assert run.last_json() == [["a", "b"], str(tmp_path)]


@pytest.mark.usefixtures("child_processes")
def test_a_failure_is_returned_and_check_raises_with_the_stderr_tail():
    program = "import sys\nfor i in range(60): print(f'line {i}', file=sys.stderr)\nsys.exit(5)"
    run = run_python(program, timeout=60)
    assert run.returncode == 5
    assert not run.succeeded
    with pytest.raises(ChildFailedError) as caught:
        run.check()
    assert caught.value.result is run
    message = str(caught.value)
    assert "exited with status 5" in message
    assert "python -c 'import sys'" in message
    assert message.endswith("\n".join(f"line {i}" for i in range(20, 60)))
    assert "line 19\n" not in message
    assert isinstance(caught.value, AssertionError)


@pytest.mark.usefixtures("child_processes")
def test_output_that_is_not_utf8_is_kept_with_the_bad_bytes_replaced():
    program = (
        "import sys; sys.stdout.buffer.write(b'caf\\xe9\\n'); sys.stdout.flush(); print(1); "
        "sys.stderr.buffer.write(b'\\xff err\\n')"
    )
    run = run_python(program, timeout=60).check()
    assert (run.stdout, run.stderr) == ("caf\ufffd\n1\n", "\ufffd err\n")
    assert run.last_json() == 1


@pytest.mark.usefixtures("child_processes")
def test_a_timeout_raises():
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("import time; time.sleep(30)", timeout=0.5)


@pytest.mark.parametrize(
    ("timeout", "error"), [(0, ValueError), (-1, ValueError), (True, TypeError), ("5", TypeError)]
)
def test_a_bad_timeout_is_refused(timeout, error):
    with pytest.raises(error, match=r"timeout=.* must be a finite number of seconds > 0"):
        run_python("pass", timeout=timeout)


def test_last_json_reads_the_last_non_empty_line():
    result = _result(stdout='progress\n{"loss": 1.5}\n\n  \n')
    assert result.check() is result
    assert result.last_json() == {"loss": 1.5}


@pytest.mark.parametrize(
    ("stdout", "match"),
    [("", "printed nothing on stdout"), ("\n \n", "printed nothing"), ("done\n", "is not JSON")],
)
def test_last_json_refuses_missing_or_non_json_output(stdout, match):
    with pytest.raises(ValueError, match=match):
        _result(stdout=stdout).last_json()


@dataclass(frozen=True)
class Summary:
    steps: int
    loss: float


def test_last_json_as_validates_strictly():
    assert _result(stdout='{"steps": 3, "loss": 1}').last_json_as(Summary) == Summary(3, 1.0)
    with pytest.raises(pydantic.ValidationError):
        _result(stdout='{"steps": "3", "loss": 1.0}').last_json_as(Summary)
    with pytest.raises(ValueError, match="printed nothing"):
        _result().last_json_as(Summary)
    assert _result(stdout=json.dumps([1, 2])).last_json_as(tuple[int, int]) == (1, 2)


@pytest.mark.usefixtures("child_processes")
def test_cuda_is_visible_answers_without_raising():
    visible = cuda_is_visible(timeout=120)
    assert isinstance(visible, bool)
    if not any(importlib.util.find_spec(name) for name in CUDA_PLUGINS):
        assert visible is False


def test_a_child_killed_by_a_signal_is_named_so():
    with pytest.raises(ChildFailedError, match=r"was killed by SIGKILL \(status -9\)"):
        _result(returncode=-9).check()


def _ends(pid: int, wall_clock) -> bool:
    """Whether ``pid`` is gone or a zombie (no one reaps it here) within a few seconds."""
    for _ in range(100):
        try:
            with Path(f"/proc/{pid}/stat").open() as stat:
                if stat.read().rpartition(")")[2].split()[0] in {"Z", "X"}:
                    return True
        except FileNotFoundError:
            return True
        wall_clock.sleep(0.05)
    return False


# a grandchild that keeps the child's stdout open and sleeps, after the child printed its pid
GRANDCHILD = (
    "import subprocess, sys; "
    "grandchild = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
    "print(grandchild.pid, flush=True); {then}"
)


@pytest.mark.usefixtures("child_processes")
def test_a_grandchild_holding_the_output_open_does_not_hold_the_result(wall_clock):
    run = run_python(GRANDCHILD.format(then="print('done')"), timeout=30).check()
    assert run.seconds < 20  # not the timeout: the grandchild was killed once the child exited
    assert run.stdout.splitlines() == [run.stdout.split()[0], "done"]
    assert _ends(int(run.stdout.split()[0]), wall_clock)


@pytest.mark.usefixtures("child_processes")
def test_a_grandchild_in_a_session_of_its_own_does_not_hold_the_result():
    """Hostile finding: out of the group's reach, it held the output pipes open, so a child that
    exited 0 at once was reported as timed out."""
    own = GRANDCHILD.replace("time.sleep(60)'])", "time.sleep(60)'], start_new_session=True)")
    run = run_python(own.format(then="print('done')"), timeout=10).check()
    try:
        assert run.seconds < 5
        assert run.stdout.splitlines()[1:] == ["done"]
    finally:
        os.kill(int(run.stdout.split()[0]), signal.SIGKILL)


@pytest.mark.usefixtures("child_processes")
def test_a_timeout_kills_the_grandchildren_too(wall_clock):
    with pytest.raises(subprocess.TimeoutExpired) as raised:
        run_python(GRANDCHILD.format(then="import time; time.sleep(60)"), timeout=3)
    assert _ends(int(str(raised.value.stdout).split()[0]), wall_clock)


def test_a_child_result_is_built_by_position_as_in_0_1_22():
    result = ChildResult(("python", "-c", "pass"), 1, "", "boom\n", 0.5)
    assert (result.returncode, result.stderr, result.seconds) == (1, "boom\n", 0.5)
    with pytest.raises(ChildFailedError, match="boom"):
        result.check()
