"""[tool.substrax.compute]: what is accepted, and every refusal with its TOML path."""

import copy
from pathlib import Path

import pytest

from substrax.compute import (
    Accelerator,
    ComputeConfigError,
    ConfigFileError,
    read_compute_config,
    resolve_job,
)
from substrax.compute._config import parse_compute_config, require_locked_substrax


def _job(**overrides):
    job = {"commands": {"hi": ["python", "-c", "print(1)"]}, "timeout_seconds": 60}
    job.update(overrides)
    return job


def _config(**overrides):
    return {"jobs": {"demo": _job(**overrides)}}


P = "tool.substrax.compute"
J = f"{P}.jobs.demo"

NAME = "must be one name of letters, digits, '.', '_' or '-' (no '/' or '..')"
NOT_DIRECTORY = "must be a directory relative to the project, without '..'"
NOT_ABSOLUTE = "must be an absolute, normalised path other than '/'"
ARGV_STRING = "must be an argv list such as ['python', 'x.py'], not a string (no shell strings)"
JOB_KEYS = (
    "examples, commands, timeout_seconds, task_timeout_seconds, extras, resources, accelerator, "
    "runtime, env, secrets, mounts, nodes, probe_devices, include_files, stop_grace_seconds"
)

# Each job key, the values refused for it, and the refusal after the key's own path.
BAD_JOB_VALUES = {
    "timeout_seconds": [
        (0, ": must be positive and finite, got 0"),
        (-5, ": must be positive and finite, got -5"),
        (float("inf"), ": must be positive and finite, got Infinity"),
        ("60", ': Input should be a valid number, got "60"'),
        (True, ": Input should be a valid number, got true"),
    ],
    "task_timeout_seconds": [(-1, ": must be positive and finite, got -1")],
    "stop_grace_seconds": [(0, ": must be positive and finite, got 0")],
    "commands": [
        ({"hi": "python -c 'print(1)'"}, f".hi: {ARGV_STRING}, got \"python -c 'print(1)'\""),
        (
            {"hi": []},
            ".hi: must be a non-empty list of arguments (argv), e.g. ['python', 'x.py'], got []",
        ),
        (
            {"hi": ["bash", "-c", "rm -rf /"]},
            ".hi: runs a shell string (bash -c ...); write the command as an argv list instead, "
            'got ["bash", "-c", "rm -rf /"]',
        ),
        (
            {"hi": ["/bin/sh", "-ec", "x"]},
            ".hi: runs a shell string (/bin/sh -c ...); write the command as an argv list "
            'instead, got ["/bin/sh", "-ec", "x"]',
        ),
        ({"hi": ["python", 3]}, ".hi[1]: Input should be a valid string, got 3"),
        (  # it passed, and the worker crashed in Popen ("embedded null byte"): no manifest
            {"hi": ["python", "a\0b"]},
            ".hi: argument 1 ('a\\x00b') holds a NUL character (\\0) at index 1, which no "
            "program's argument or environment variable can hold; remove it",
        ),
        ({"../up": ["python"]}, f'."../up": key {NAME}, got "../up"'),
        *(
            (
                {name: ["python"]},
                f": task {name!r} is named like a file the run directory holds (manifest.json, "
                "devices.log, nodes, worker.log, worker-N.log); rename it",
            )
            for name in ("manifest.json", "devices.log", "nodes", "worker.log", "worker-1.log")
        ),
    ],
    "examples": [
        (["../elsewhere"], f'[0]: {NOT_DIRECTORY}, got "../elsewhere"'),
        (["/abs"], f'[0]: {NOT_DIRECTORY}, got "/abs"'),
        ("examples", ': must be a list, not a string (no shell strings), got "examples"'),
    ],
    "extras": [(["a b"], f'[0]: {NAME}, got "a b"')],
    "resources": [
        ({"cpu": -1}, ".cpu: must be positive and finite, got -1"),
        ({"gpus": 2}, ".gpus: unknown key; allowed keys: accelerator, cpu, memory_mib"),
        ({"memory_mib": 0}, ".memory_mib: must be between 1 and 16777216, got 0"),
        ({"memory_mib": 1.5}, ".memory_mib: Input should be a valid integer, got 1.5"),
        ({"memory_mib": 1 << 40}, ".memory_mib: must be between 1 and 16777216, got 1099511627776"),
        (
            {"accelerator": {"kind": "H100", "count": 0}},
            ".accelerator.count: must be between 1 and 64, got 0",
        ),
        ({"accelerator": {"kind": "H 100"}}, f'.accelerator.kind: {NAME}, got "H 100"'),
        ({"accelerator": {"count": 1}}, ".accelerator.kind: is required"),
    ],
    "accelerator": [
        ({"kind": "L4", "type": "x"}, ".type: unknown key; allowed keys: kind, count"),
        (
            {"kind": "H100", "count": 10**20},
            ".count: must be between 1 and 64, got 100000000000000000000",
        ),
    ],
    "runtime": [
        ({"cpu_device": 2}, ".cpu_device: unknown JaxRuntime field 'cpu_device'; allowed: "),
        ({"cpu_devices": 0}, ".cpu_devices: JaxRuntime.cpu_devices=0 must be an integer >= 1"),
        (
            {"memory_fraction": 2.0},
            ".memory_fraction: JaxRuntime.memory_fraction=2.0 must be a finite number > 0 and <= 1",
        ),
        ({"xla_flags": ["not-a-flag"]}, ".xla_flags: "),
        (
            {"xla_flags": ["--a=1", "--a=2"]},
            ".xla_flags: XLA flag --a is already set to '1' and was requested as '2'",
        ),
        (
            {"platforms": ["cuda", "metal"]},
            ".platforms: JaxRuntime.platforms entry 'metal' is not a platform jax knows; "
            "did you mean 'METAL'?",
        ),
    ],
    "env": [
        ({"A B": "1"}, '."A B": key must be an environment variable name, got "A B"'),
        ({"A": 1}, ".A: Input should be a valid string, got 1"),
        (
            {"A": "x\0"},
            ".A: holds a NUL character (\\0) at index 1, which no program's argument or "
            "environment variable can hold; remove it",
        ),
        (  # it passed, and every task failed at its start
            {"AVITAI_OUTPUT_DIR": "/tmp/x"},
            ".AVITAI_OUTPUT_DIR: env sets AVITAI_OUTPUT_DIR='/tmp/x', but the worker (each task's "
            "own output directory) sets it to '<outputs>/<task>'; drop it from the job's env; a "
            "task finds its directory in AVITAI_OUTPUT_DIR",
        ),
    ],
    "secrets": [(["1BAD"], '[0]: must be an environment variable name, got "1BAD"')],
    "mounts": [
        ([{"name": "d", "path": "relative"}], f'[0].path: {NOT_ABSOLUTE}, got "relative"'),
        ([{"name": "d", "path": "/data/../etc"}], f'[0].path: {NOT_ABSOLUTE}, got "/data/../etc"'),
        ([{"name": "d", "path": "/"}], f'[0].path: {NOT_ABSOLUTE}, got "/"'),
        (
            [{"name": "d", "path": "/outputs/x"}],
            '[0].path: must not overlap /outputs, which the worker owns, got "/outputs/x"',
        ),
        (
            [{"name": "d", "path": "/data", "access": "rw"}],
            "[0].access: Input should be 'read-only' or 'read-write', got \"rw\"",
        ),
        ([{"name": "../d", "path": "/data"}], f'[0].name: {NAME}, got "../d"'),
    ],
    "nodes": [
        (0, ": must be between 1 and 1024, got 0"),
        (99999999999999999999, ": must be between 1 and 1024, got 99999999999999999999"),
        (1.5, ": Input should be a valid integer, got 1.5"),
    ],
    "probe_devices": [("yes", ': Input should be a valid boolean, got "yes"')],
    "unknown": [(1, f": unknown key; allowed keys: {JOB_KEYS}")],
    "include_files": [
        (
            ["../.env"],
            "[0]: must be a file path relative to the project, normalised, without '..', "
            'got "../.env"',
        )
    ],
}

BAD = [
    ({"colour": "red"}, f"{P}.colour: unknown key; allowed keys: backend, backends, jobs"),
    ({"backend": 3}, f"{P}.backend: Input should be a valid string, got 3"),
    ({"backend": "a/b"}, f'{P}.backend: {NAME}, got "a/b"'),
    ({"backends": {"modal": 1}}, f"{P}.backends.modal: Input should be an object, got 1"),
    (  # it was ignored: `--backend modal` then said only that outputs_volume was required
        {"backends": {"modl": {"outputs_volume": "v"}}},
        f"{P}.backends.modl: no compute backend 'modl' is registered (registered: local, modal, "
        "skypilot); did you mean 'modal'? rename the table",
    ),
    (
        {"jobs": {"demo": {"timeout_seconds": 60}}},
        f"{J}: a job needs `examples` directories or `commands` to run",
    ),
    ({"jobs": {"demo": {"commands": {"a": ["x"]}}}}, f"{J}.timeout_seconds: is required"),
    (
        _config(task_timeout_seconds=61),
        f"{J}: `task_timeout_seconds` must not exceed the job's `timeout_seconds`",
    ),
    (
        _config(accelerator={"kind": "L4"}, resources={"accelerator": {"kind": "L4"}}),
        f"{J}: set `accelerator` or `resources.accelerator`, not both",
    ),
    (_config(secrets=["TOKEN", "TOKEN"]), f"{J}: secrets must be unique; repeated: TOKEN"),
    (
        _config(secrets=["TOKEN"], env={"TOKEN": "x"}),
        f"{J}: TOKEN named both in env and in secrets; keep one",
    ),
    (
        _config(mounts=[{"name": "a", "path": "/d"}, {"name": "b", "path": "/d"}]),
        f"{J}: mount paths must be unique; repeated: /d",
    ),
    (
        _config(mounts=[{"name": "data-a", "path": "/a"}, {"name": "data_a", "path": "/b"}]),
        f"{J}: mounts 'data-a' and 'data_a' would both set SUBSTRAX_MOUNT_DATA_A; rename one",
    ),
    (
        {"jobs": {"a.b": _job(runtime={"cpu_devices": 0})}},
        f'{P}.jobs."a.b".runtime.cpu_devices: JaxRuntime.cpu_devices=0',
    ),
    *(
        (_config(**{key: value}), f"{J}.{key}{refusal}")
        for key, cases in BAD_JOB_VALUES.items()
        for value, refusal in cases
    ),
]


@pytest.mark.parametrize(("table", "message"), BAD, ids=[str(i) for i in range(len(BAD))])
def test_bad_config_is_refused_with_its_path(table, message):
    with pytest.raises(ComputeConfigError) as caught:
        parse_compute_config(table)
    text = str(caught.value)
    assert text.startswith(message), f"{text!r} does not start with {message!r}"
    assert caught.value.path == message.split(": ", 1)[0]


def test_every_problem_is_reported():
    with pytest.raises(ComputeConfigError) as caught:
        parse_compute_config(_config(nodes=0, resources={"cpu": -1}))
    assert [path for path, _ in caught.value.problems] == [f"{J}.resources.cpu", f"{J}.nodes"]


def test_several_problems_are_one_line_naming_the_file_and_every_key(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        "[tool.substrax.compute.jobs.demo]\ncommands = { hi = ['x'] }\ntimeout_seconds = 5\n"
        "nodes = 0\nresources = { cpu = -1 }\ncolour = 'red'\n"
    )
    with pytest.raises(ComputeConfigError) as caught:
        read_compute_config(tmp_path)
    text = str(caught.value)
    assert "\n" not in text
    assert text.startswith(
        f"3 problems in {tmp_path / 'pyproject.toml'} [tool.substrax.compute]: "
    ), text
    for key in ("demo.resources.cpu", "demo.nodes", "demo.colour"):
        assert f"tool.substrax.compute.jobs.{key}: " in text
    assert caught.value.source == tmp_path / "pyproject.toml"


def test_good_config_reads_back_every_field():
    table = {
        "backend": "modal",
        "backends": {"modal": {"outputs_volume": "demo-outputs"}},
        "jobs": {
            "demo": _job(
                task_timeout_seconds=30,
                extras=["cuda12"],
                accelerator={"kind": "L4"},
                resources={"cpu": 8, "memory_mib": 32768},
                runtime={"platforms": ["cuda"], "xla_flags": ["--xla_gpu_deterministic_ops=true"]},
                env={"TF_CPP_MIN_LOG_LEVEL": "1"},
                secrets=["WANDB_API_KEY"],
                mounts=[{"name": "datasets", "path": "/data"}],
                nodes=2,
                stop_grace_seconds=90,
            )
        },
    }
    config = parse_compute_config(copy.deepcopy(table))
    assert config.backend == "modal"
    assert config.backends["modal"] == {"outputs_volume": "demo-outputs"}
    spec = resolve_job(config, "demo", project=Path())
    assert spec.resources.accelerator == Accelerator(kind="L4", count=1)
    assert spec.resources.cpu == 8.0
    assert spec.tasks[0].timeout_seconds == 30.0
    assert spec.runtime == table["jobs"]["demo"]["runtime"]
    assert spec.secrets == ("WANDB_API_KEY",)
    assert spec.nodes == 2
    assert spec.stop_grace_seconds == 90.0
    assert spec.mounts[0].access == "read-only"


def test_accelerator_option_overrides_the_configured_one():
    config = parse_compute_config(_config(accelerator={"kind": "L4"}))
    spec = resolve_job(
        config, "demo", project=Path(), accelerator=Accelerator(kind="H100", count=8)
    )
    assert spec.resources.accelerator == Accelerator(kind="H100", count=8)


def test_examples_become_tasks_before_commands(tmp_path):
    (tmp_path / "examples" / "metrics").mkdir(parents=True)
    (tmp_path / "examples" / "metrics" / "plot.py").write_text("")
    (tmp_path / "examples" / "a.py").write_text("")
    config = parse_compute_config(_config(examples=["examples"]))
    spec = resolve_job(config, "demo", project=tmp_path)
    assert [(t.name, t.argv) for t in spec.tasks] == [
        ("examples.a", ("python", "examples/a.py")),
        ("examples.metrics.plot", ("python", "examples/metrics/plot.py")),
        ("hi", ("python", "-c", "print(1)")),
    ]


def test_unknown_job_lists_the_configured_ones():
    config = parse_compute_config(_config())
    with pytest.raises(KeyError, match="configured: demo"):
        resolve_job(config, "nope", project=Path())


def test_missing_examples_directory(tmp_path):
    config = parse_compute_config(_config(examples=["examples"]))
    with pytest.raises(FileNotFoundError, match="directory 'examples'"):
        resolve_job(config, "demo", project=tmp_path)


def test_read_from_pyproject(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[tool.substrax.compute.jobs.demo]\ncommands = { hi = ["python", "-V"] }\ntimeout_seconds = 5\n'
    )
    assert read_compute_config(tmp_path).jobs["demo"].commands == {"hi": ("python", "-V")}
    assert read_compute_config(str(tmp_path)) == read_compute_config(tmp_path)  # a str path too


def test_pyproject_without_table_or_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no pyproject\.toml"):
        read_compute_config(tmp_path)
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    with pytest.raises(LookupError, match=r"no \[tool.substrax.compute\] table"):
        read_compute_config(tmp_path)


def test_bad_toml_value_names_its_path(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        "[tool.substrax.compute.jobs.demo]\ncommands = { hi = ['x'] }\ntimeout_seconds = 5\n"
        "resources = { cpu = -1 }\n"
    )
    with pytest.raises(
        ComputeConfigError,
        match=r"^tool\.substrax\.compute\.jobs\.demo\.resources\.cpu: must be positive and finite, got -1 \(in .*pyproject\.toml\)$",
    ):
        read_compute_config(tmp_path)


def _malformed(path, content, read):
    """The ``ConfigFileError`` that ``read(path.parent)`` raises with ``content`` in ``path``."""
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(ConfigFileError) as caught:
        read(path.parent)
    return caught.value


def test_malformed_toml_names_the_file_line_and_column(tmp_path):
    pyproject, lock = tmp_path / "pyproject.toml", tmp_path / "uv.lock"
    text = "[tool.substrax.compute]\nbackend = 'local'\njobs = {\n"
    error = _malformed(pyproject, text, read_compute_config)
    assert (error.path, error.line) == (pyproject, 3)
    assert str(error).startswith(f"{pyproject}:3:{error.column}: not valid TOML: ")
    error = _malformed(pyproject, b"[project]\nname = '\xff'\n", read_compute_config)
    assert str(error).startswith(f"{pyproject}:2:9: not valid TOML: not UTF-8")
    pyproject.unlink()
    error = _malformed(lock, "[[package]\n", require_locked_substrax)
    assert (error.path, error.line) == (lock, 1)
    assert str(error).startswith(f"{lock}:1:{error.column}: not valid TOML")


def test_toml_that_ends_too_soon_names_where_it_ends(tmp_path):
    lock = tmp_path / "uv.lock"
    text = 'version = 1\n[[package]]\nname = "substrax-compute'
    error = _malformed(lock, text, require_locked_substrax)
    assert (error.line, error.column) == (3, 25)
    assert str(error) == f"{lock}:3:25: not valid TOML: Unterminated string; fix the file and retry"
    error = _malformed(lock, "version = 1\n[package", require_locked_substrax)
    assert str(error).startswith(f"{lock}:2:9: not valid TOML: Expected ']'")


def test_include_files_must_exist_when_the_job_is_resolved(tmp_path):
    config = parse_compute_config(_config(include_files=["config/.env.remote"]))
    with pytest.raises(
        FileNotFoundError, match=r"jobs\.demo\.include_files: 'config/\.env\.remote'"
    ):
        resolve_job(config, "demo", project=tmp_path)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / ".env.remote").write_text("TOKEN=1\n")
    spec = resolve_job(config, "demo", project=tmp_path)
    assert spec.include_files == ("config/.env.remote",)


def test_locked_substrax(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"no uv\.lock"):
        require_locked_substrax(tmp_path)
    lock = tmp_path / "uv.lock"
    lock.write_text('[[package]]\nname = "numpy"\nversion = "2.0"\n')
    with pytest.raises(LookupError, match="uv add substrax-compute"):
        require_locked_substrax(tmp_path)
    lock.write_text(
        '[[package]]\nname = "substrax-compute"\nversion = "0.2.0"\nsource = { registry = "https://pypi.org/simple" }\n'
    )
    assert require_locked_substrax(tmp_path) == "0.2.0"
    lock.write_text(
        '[[package]]\nname = "substrax-compute"\nversion = "0.2.0"\nsource = { editable = "packages/x" }\n'
    )
    assert require_locked_substrax(tmp_path) == "editable"


def test_an_example_and_a_command_of_one_task_name_are_refused_naming_both(tmp_path):
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "a.py").write_text("")
    config = parse_compute_config(_config(examples=["examples"], commands={"examples.a": ["x"]}))
    with pytest.raises(ComputeConfigError) as caught:
        resolve_job(config, "demo", project=tmp_path)
    assert str(caught.value) == (
        f"{J}.commands.\"examples.a\": command 'examples.a' and example examples/a.py "
        f"({J}.examples[0]) both make the task 'examples.a'; rename one"
    )
    config = parse_compute_config(_config(examples=["examples", "examples"]))
    with pytest.raises(ComputeConfigError, match=r"examples\[1\]: example examples/a\.py and"):
        resolve_job(config, "demo", project=tmp_path)


def test_an_example_that_makes_a_reserved_or_bad_task_name_names_its_entry(tmp_path):
    (tmp_path / "devices").mkdir()
    (tmp_path / "devices" / "log.py").write_text("")
    config = parse_compute_config(_config(examples=["devices"]))
    with pytest.raises(ComputeConfigError) as caught:
        resolve_job(config, "demo", project=tmp_path)
    assert caught.value.path == f"{J}.examples[0]"
    assert caught.value.reason.startswith(
        "example devices/log.py: task 'devices.log' is named like a file the run directory holds"
    )
    (tmp_path / "devices" / "log.py").rename(tmp_path / "devices" / "a b.py")
    with pytest.raises(ComputeConfigError, match=r"examples\[0\]: example devices/a b\.py makes"):
        resolve_job(config, "demo", project=tmp_path)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('package = "x"\n', "`package` must be an array of tables ([[package]]), not a string"),
        ("package = [1]\n", "`package[0]` must be a table, not an integer"),
        (
            '[[package]]\nname = "numpy"\n[[package]]\nname = "substrax-compute"\nsource = "x"\n',
            "`package[1].source` (substrax-compute) must be a table, not a string",
        ),
    ],
)
def test_a_lock_of_the_wrong_shape_is_refused_naming_the_file(tmp_path, text, reason):
    lock = tmp_path / "uv.lock"
    error = _malformed(lock, text, require_locked_substrax)
    assert (error.path, error.malformed) == (lock, True)
    assert str(error) == f"{lock}: {reason}; run `uv lock` to rewrite the file"


@pytest.mark.parametrize(
    ("text", "where"),
    [("tool = 3\n", "tool"), ("[tool]\nsubstrax = 'x'\n", "tool.substrax")],
)
def test_a_pyproject_whose_tool_table_is_no_table_is_refused(tmp_path, text, where):
    pyproject = tmp_path / "pyproject.toml"
    error = _malformed(pyproject, text, read_compute_config)
    assert str(error).startswith(f"{pyproject}: `{where}` must be a table, not ")


def test_an_invalid_runtime_is_one_line_and_exit_2_from_the_command_line(tmp_path, capsys):
    from substrax.compute.cli import main

    (tmp_path / "pyproject.toml").write_text(
        "[tool.substrax.compute.jobs.demo]\ncommands = { hi = ['x'] }\ntimeout_seconds = 5\n"
        "runtime = { xla_flags = ['--a=1', '--a=2'] }\n"
    )
    assert main(["run", "demo", "--project", str(tmp_path), "--dry-run"]) == 2
    assert capsys.readouterr().err == (
        f"substrax-compute: error: {J}.runtime.xla_flags: XLA flag --a is already set to '1' "
        f"and was requested as '2' (in {tmp_path / 'pyproject.toml'})\n"
    )


@pytest.mark.parametrize("dry_run", [["--dry-run"], []], ids=["dry-run", "submit"])
def test_a_job_env_contradicting_its_runtime_is_exit_2_before_anything_runs(
    tmp_path, capsys, monkeypatch, dry_run
):
    """Hostile finding: it was refused only as the task started, on Modal or SkyPilot after the
    cluster was provisioned, and the message blamed the interpreter."""
    from substrax.compute.cli import main

    monkeypatch.setenv("SUBSTRAX_STATE_DIR", str(tmp_path / "state"))  # where a run would go
    (tmp_path / "pyproject.toml").write_text(
        "[tool.substrax.compute]\nbackend = 'local'\n"
        f"[tool.substrax.compute.backends.local]\nstate_dir = '{tmp_path / 'state'}'\n"
        "[tool.substrax.compute.jobs.demo]\ncommands = { hi = ['x'] }\ntimeout_seconds = 5\n"
        "env = { JAX_ENABLE_X64 = '0' }\nruntime = { enable_x64 = true }\n"
    )
    assert main(["run", "demo", "--project", str(tmp_path), *dry_run]) == 2
    assert capsys.readouterr().err == (
        f"substrax-compute: error: {J}.env.JAX_ENABLE_X64: env sets JAX_ENABLE_X64='0', but the "
        "runtime table of job 'demo' (enable_x64) sets it to 'true'; set it once: as enable_x64 "
        f"in the runtime table, not as JAX_ENABLE_X64 in env (in {tmp_path / 'pyproject.toml'})\n"
    )
    assert not (tmp_path / "state").exists()


def test_a_job_env_contradicting_its_topology_names_its_path_and_an_agreeing_one_is_kept():
    with pytest.raises(ComputeConfigError) as info:
        parse_compute_config(_config(nodes=2, env={"JAX_NUM_PROCESSES": "3"}))
    assert list(info.value.problems) == [
        (
            f"{J}.env.JAX_NUM_PROCESSES",
            "env sets JAX_NUM_PROCESSES='3', but the backend, for a 2-node job, sets it to '2'; "
            "substrax wires every node of the job: drop it from the job's env",
        )
    ]
    one_node = {"JAX_NUM_PROCESSES": "1", "JAX_PROCESS_ID": "0"}  # a 1-node job's topology
    config = parse_compute_config(_config(env=one_node))
    assert resolve_job(config, "demo", project=Path()).env == one_node
