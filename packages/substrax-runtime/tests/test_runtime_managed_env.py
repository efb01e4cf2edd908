import json
import shlex
import subprocess
import sys

import pytest

from substrax.runtime.managed_env import (
    main,
    managed_environment,
    nvidia_gpu_visible,
    render,
    resolve_backend,
)


def test_cpu_backend_unsets_accelerator_memory_settings():
    env = managed_environment("PROJ", "cpu", env_root="/srv/p")
    assert env["PROJ_BACKEND"] == "cpu"
    assert env["PROJ_ENV_ROOT"] == "/srv/p"
    assert env["JAX_PLATFORMS"] == "cpu"
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] is None
    assert env["XLA_CLIENT_MEM_FRACTION"] is None
    assert set(env["PROJ_MANAGED_ENV_VARS"].split()) == set(env)


@pytest.mark.parametrize(("backend", "platforms"), [("cuda12", "cuda"), ("metal", None)])
def test_accelerators_turn_preallocation_off(backend, platforms):
    env = managed_environment("PROJ", backend, env_root="/p", overrides={"EXTRA_X": "1"})
    assert env["JAX_PLATFORMS"] == platforms
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["XLA_CLIENT_MEM_FRACTION"] == "0.75"
    assert "EXTRA_X" in env["PROJ_MANAGED_ENV_VARS"].split()


def test_the_0_1_22_keyword_names_are_accepted():
    ours = managed_environment("PROJ", "cuda12", env_root="/srv/p", overrides={"EXTRA_X": "1"})
    release = managed_environment("PROJ", "cuda12", project_root="/srv/p", extra={"EXTRA_X": "1"})
    assert release == ours
    assert release["PROJ_ENV_ROOT"] == "/srv/p"
    assert release["EXTRA_X"] == "1"
    mixed = managed_environment("PROJ", "cpu", project_root="/p", overrides={"EXTRA_X": "1"})
    assert mixed == managed_environment("PROJ", "cpu", env_root="/p", extra={"EXTRA_X": "1"})


def test_a_setting_under_both_names_or_no_root_is_refused():
    with pytest.raises(TypeError, match=r"env_root='/a' and project_root='/b'.*pass only env_root"):
        managed_environment("P", "cpu", env_root="/a", project_root="/b")
    with pytest.raises(TypeError, match=r"overrides=.* and extra=.*pass only overrides"):
        managed_environment("P", "cpu", env_root="/a", overrides={"A": "1"}, extra={"A": "2"})
    with pytest.raises(TypeError, match=r"pass env_root= \(0.1.22: project_root=\)"):
        managed_environment("P", "cpu")


@pytest.mark.parametrize("prefix", ["", "proj", "P-X", "P X", "1A", "É", "PΩ"])  # sh names
def test_prefix_is_checked(prefix):
    with pytest.raises(ValueError, match="prefix"):
        managed_environment(prefix, "cpu", env_root="/p")


def test_bad_backend_and_override_names():
    with pytest.raises(ValueError, match="resolve auto first"):
        managed_environment("P", "auto", env_root="/p")  # type: ignore[arg-type]
    for name in ("1X", "Ω", "A-B", ""):  # a shell cannot export any of them
        with pytest.raises(ValueError, match="not a shell variable name"):
            managed_environment("P", "cpu", env_root="/p", overrides={name: "v"})


def test_resolve_backend():
    assert resolve_backend("cpu") == "cpu"
    assert resolve_backend("auto", system="Darwin", machine="arm64") == "metal"
    assert resolve_backend("auto", system="Linux", machine="x86_64", gpu=True) == "cuda12"
    assert resolve_backend("auto", system="Linux", machine="x86_64", gpu=False) == "cpu"
    assert resolve_backend("auto", system="Linux", machine="x86_64") == (
        "cuda12" if nvidia_gpu_visible() else "cpu"
    )
    with pytest.raises(ValueError, match="not one of auto, cpu, cuda12, metal"):
        resolve_backend("rocm")


@pytest.mark.usefixtures("child_processes")
def test_rendered_file_is_sourced_by_a_shell(tmp_path):
    env = managed_environment("PROJ", "cuda12", env_root="/p q", overrides={"NOTE": "it's"})
    script = tmp_path / "env.sh"
    script.write_text(render(env))
    shown = subprocess.run(
        [
            "/bin/sh",
            "-c",
            f'. {shlex.quote(str(script))}; echo "$PROJ_ENV_ROOT|$NOTE|${{XLA_CLIENT_MEM_FRACTION}}"',
        ],
        capture_output=True,
        text=True,
        check=True,
        env={"XLA_CLIENT_MEM_FRACTION": "0.1"},
    ).stdout
    assert shown == "/p q|it's|0.75\n"


def test_write_then_show(tmp_path, capsys):
    output = tmp_path / "sub" / ".proj.env"
    assert (
        main(
            [
                "write",
                "--prefix",
                "PROJ",
                "--backend",
                "cpu",
                "--output",
                str(output),
                "--env-root",
                str(tmp_path),
                "--set",
                "EXTRA=1",
            ]
        )
        == 0
    )
    text = output.read_text()
    assert "export PROJ_BACKEND=cpu" in text
    assert "unset XLA_CLIENT_MEM_FRACTION" in text
    user = tmp_path / "user.env"
    user.write_text("# mine\nEXTRA=2\nMY_OWN='a b'\n")
    assert (
        main(["show", "--prefix", "PROJ", "--env-file", str(output), "--user-env", str(user)]) == 0
    )
    shown = capsys.readouterr().out.splitlines()
    assert f"EXTRA=2  # {user}" in shown
    assert f"MY_OWN=a b  # {user}  [not managed]" in shown
    assert f"XLA_CLIENT_MEM_FRACTION=(unset)  # {output}" in shown
    show = ["show", "--prefix", "PROJ", "--env-file", str(output), "--user-env", str(user)]
    assert main([*show, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["EXTRA"] == {"value": "2", "origin": str(user), "managed": True}
    assert data["MY_OWN"] == {"value": "a b", "origin": str(user), "managed": False}
    assert data["XLA_CLIENT_MEM_FRACTION"] == {
        "value": None,
        "origin": str(output),
        "managed": True,
    }


PREFIX = "python -m substrax.runtime.managed_env: error: "


def test_bad_input_exits_2_with_one_error_line(tmp_path, capsys):
    output = tmp_path / "x"
    assert main(["write", "--prefix", "bad", "--backend", "cpu", "--output", str(output)]) == 2
    assert capsys.readouterr().err.startswith(f"{PREFIX}prefix 'bad' must be upper-case")
    write = ["write", "--prefix", "P", "--backend", "cpu", "--output", str(output)]
    assert main([*write, "--set", "NOEQ"]) == 2
    assert capsys.readouterr().err == f"{PREFIX}--set 'NOEQ' must be NAME=VALUE\n"
    assert not output.exists()
    missing = tmp_path / "missing.env"
    assert main(["show", "--prefix", "P", "--env-file", str(missing)]) == 2
    assert capsys.readouterr().err == f"{PREFIX}cannot read {missing}: No such file or directory\n"
    malformed = tmp_path / "bad.env"
    malformed.write_text("JUST_A_NAME\n")
    assert main(["show", "--prefix", "P", "--env-file", str(malformed)]) == 2
    assert "expected NAME=value" in capsys.readouterr().err


def test_an_unwritable_output_exits_1(capsys):
    output = "/proc/substrax-managed.env"  # no file can be created in /proc, even by root
    assert main(["write", "--prefix", "P", "--backend", "cpu", "--output", output]) == 1
    assert capsys.readouterr().err.startswith(f"{PREFIX}cannot write {output}")


def test_an_output_under_a_file_or_a_directory_or_a_file_env_root_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    write = ["write", "--prefix", "P", "--backend", "cpu"]
    for argv, message in [
        (["--output", str(blocker / "env.sh")], f"{blocker} is a file, not a directory"),
        (["--output", str(tmp_path)], f"--output {tmp_path} is a directory"),
        (["--output", str(tmp_path / "e.env"), "--env-root", str(blocker)], "is not a directory"),
        (["--output", str(tmp_path / "e.env"), "--env-root", str(tmp_path / "no")], "does not"),
    ]:
        assert main([*write, *argv]) == 2
        out, err = capsys.readouterr()
        assert (out, err.count("\n")) == ("", 1)
        assert err.startswith(PREFIX)
        assert message in err
        assert "Errno" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    assert blocker.read_text() == ""


@pytest.mark.parametrize("flag", ["--output", "--env-file", "--user-env"])
def test_an_empty_path_exits_2(tmp_path, capsys, flag):
    given = {"--output": [], "--env-file": [], "--user-env": ["--env-file", str(tmp_path)]}
    command = "write" if flag == "--output" else "show"
    with pytest.raises(SystemExit) as info:
        main([command, "--prefix", "P", *given[flag], flag, ""])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "the path is empty" in err
    assert "Traceback" not in err


def test_an_env_file_that_is_not_utf8_exits_2(tmp_path, capsys):
    good = tmp_path / "good.env"
    good.write_text("A=1\n")
    latin1 = tmp_path / "latin1.env"
    latin1.write_bytes(b"A=\xff\n")
    for extra in (
        ["--env-file", str(latin1)],
        ["--env-file", str(good), "--user-env", str(latin1)],
    ):
        assert main(["show", "--prefix", "P", *extra]) == 2
        out, err = capsys.readouterr()
        assert out == ""
        assert err == (
            f"{PREFIX}cannot read {latin1}: it is not UTF-8 text (byte 2); pass an env file "
            "written by `python -m substrax.runtime.managed_env write`, or convert it to UTF-8\n"
        )


def test_a_value_with_a_line_break_is_refused_and_what_is_written_reads_back(tmp_path, capsys):
    output = tmp_path / "e.env"
    write = ["write", "--prefix", "P", "--backend", "cpu", "--output", str(output)]
    for value, says in (
        ("1\nB=2", "holds a line break or NUL"),
        ("1\r", "holds a line break or NUL"),
        ("a\0b", "holds a line break or NUL"),
        ("x\udcffy", "holds text UTF-8 cannot encode"),  # a byte the terminal could not decode
    ):
        assert main([*write, "--set", f"A={value}"]) == 2
        err = capsys.readouterr().err
        assert says in err
        assert err.count("\n") == 1, err
        assert not output.exists()
    odd = 'it\'s "quoted" $HOME `x` \\ \t tab # not a comment'
    assert main([*write, "--set", f"A={odd}"]) == 0
    assert main(["show", "--json", "--prefix", "P", "--env-file", str(output)]) == 0
    assert json.loads(capsys.readouterr().out)["A"]["value"] == odd


def test_write_through_a_symbolic_link_keeps_the_link(tmp_path, capsys):
    target = tmp_path / "real" / "proj.env"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / ".proj.env"
    link.symlink_to(target)
    write = ["write", "--prefix", "P", "--backend", "cpu", "--output", str(link)]
    assert main([*write, "--env-root", str(tmp_path)]) == 0
    assert link.is_symlink()
    assert link.resolve() == target
    assert "export P_BACKEND=cpu" in target.read_text()
    assert main(["show", "--json", "--prefix", "P", "--env-file", str(link)]) == 0
    assert json.loads(capsys.readouterr().out)["P_ENV_ROOT"]["value"] == str(tmp_path)


def test_a_name_set_twice_exits_2_naming_it(tmp_path, capsys):
    output = tmp_path / "x.env"
    write = ["write", "--prefix", "P", "--backend", "cpu", "--output", str(output)]
    assert main([*write, "--set", "A=1", "--set", "B=2", "--set", "A=2"]) == 2
    assert capsys.readouterr().err == (
        f"{PREFIX}--set A is given twice (A='1' and A='2'); set each name once\n"
    )
    assert not output.exists()


@pytest.mark.parametrize(
    ("command", "flag"), [("show", "--env-file"), ("write", "--output"), ("write", "--prefix")]
)
def test_an_option_given_twice_exits_2_naming_it(tmp_path, capsys, command, flag):
    first, second = {"--prefix": ("P", "Q")}.get(flag, (str(tmp_path / "a"), str(tmp_path / "b")))
    output = str(tmp_path / "x.env")
    given = {"--env-file": [], "--output": ["--prefix", "P"], "--prefix": ["--output", output]}
    with pytest.raises(SystemExit) as info:
        main([command, *given[flag], flag, first, flag, second])
    assert info.value.code == 2
    assert f"{flag} is given twice ({first} and {second}); pass it once" in capsys.readouterr().err


def test_a_usage_error_from_argparse_exits_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--no-such-flag"])
    assert info.value.code == 2
    assert PREFIX in capsys.readouterr().err


@pytest.mark.usefixtures("child_processes")
def test_runs_as_a_module(tmp_path):
    output = tmp_path / "e.sh"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "substrax.runtime.managed_env",
            "write",
            "--prefix",
            "P",
            "--backend",
            "cpu",
            "--output",
            str(output),
        ],
        check=True,
        timeout=60,
    )
    assert f"export P_ENV_ROOT={tmp_path}" in output.read_text()


def test_the_deprecated_memory_fraction_is_written_under_its_current_name():
    # both were written, and jax refuses to start a GPU with both set
    env = managed_environment(
        "P", "cuda12", env_root="/p", overrides={"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9"}
    )
    assert env["XLA_CLIENT_MEM_FRACTION"] == "0.9"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in env["P_MANAGED_ENV_VARS"].split()
    both = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9", "XLA_CLIENT_MEM_FRACTION": "0.9"}
    assert managed_environment("P", "cuda12", env_root="/p", overrides=both) == env
    both["XLA_CLIENT_MEM_FRACTION"] = "0.5"
    with pytest.raises(ValueError, match=r"two values; pass only --set XLA_CLIENT_MEM_FRACTION"):
        managed_environment("P", "cuda12", env_root="/p", overrides=both)


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("P_BACKEND", "cuda12", "pass --backend instead"),
        ("P_ENV_ROOT", "/elsewhere", "pass --env-root instead"),
        ("P_MANAGED_ENV_VARS", "A", "the variables it manages"),
    ],
)
def test_a_set_that_contradicts_what_the_file_writes_itself_is_refused(name, value, says):
    # --set P_BACKEND=cuda12 with --backend cpu wrote a file that said cuda12 and ran on cpu
    with pytest.raises(ValueError, match=rf"--set {name}='{value}'.*{says}"):
        managed_environment("P", "cpu", env_root="/p", overrides={name: value})
    agreeing = {"P_BACKEND": "cpu", "P_ENV_ROOT": "/p"}
    assert managed_environment("P", "cpu", env_root="/p", overrides=agreeing)["P_BACKEND"] == "cpu"


@pytest.mark.parametrize(
    ("backend", "value", "refused"),
    [
        ("cpu", "cuda", True),  # was written: a cpu file running on cuda
        ("metal", "cpu", True),  # metal writes no JAX_PLATFORMS: the check skipped it
        ("cuda12", "cuda,cpu", False),  # a GPU with a CPU fallback (was refused)
        ("cuda12", "gpu", False),
        ("cpu", "CPU", False),
    ],
)
def test_a_set_jax_platforms_is_refused_only_without_the_backends_platform(backend, value, refused):
    if refused:
        with pytest.raises(
            ValueError, match=rf"JAX_PLATFORMS='{value}' names none of the platforms"
        ):
            managed_environment("P", backend, env_root="/p", overrides={"JAX_PLATFORMS": value})
    else:
        env = managed_environment("P", backend, env_root="/p", overrides={"JAX_PLATFORMS": value})
        assert env["JAX_PLATFORMS"] == value


def test_xla_flags_given_twice_are_written_as_xla_takes_them():
    """Second-pass finding: a flag repeated in --set XLA_FLAGS (XLA takes the last) failed with
    a traceback, exit 1, once the device counts were compared."""
    flags = "--xla_dump_to=/a --xla_dump_to=/b --xla_force_host_platform_device_count=4"
    twice = {"XLA_FLAGS": f"{flags} --xla_force_host_platform_device_count=8"}
    env = managed_environment(
        "P", "cpu", env_root="/p", overrides=twice | {"JAX_NUM_CPU_DEVICES": "8"}
    )
    assert env["XLA_FLAGS"] == twice["XLA_FLAGS"]


def test_sets_asking_for_two_cpu_device_counts_are_refused():
    """A hostile finding: the file was written; jax would take JAX_NUM_CPU_DEVICES alone."""
    two = {"XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_NUM_CPU_DEVICES": "8"}
    with pytest.raises(ValueError, match=r"JAX_NUM_CPU_DEVICES=8 .* two CPU device counts"):
        managed_environment("P", "cpu", env_root="/p", overrides=two)
    two["JAX_NUM_CPU_DEVICES"] = "4"
    assert (
        managed_environment("P", "cpu", env_root="/p", overrides=two)["JAX_NUM_CPU_DEVICES"] == "4"
    )
    assert managed_environment("P", "cpu", env_root="/p", overrides={"JAX_PLATFORMS": "cpu"})


def test_show_refuses_an_invalid_prefix_with_exit_2(tmp_path, capsys):
    env_file = tmp_path / "e.env"
    env_file.write_text("A=1\n")
    assert main(["show", "--prefix", "p", "--env-file", str(env_file)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(f"{PREFIX}prefix 'p' must be upper-case")


def test_an_empty_backend_is_refused(tmp_path, capsys):
    output = tmp_path / "e.env"
    with pytest.raises(SystemExit) as info:
        main(["write", "--prefix", "P", "--backend", "", "--output", str(output)])
    assert info.value.code == 2
    assert "invalid choice: ''" in capsys.readouterr().err
    with pytest.raises(ValueError, match="backend '' must be cpu, cuda12 or metal"):
        managed_environment("P", "", env_root="/p")  # type: ignore[arg-type]
    assert not output.exists()
