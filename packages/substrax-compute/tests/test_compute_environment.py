"""What a task's process sees: ``task_environment`` laid over the worker's own environment."""

import re
from pathlib import Path

import pytest

from substrax.compute import JobSpec, Task
from substrax.compute._environment import task_environment
from substrax.runtime import (
    EnvironmentConflictError,
    RuntimeConfigurationError,
    XlaFlagConflictError,
    default_compilation_cache_dir,
)


DISTRIBUTED = {
    "JAX_COORDINATOR_ADDRESS": "10.0.0.1:8476",
    "JAX_NUM_PROCESSES": "2",
    "JAX_PROCESS_ID": "1",
}
TASK_DIR = Path("/runs/r/outputs/t")


def _spec(**fields):
    task = Task(name="t", argv=("python", "-c", "pass"), timeout_seconds=5)
    return JobSpec(name="j", tasks=(task,), timeout_seconds=5, **fields)


def _unchecked(**fields):
    """A spec with ``fields`` set past its checks (one written by hand reaches the worker so)."""
    return _spec().model_copy(update=fields)


def _jax(env):
    return {name: value for name, value in env.items() if name.startswith(("JAX_", "XLA_"))}


def test_a_one_node_task_drops_the_submitting_shells_distributed_variables():
    # they were carried over, and initialize_distributed waited for peers that never came
    env = task_environment(_spec(), TASK_DIR, parent={"HOME": "/h", **DISTRIBUTED})
    assert not set(DISTRIBUTED) & set(env)
    assert env["HOME"] == "/h"


def test_a_multi_node_task_gets_the_distributed_variables_its_backend_set():
    parent = {"SUBSTRAX_NODE_RANK": "1", **DISTRIBUTED}
    env = task_environment(_spec(nodes=2), TASK_DIR, parent=parent)
    assert {name: env[name] for name in DISTRIBUTED} == DISTRIBUTED
    assert env["SUBSTRAX_NODE_RANK"] == "1"


def test_the_users_compilation_cache_directory_is_kept(tmp_path):
    # it was replaced by the default directory, though runtime.md says it is left alone
    parent = {"JAX_COMPILATION_CACHE_DIR": "/srv/cache"}
    env = task_environment(_spec(), TASK_DIR, parent=parent)
    assert env["JAX_COMPILATION_CACHE_DIR"] == "/srv/cache"
    # the job's own directory, or its cache turned off, still decides
    own = _spec(runtime={"compilation_cache_dir": str(tmp_path)})
    assert task_environment(own, TASK_DIR, parent=parent)["JAX_COMPILATION_CACHE_DIR"] == str(
        tmp_path
    )
    off = task_environment(_spec(runtime={"compilation_cache": False}), TASK_DIR, parent=parent)
    assert "JAX_COMPILATION_CACHE_DIR" not in off
    assert off["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    default = task_environment(_spec(), TASK_DIR, parent={})
    assert default["JAX_COMPILATION_CACHE_DIR"] == str(default_compilation_cache_dir())


def test_a_shell_that_turns_the_cache_off_does_not_decide_the_job_s_cache():
    """A third-pass review: a shell's JAX_ENABLE_COMPILATION_CACHE=0 ran a job that asks for
    the cache without it (child_environment inherits it, for a test session's children)."""
    env = task_environment(_spec(), TASK_DIR, parent={"JAX_ENABLE_COMPILATION_CACHE": "0"})
    assert "JAX_ENABLE_COMPILATION_CACHE" not in env
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(default_compilation_cache_dir())


@pytest.mark.parametrize(
    ("env", "runtime", "refusal"),
    [
        (
            {"JAX_PLATFORMS": "cpu"},
            {"platforms": ["tpu"]},
            ("JAX_PLATFORMS", "cpu", "tpu", "as platforms in the runtime table"),
        ),
        (
            {"JAX_ENABLE_X64": "1"},
            {"enable_x64": False},
            ("JAX_ENABLE_X64", "1", "false", "as enable_x64 in the runtime table"),
        ),
        (
            {"AVITAI_OUTPUT_DIR": "/tmp/mine"},
            {},
            ("AVITAI_OUTPUT_DIR", "/tmp/mine", str(TASK_DIR), "drop it from the job's env"),
        ),
    ],
)
def test_a_job_env_entry_substrax_sets_otherwise_is_refused_naming_both(env, runtime, refusal):
    # each was replaced by the runtime's or the worker's value without a word
    variable, given, required, says = refusal
    spec = _unchecked(env=env, runtime=runtime)
    with pytest.raises(EnvironmentConflictError) as info:
        task_environment(spec, TASK_DIR, parent={})
    error = info.value
    assert (error.variable, error.given, error.required) == (variable, given, required)
    assert isinstance(error, ValueError)  # the worker fails the task with it and goes on
    assert f"{variable}={given!r}" in str(error)
    assert repr(required) in str(error)
    assert says in str(error)


def test_a_job_env_entry_that_agrees_with_substrax_is_accepted():
    spec = _spec(
        env={"JAX_PLATFORMS": "cpu", "JAX_ENABLE_X64": "1", "AVITAI_OUTPUT_DIR": str(TASK_DIR)},
        runtime={"platforms": ["cpu"], "enable_x64": True},
    )
    env = task_environment(spec, TASK_DIR, parent={})
    assert env["AVITAI_OUTPUT_DIR"] == str(TASK_DIR)
    assert _jax(env) == {
        "JAX_PLATFORMS": "cpu",
        "JAX_ENABLE_X64": "true",
        "JAX_COMPILATION_CACHE_DIR": str(default_compilation_cache_dir()),
    }


def test_distributed_variables_in_the_job_env_are_refused_unless_they_agree():
    one_node = _unchecked(env={"JAX_NUM_PROCESSES": "2"})
    with pytest.raises(EnvironmentConflictError, match=r"1-node job .* leaves it unset; set nodes"):
        task_environment(one_node, TASK_DIR, parent={})
    two_nodes = _unchecked(nodes=2, env={"JAX_NUM_PROCESSES": "3"})
    with pytest.raises(EnvironmentConflictError, match=r"'3', but the backend.* sets it to '2'"):
        task_environment(two_nodes, TASK_DIR, parent=DISTRIBUTED)
    agreeing = _spec(nodes=2, env={"JAX_NUM_PROCESSES": "2"})
    assert task_environment(agreeing, TASK_DIR, parent=DISTRIBUTED)["JAX_NUM_PROCESSES"] == "2"


def test_a_runtime_refusal_reaches_the_worker_as_a_value_error_naming_the_job():
    # a RuntimeError went past the worker's handling of a task that cannot start
    from substrax.compute._environment import _job_runtime_error

    flag = _job_runtime_error("j", XlaFlagConflictError("--a", "1", "2"))
    assert isinstance(flag, EnvironmentConflictError)
    assert (flag.variable, flag.given, flag.required) == ("XLA_FLAGS", "--a=1", "--a=2")
    assert "xla_flags" in str(flag)
    other = _job_runtime_error("j", RuntimeConfigurationError("two CPU device counts"))
    assert isinstance(other, ValueError)
    assert "job 'j'" in str(other)
    assert "two CPU device counts" in str(other)


def test_a_one_node_jobs_env_may_give_the_distributed_values_its_topology_has():
    """Hostile finding: a 1-node job whose env set JAX_NUM_PROCESSES=1 was refused."""
    spec = _spec(env={"JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": " 0"})
    env = task_environment(spec, TASK_DIR, parent={})
    assert (env["JAX_NUM_PROCESSES"], env["JAX_PROCESS_ID"]) == ("1", " 0")  # as the job gave them
    assert "JAX_COORDINATOR_ADDRESS" not in env
    for refused in ({"JAX_NUM_PROCESSES": "2"}, {"JAX_PROCESS_ID": "1"}):
        with pytest.raises(EnvironmentConflictError, match="1-node job"):
            task_environment(_unchecked(env=refused), TASK_DIR, parent={})
    two = _spec(nodes=2, env={"JAX_NUM_PROCESSES": " 2"})
    assert task_environment(two, TASK_DIR, parent=DISTRIBUTED)["JAX_NUM_PROCESSES"] == "2"


@pytest.mark.parametrize(
    ("env", "runtime", "nodes", "refusal"),
    [
        ({"JAX_ENABLE_X64": "0"}, {"enable_x64": True}, 1, ("JAX_ENABLE_X64", "0", "true")),
        ({"JAX_PLATFORMS": "cpu"}, {"platforms": ["tpu"]}, 1, ("JAX_PLATFORMS", "cpu", "tpu")),
        ({"JAX_NUM_PROCESSES": "2"}, {}, 1, ("JAX_NUM_PROCESSES", "2", None)),
        ({"JAX_COORDINATOR_ADDRESS": "h:1"}, {}, 1, ("JAX_COORDINATOR_ADDRESS", "h:1", None)),
        ({"JAX_NUM_PROCESSES": "3"}, {}, 2, ("JAX_NUM_PROCESSES", "3", "2")),
    ],
)
def test_a_job_env_that_contradicts_its_runtime_or_topology_is_refused_before_it_runs(
    env, runtime, nodes, refusal
):
    """Hostile finding: it was refused only as the task started (on a cluster already up)."""
    from substrax.compute._environment import env_conflict
    from substrax.compute._spec import jax_runtime

    error = env_conflict("j", env, runtime=jax_runtime(runtime), nodes=nodes)
    assert isinstance(error, EnvironmentConflictError)
    assert (error.variable, error.given, error.required) == refusal
    with pytest.raises(ValueError, match=re.escape(str(error))):
        _spec(env=env, runtime=runtime, nodes=nodes)


def test_a_job_env_that_agrees_is_no_conflict():
    from substrax.compute._environment import env_conflict
    from substrax.compute._spec import jax_runtime

    agreeing = {"JAX_ENABLE_X64": "1", "JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}
    assert env_conflict("j", agreeing, runtime=jax_runtime({"enable_x64": True}), nodes=1) is None
    count = {"JAX_NUM_PROCESSES": "2"}
    assert env_conflict("j", count, runtime=jax_runtime({}), nodes=2) is None
