import logging
import os
import tempfile
from pathlib import Path

import pytest

from substrax.artifacts import OUTPUT_DIR_ENV, OutputLocation, resolve_output_dir


def test_explicit_wins_and_is_resolved(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    location = resolve_output_dir("run", explicit=Path("out/x"), env={OUTPUT_DIR_ENV: "/elsewhere"})
    assert location == OutputLocation(path=tmp_path / "out" / "x", source="argument")
    assert location.path.is_dir()


def test_environment_variable(tmp_path):
    location = resolve_output_dir("a/b", env={OUTPUT_DIR_ENV: str(tmp_path)})
    assert location == OutputLocation(path=tmp_path / "a" / "b", source="environment")
    assert location.path.is_dir()


def test_environment_defaults_to_os_environ(tmp_path, monkeypatch):
    monkeypatch.setenv(OUTPUT_DIR_ENV, str(tmp_path))
    assert resolve_output_dir("x").path == tmp_path / "x"


def test_relative_environment_variable_is_refused():
    with pytest.raises(ValueError, match="must be an absolute path"):
        resolve_output_dir("x", env={OUTPUT_DIR_ENV: "relative/dir"})


def test_run_default_is_one_temp_dir_per_process_never_the_cwd(tmp_path, monkeypatch):
    temp_root, work = tmp_path / "tmp", tmp_path / "work"
    temp_root.mkdir()
    work.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp_root))  # its run directory goes here
    monkeypatch.chdir(work)
    first = resolve_output_dir("one", env={})
    second = resolve_output_dir("two", env={})
    assert first.source == second.source == "run_default"
    assert first.path.parent == second.path.parent
    assert first.path.parent.name.startswith("avitai-run-")
    assert first.path.parent.parent == temp_root
    assert list(work.iterdir()) == []


@pytest.mark.parametrize("name", ["", "  ", "../up", "a/../../b", "/abs"])
def test_bad_names(name):
    with pytest.raises(ValueError, match="output name"):
        resolve_output_dir(name, env={})


@pytest.mark.parametrize(("name", "hint"), [(Path("p"), "explicit="), (3, ""), (None, "")])
def test_a_name_that_is_no_str_is_refused_by_type(name, hint):
    with pytest.raises(TypeError, match="output name must be a str") as error:
        resolve_output_dir(name, env={})
    assert hint in str(error.value)


@pytest.mark.parametrize("name", [".", "./", "./."])
def test_the_output_root_itself_is_refused_before_anything_is_made(name, tmp_path):
    root = tmp_path / "outputs"
    with pytest.raises(ValueError, match=r"names no directory of its own") as error:
        resolve_output_dir(name, env={OUTPUT_DIR_ENV: str(root)})
    assert repr(name) in str(error.value)
    assert "resolve_output_dir('fno_darcy')" in str(error.value)
    assert not root.exists()


def test_each_call_logs(tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="substrax.artifacts"):
        resolve_output_dir("logged", env={OUTPUT_DIR_ENV: str(tmp_path)})
    assert "environment" in caplog.text
    assert str(tmp_path / "logged") in caplog.text


def test_output_location_refuses_an_unknown_source_naming_the_allowed_ones():
    match = r"source='cli' must be one of \('argument', 'environment', 'run_default'\)"
    with pytest.raises(ValueError, match=match):
        OutputLocation(path=Path("/tmp/x"), source="cli")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"source must be one of .*, not NoneType None"):
        OutputLocation(path=Path("/tmp/x"), source=None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"path must be a pathlib.Path, not str '/tmp/x'"):
        OutputLocation(path="/tmp/x", source="argument")  # type: ignore[arg-type]


@pytest.mark.parametrize("explicit", ["", " "])
def test_an_empty_explicit_directory_is_refused_not_the_working_directory(explicit):
    with pytest.raises(ValueError, match=r"explicit=.* names no directory"):
        resolve_output_dir("run", explicit=explicit, env={})


def test_a_file_where_the_directory_goes_is_refused_naming_it(tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    with pytest.raises(ValueError, match=r"explicit='.*/f': '.*/f' is a file, not a directory"):
        resolve_output_dir("run", explicit=blocker, env={})
    with pytest.raises(
        ValueError, match=r"explicit='.*/f/deeper' leads to .* but '.*/f' is a file"
    ):
        resolve_output_dir("run", explicit=blocker / "deeper", env={})
    match = rf"{OUTPUT_DIR_ENV}='.*/f' with output name 'r' leads to '.*/f/r', but '.*/f' is a file"
    with pytest.raises(ValueError, match=match):
        resolve_output_dir("r", env={OUTPUT_DIR_ENV: str(blocker)})
    assert blocker.read_text() == "x"


def test_a_dangling_link_where_the_directory_goes_is_refused_as_one(tmp_path):
    link = tmp_path / "dangling"
    link.symlink_to(tmp_path / "nowhere")
    match = (
        rf"{OUTPUT_DIR_ENV}='.*/dangling' with output name 'run' leads to '.*/dangling/run', but "
        r"'.*/dangling' is a symbolic link to '.*/nowhere', a path that does not exist"
    )
    with pytest.raises(ValueError, match=match):
        resolve_output_dir("run", env={OUTPUT_DIR_ENV: str(link)})
    with pytest.raises(ValueError, match=r"name 'dangling': '.*/dangling' is a symbolic link to"):
        resolve_output_dir("dangling", env={OUTPUT_DIR_ENV: str(tmp_path)})
    assert not (tmp_path / "nowhere").exists()


def test_an_explicit_dangling_link_is_refused_and_its_target_never_created(tmp_path):
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "unmounted" / "runs")
    match = r"explicit='.*/runs': '.*/runs' is a symbolic link to '.*/unmounted/runs', a path"
    with pytest.raises(ValueError, match=match):
        resolve_output_dir("demo", explicit=link, env={})
    with pytest.raises(ValueError, match=r"leads to '.*/runs/deeper', but '.*/runs' is a symbolic"):
        resolve_output_dir("demo", explicit=link / "deeper", env={})
    assert not (tmp_path / "unmounted").exists()


def test_a_symbolic_link_loop_is_refused_naming_it(tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(
        ValueError, match=r"explicit='.*/loop': '.*/loop' is a symbolic link that loops"
    ):
        resolve_output_dir("demo", explicit=loop, env={})
    with pytest.raises(ValueError, match=r"'.*/loop' is a symbolic link that loops back on itself"):
        resolve_output_dir("demo", env={OUTPUT_DIR_ENV: str(loop)})


def test_a_nul_character_is_refused_naming_the_value(tmp_path):
    with pytest.raises(ValueError, match=r"output name 'a\\x00b' holds a NUL character"):
        resolve_output_dir("a\0b", env={OUTPUT_DIR_ENV: str(tmp_path)})
    with pytest.raises(ValueError, match=r"explicit='.*\\x00x' holds a NUL character"):
        resolve_output_dir("run", explicit=f"{tmp_path}/\0x", env={})
    with pytest.raises(ValueError, match=rf"{OUTPUT_DIR_ENV}='.*\\x00x' holds a NUL character"):
        resolve_output_dir("run", env={OUTPUT_DIR_ENV: f"{tmp_path}/\0x"})
    assert list(tmp_path.iterdir()) == []


def test_a_forked_child_gets_a_run_directory_of_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # the run directories go here
    parent = resolve_output_dir("one", env={}).path.parent
    assert resolve_output_dir("two", env={}).path.parent == parent
    monkeypatch.setattr(os, "getpid", lambda: -12345)  # what a forked child sees: another pid
    child = resolve_output_dir("one", env={}).path.parent
    assert child != parent
    assert child.name.startswith("avitai-run-")
    assert parent.parent == child.parent == tmp_path


def test_an_output_location_is_built_by_position_as_in_0_1_22(tmp_path):
    assert OutputLocation(tmp_path, "argument") == OutputLocation(path=tmp_path, source="argument")
