"""The job spec records: validation, argv rules, mounts, example tasks, the runtime fields."""

import importlib.metadata
import io
from pathlib import Path

import pytest
from pydantic import ValidationError

from substrax.compute import (
    KNOWN_PLATFORMS,
    Accelerator,
    JobSpec,
    Mount,
    Task,
    UnknownPlatformError,
    _display,
    example_tasks,
    parse_accelerator,
    read_job_spec,
)
from substrax.compute._spec import jax_runtime


def test_accelerators():
    assert parse_accelerator("L4") == Accelerator(kind="L4", count=1)
    assert parse_accelerator("H100:8").label == "H100:8"
    for bad in ("H100:", "H100:x", "H100:0", ":2", "a b", "H1 00:8", "", "a/b"):
        with pytest.raises(ValueError, match=r"^accelerator .* must read KIND or KIND:N, KIND of"):
            parse_accelerator(bad)  # one line, never pydantic's report


@pytest.mark.parametrize(
    "argv",
    [("bash", "-c", "echo hi"), ("sh", "-xc", "x"), ("/usr/bin/zsh", "-c", "x"), ()],
)
def test_shell_strings_and_empty_argv_are_refused(argv):
    with pytest.raises(ValidationError):
        Task(name="t", argv=argv, timeout_seconds=1)


def test_an_argv_list_is_taken_as_its_tuple_and_checked_the_same():
    # 0.1.22's dataclass took a list; the refusal's own advice writes one
    assert Task(name="t", argv=["python", "x.py"], timeout_seconds=1).argv == ("python", "x.py")
    with pytest.raises(ValidationError, match="shell string"):
        Task(name="t", argv=["bash", "-c", "echo hi"], timeout_seconds=1)
    with pytest.raises(ValidationError):
        Task(name="t", argv=["python", 3], timeout_seconds=1)  # each argument still a str


def test_a_shell_running_a_script_file_is_an_argv():
    assert Task(name="t", argv=("bash", "--norc", "run.sh"), timeout_seconds=1).argv[0] == "bash"


@pytest.mark.parametrize(
    "path", ["data", "/", "/data/", "/data/../etc", "/outputs", "/outputs/a", "/project"]
)
def test_mount_paths_that_escape_or_collide_are_refused(path):
    with pytest.raises(ValidationError):
        Mount(name="m", path=path)


def test_task_names_cannot_climb_out_of_the_outputs():
    for name in ("..", "a/b", "../x", ".hidden", ""):
        with pytest.raises(ValidationError):
            Task(name=name, argv=("python",), timeout_seconds=1)


def test_job_spec_rules():
    task = Task(name="t", argv=("python",), timeout_seconds=1)
    with pytest.raises(ValidationError, match="at least one task"):
        JobSpec(name="j", tasks=(), timeout_seconds=1)
    with pytest.raises(ValidationError, match="task names must be unique; repeated: t"):
        JobSpec(name="j", tasks=(task, task), timeout_seconds=1)
    with pytest.raises(ValidationError, match=r"JaxRuntime\.cpu_devices=0 must be an integer >= 1"):
        JobSpec(name="j", tasks=(task,), timeout_seconds=1, runtime={"cpu_devices": 0})
    with pytest.raises(ValidationError, match="Input should be 4"):
        JobSpec(schema_version=2, name="j", tasks=(task,), timeout_seconds=1)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="frozen"):
        JobSpec(name="j", tasks=(task,), timeout_seconds=1).name = "k"  # type: ignore[misc]


def test_runtime_fields_become_a_jax_runtime():
    runtime = jax_runtime(
        {"platforms": ["cpu"], "xla_flags": ["--a=1"], "compilation_cache_dir": "/tmp/cache"}
    )
    assert runtime.platforms == ("cpu",)
    assert runtime.xla_flags == ("--a=1",)
    assert runtime.compilation_cache_dir == Path("/tmp/cache")


def test_example_task_names(tmp_path):
    tasks = example_tasks(
        [tmp_path / "examples" / "a.py", tmp_path / "examples" / "deep" / "b.py"],
        project=tmp_path,
        timeout_seconds=5,
    )
    assert [(t.name, t.argv) for t in tasks] == [
        ("examples.a", ("python", "examples/a.py")),
        ("examples.deep.b", ("python", "examples/deep/b.py")),
    ]
    with pytest.raises(ValueError, match="is not under the project"):
        example_tasks([Path("/elsewhere/x.py")], project=tmp_path, timeout_seconds=5)


LINES = [
    "[substrax] task a started (1/2)",
    "[a] hello",
    "[substrax] task a succeeded (1/2) 0.1s",
    "[substrax] job j succeeded",
]


def test_plain_progress_when_not_a_terminal():
    buffer = io.StringIO()
    _display.follow(LINES, stream=buffer)
    assert buffer.getvalue().splitlines() == [
        "--- running a (1/2)",
        "[a] hello",
        "--- task a succeeded (1/2) 0.1s",
        "--- job j succeeded",
    ]


def test_rich_progress_on_a_terminal(monkeypatch):
    pytest.importorskip("rich", reason="the rich extra is not installed")
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich then takes the buffer for a terminal
    buffer = io.StringIO()
    _display.follow(LINES, stream=buffer)
    text = buffer.getvalue()
    assert "[a] hello" in text
    assert "task a succeeded (1/2)" in text
    assert "job j succeeded" in text


def test_platforms_are_checked_against_the_ones_jax_knows():
    assert jax_runtime({"platforms": ["cuda", "cpu"]}).platforms == ("cuda", "cpu")
    assert jax_runtime({"platforms": ["METAL"]}).platforms == ("METAL",)
    with pytest.raises(UnknownPlatformError) as caught:
        jax_runtime({"platforms": ["cpu", "cdua"]})
    assert (caught.value.platform, caught.value.known) == ("cdua", KNOWN_PLATFORMS)
    assert "use one of: cpu, cuda, gpu, METAL, oneapi, proxy, rocm, tpu" in str(caught.value)
    with pytest.raises(
        ValidationError, match="'Cuda' is not a platform jax knows; did you mean 'cuda'"
    ):
        JobSpec(
            name="j",
            tasks=(Task(name="t", argv=("python",), timeout_seconds=1),),
            timeout_seconds=1,
            runtime={"platforms": ["Cuda"]},
        )


def test_a_job_spec_s_unknown_platform_is_pydantic_s_validation_error_holding_it():
    """A spec review: the guide said a JobSpec raises UnknownPlatformError; pydantic wraps it
    (as every ValueError of a validator) in its ValidationError, which the guide now says."""
    from substrax.runtime import JaxRuntime

    tasks = (Task(name="t", argv=("python",), timeout_seconds=1),)
    with pytest.raises(ValidationError) as caught:
        JobSpec(name="j", tasks=tasks, timeout_seconds=1, runtime=JaxRuntime(platforms=("cdua",)))
    assert isinstance(caught.value, ValueError)
    (error,) = (line["ctx"]["error"] for line in caught.value.errors())
    assert isinstance(error, UnknownPlatformError)
    assert (error.platform, error.known) == ("cdua", KNOWN_PLATFORMS)


@pytest.mark.usefixtures("child_processes")
def test_known_platforms_match_jax_own_list():
    """jax's ``known_platforms()`` before any plugin loads, read in a fresh interpreter."""
    import subprocess
    import sys

    pytest.importorskip("jax", reason="jax (substrax-runtime's dependency) is not installed")
    listed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from jax._src import xla_bridge as x; print(*sorted(x.known_platforms()))",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout.split()
    plugins_jax_cannot_list = {"METAL"}  # jax-metal registers it when it loads
    # jax 0.11 (the declared floor, run by CI's lowest-direct job) does not know "proxy" yet.
    jax_version = tuple(int(part) for part in importlib.metadata.version("jax").split(".")[:2])
    newer_than_jax = {"proxy"} if jax_version < (0, 12) else set()
    assert sorted(listed) == sorted(set(KNOWN_PLATFORMS) - plugins_jax_cannot_list - newer_than_jax)


def test_include_files_are_relative_normalised_paths():
    task = Task(name="t", argv=("python",), timeout_seconds=1)
    spec = JobSpec(name="j", tasks=(task,), timeout_seconds=1, include_files=("conf/.env",))
    assert spec.include_files == ("conf/.env",)
    for bad in ("/etc/passwd", "../x", "a/../b", "./a", "a/", ""):
        with pytest.raises(ValidationError, match="must be a file path relative to the project"):
            JobSpec(name="j", tasks=(task,), timeout_seconds=1, include_files=(bad,))


def test_mount_access_is_a_str_enum_that_takes_either_form():
    from substrax.compute import Mount, MountAccess

    assert [m.value for m in MountAccess] == ["read-only", "read-write"]
    assert Mount(name="d", path="/d").access is MountAccess.READ_ONLY
    written = Mount(name="d", path="/d", access=MountAccess.READ_WRITE)
    assert Mount(name="d", path="/d", access="read-write") == written
    assert written.model_dump(mode="json")["access"] == "read-write"
    with pytest.raises(ValueError, match="'read-only' or 'read-write'"):
        Mount(name="d", path="/d", access="rw")


def test_a_jax_runtime_is_stored_as_its_fields_and_read_back_the_same():
    from substrax.runtime import JaxRuntime

    runtime = JaxRuntime(
        platforms=("cpu",), xla_flags=("--xla_a=1",), compilation_cache_dir=Path("/c")
    )
    spec = JobSpec(
        name="j",
        tasks=(Task(name="t", argv=("python",), timeout_seconds=1),),
        timeout_seconds=1,
        runtime=runtime,
    )
    assert spec.runtime == {
        "platforms": ["cpu"],
        "xla_flags": ["--xla_a=1"],
        "compilation_cache_dir": "/c",
    }
    assert jax_runtime(spec.runtime) == runtime
    assert read_job_spec(spec.model_dump(mode="json")) == spec


def test_replace_validates_the_copy_and_leaves_the_original():
    spec = JobSpec(
        name="j", tasks=(Task(name="t", argv=("python",), timeout_seconds=1),), timeout_seconds=1
    )
    wider = spec.replace(nodes=2, env={"A": "1"})
    assert (wider.nodes, wider.env, wider.tasks) == (2, {"A": "1"}, spec.tasks)
    assert spec.nodes == 1
    with pytest.raises(ValueError, match="nodes"):
        spec.replace(nodes=0)
    with pytest.raises(ValueError, match="unknown_field"):
        spec.replace(unknown_field=1)


def test_a_spec_that_is_no_mapping_is_refused_by_type():
    with pytest.raises(TypeError, match="a job spec is a mapping"):
        read_job_spec("{}")


@pytest.mark.parametrize("file", ["tr ain é.py", "a:b.py"])
def test_an_example_whose_name_makes_no_task_name_is_refused_naming_the_file(tmp_path, file):
    with pytest.raises(ValueError, match=r"^example examples/.* makes the task name .*rename"):
        example_tasks([tmp_path / "examples" / file], project=tmp_path, timeout_seconds=9)


def _spec(**fields):
    task = Task(name="t", argv=("python",), timeout_seconds=1)
    return JobSpec(name="j", tasks=(task,), timeout_seconds=1, **fields)


@pytest.mark.parametrize(("a", "b"), [("data-a", "data_a"), ("Data", "data"), ("a.b", "a-b")])
def test_mounts_that_would_set_one_variable_are_refused_naming_both(a, b):
    mounts = (Mount(name=a, path="/d1"), Mount(name=b, path="/d2"))
    variable = "SUBSTRAX_MOUNT_" + a.upper().replace("-", "_").replace(".", "_")
    with pytest.raises(ValidationError, match=f"mounts '{a}' and '{b}' would both set {variable};"):
        _spec(mounts=mounts)


@pytest.mark.parametrize(
    "name",
    [
        "manifest.json",
        "devices.log",
        "nodes",
        "worker.log",
        "worker-3.log",
        "Manifest.JSON",
        "NODES",
    ],
)
def test_task_names_the_run_directory_holds_are_refused(name):
    task = Task(name=name, argv=("python",), timeout_seconds=1)
    with pytest.raises(
        ValidationError,
        match=rf"task '{name}' is named like a file the run directory holds \(manifest\.json, "
        r"devices\.log, nodes, worker\.log, worker-N\.log\); rename it",
    ):
        JobSpec(name="j", tasks=(task,), timeout_seconds=1)


def test_task_names_near_the_reserved_ones_are_kept():
    for name in ("manifest", "nodes.x", "worker-a.log", "my-devices.log", "worker.log.d"):
        task = Task(name=name, argv=("python",), timeout_seconds=1)
        assert _spec().replace(tasks=(task,)).tasks == (task,)


def test_an_xla_flag_given_twice_is_a_runtime_field_error():
    from substrax.compute import RuntimeFieldError

    with pytest.raises(RuntimeFieldError, match=r"XLA flag --a is already set to '1'") as caught:
        jax_runtime({"xla_flags": ["--a=1", "--a=2"]})
    assert isinstance(caught.value, ValueError)
    with pytest.raises(ValidationError, match="XLA flag --a is already set to '1'"):
        _spec(runtime={"xla_flags": ["--a=1", "--a=2"]})
