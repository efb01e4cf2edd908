import errno
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from substrax.checkpoint import OrbaxCheckpointStore
from substrax.checkpoint._cli import main


def _fill(directory):
    with OrbaxCheckpointStore(directory, max_to_keep=None) as store:
        for step, loss in [(1, 0.9), (2, 0.3), (3, 0.5), (4, 0.7)]:
            store.save(
                step,
                {"model": {"w": np.full((2, 3), step, np.float32)}, "data_iterator": {"i": step}},
                epoch=step,
                metrics={"loss": loss},
            )


def test_ls_show_verify(store_dir, capsys):
    _fill(store_dir)
    assert main(["ls", "--json", str(store_dir)]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(row["step"], row["metrics"]["loss"]) for row in listed] == [
        (1, 0.9),
        (2, 0.3),
        (3, 0.5),
        (4, 0.7),
    ]
    assert main(["ls", str(store_dir)]) == 0
    table = capsys.readouterr().out
    assert "loss=0.3" in table
    assert table.splitlines()[0].split()[:2] == ["step", "epoch"]
    assert main(["show", "--json", str(store_dir), "2"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["metadata"]["step"] == 2
    assert shown["items"]["model"] == [
        {"path": "w", "shape": [2, 3], "dtype": "float32", "nbytes": 24}
    ]
    assert main(["show", str(store_dir), "2"]) == 0
    assert "total bytes: 32" in capsys.readouterr().out
    assert main(["verify", "--json", str(store_dir)]) == 0
    assert all(row["ok"] for row in json.loads(capsys.readouterr().out))


def test_show_and_describe_name_typed_keys_and_none_leaves(store_dir, capsys):
    """Hostile finding: a key<fry> of shape () showed as its (2,) uint32 data, so a template
    built from the listing was refused; a None leaf was not listed."""
    import jax

    keys = jax.random.split(jax.random.key(1), 3)
    state = {"key": jax.random.key(1), "keys": keys, "none": None, "w": np.zeros(2, np.float32)}
    with OrbaxCheckpointStore(store_dir, async_save=False) as store:
        store.save(1, {"rng": state})
        described = {leaf.path: (leaf.shape, leaf.dtype) for leaf in store.describe(1)["rng"]}
    assert described == {
        "key": ((), "key<fry>"),
        "keys": ((3,), "key<fry>"),
        "none": (None, "None"),
        "w": ((2,), "float32"),
    }
    assert main(["show", "--json", str(store_dir), "1"]) == 0
    shown = json.loads(capsys.readouterr().out)["items"]["rng"]
    assert [(leaf["path"], leaf["dtype"]) for leaf in shown][:2] == [
        ("key", "key<fry>"),
        ("keys", "key<fry>"),
    ]


def test_verify_reports_a_broken_step(store_dir, capsys):
    _fill(store_dir)
    for path in (store_dir / "3" / "model").rglob("*"):
        if path.is_file() and path.stat().st_size > 0 and "METADATA" not in path.name:
            path.write_bytes(b"\0" * 3)
    assert main(["verify", "--json", str(store_dir)]) == 1
    rows = {row["step"]: row["ok"] for row in json.loads(capsys.readouterr().out)}
    assert rows == {1: True, 2: True, 3: False, 4: True}


def test_prune_by_retention(store_dir, capsys):
    _fill(store_dir)
    args = ["prune", "--json", str(store_dir), "--max-to-keep", "1", "--keep-best", "1"]
    assert main([*args, "--best-metric", "loss", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == [1, 3]
    assert main([*args, "--best-metric", "loss", "--best-mode", "max", "--dry-run"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted"] == [2, 3]
    assert main([*args, "--best-metric", "loss"]) == 0
    assert json.loads(capsys.readouterr().out)["kept"] == [2, 4]
    with OrbaxCheckpointStore(store_dir) as store:
        assert store.list_steps() == [2, 4]


@pytest.mark.usefixtures("child_processes")
def test_module_entry_point(store_dir):
    _fill(store_dir)
    result = subprocess.run(
        [sys.executable, "-m", "substrax.checkpoint", "ls", "--json", str(store_dir)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert len(json.loads(result.stdout)) == 4


PREFIX = "python -m substrax.checkpoint: error: "


def _error_line(capsys) -> str:
    """The one line a failed command printed on stderr (and nothing on stdout)."""
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith(PREFIX), err
    assert err.count("\n") == 1, err
    return err


def test_a_missing_or_file_store_is_exit_2_naming_the_path(tmp_path, capsys):
    missing, file = tmp_path / "no" / "such", tmp_path / "file"
    file.write_text("not a store")
    for path in (missing, file):
        for args in (["ls"], ["verify"], ["prune", "--dry-run"], ["prune"]):
            assert main([args[0], str(path), *args[1:]]) == 2
            assert str(path) in _error_line(capsys)
        assert main(["show", str(path), "1"]) == 2
        assert str(path) in _error_line(capsys)
    assert not missing.exists(), "prune created the directory it was asked to prune"
    for source in (missing, file):
        assert main(["upgrade", str(source), str(tmp_path / "upgraded")]) == 2
        assert str(source) in _error_line(capsys)
    assert not (tmp_path / "upgraded").exists()


def test_a_directory_that_holds_no_store_is_exit_2_and_left_alone(tmp_path, capsys):
    stray = tmp_path / "runs"  # a mistyped path: a folder, but not the store
    (stray / "logs").mkdir(parents=True)
    for args in (
        ["ls"],
        ["show", "1"],  # it said "no checkpoint step 1 in ... (steps held: none)"
        ["verify"],
        ["prune", "--max-to-keep", "1", "--dry-run"],
        ["prune", "--max-to-keep", "1"],
    ):
        assert main([args[0], str(stray), *args[1:]]) == 2
        assert f"{stray} holds no checkpoint store" in _error_line(capsys)
    assert sorted(p.name for p in stray.iterdir()) == ["logs"], "prune locked a stray folder"
    with OrbaxCheckpointStore(tmp_path / "empty"):  # a store with no step yet: listed, empty
        pass
    (tmp_path / "new").mkdir()  # nothing in it yet: a writer may be about to open it
    for directory in ("empty", "new"):
        assert main(["ls", "--json", str(tmp_path / directory)]) == 0
        assert json.loads(capsys.readouterr().out) == []


def test_a_bad_step_or_destination_is_exit_2(store_dir, tmp_path, capsys):
    _fill(store_dir)
    assert main(["show", str(store_dir), "7"]) == 2
    err = _error_line(capsys)
    assert "no checkpoint step 7" in err
    assert f"run `python -m substrax.checkpoint ls {store_dir}`" in err
    assert "list_steps()" not in err
    for step in ("x", "-1", "1.5"):
        with pytest.raises(SystemExit) as exit_:
            main(["show", str(store_dir), step])
        assert exit_.value.code == 2
        err = capsys.readouterr().err
        assert f"step takes an integer >= 0, not {step!r}" in err
        assert "Traceback" not in err
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("")
    assert main(["upgrade", str(store_dir), str(busy)]) == 2
    assert f"destination {busy} is not empty" in _error_line(capsys)
    for rules, named in [
        (["--max-to-keep", "0"], "max_to_keep=0 must be an integer >= 1"),
        (["--keep-best", "1"], "keep_best=1 needs best_metric="),
        (["--keep-every", "-2"], "keep_every=-2 must be an integer >= 1"),
    ]:
        assert main(["prune", str(store_dir), *rules]) == 2
        assert named in _error_line(capsys)
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        assert store.list_steps() == [1, 2, 3, 4]


def test_an_empty_path_is_exit_2_for_every_command(tmp_path, capsys):
    for argv in (
        ["ls", ""],
        ["show", "", "1"],
        ["verify", " "],
        ["prune", "", "--dry-run"],
        ["upgrade", "", str(tmp_path / "upgraded")],
        ["upgrade", str(tmp_path), ""],
    ):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        assert exit_.value.code == 2
        assert "the path is empty" in capsys.readouterr().err


def test_prune_refuses_a_store_another_process_writes(store_dir, capsys, writer_elsewhere):
    _fill(store_dir)
    with writer_elsewhere(store_dir) as writer:
        assert main(["prune", str(store_dir), "--max-to-keep", "1"]) == 1
        err = _error_line(capsys)
        assert f"pid {writer.pid}" in err
        assert "wait for the writer to finish, or add --dry-run" in err
        assert "read_only=True" not in err
        assert main(["prune", "--json", str(store_dir), "--max-to-keep", "1", "--dry-run"]) == 0
        assert json.loads(capsys.readouterr().out)["deleted"] == [1, 2, 3]
    with OrbaxCheckpointStore(store_dir) as store:
        assert store.list_steps() == [1, 2, 3, 4]


@pytest.mark.usefixtures("child_processes")
def test_readers_print_no_orbax_notices(store_dir):
    """A read-only open is asked for: orbax's warnings about it are not shown to the user."""
    _fill(store_dir)
    for command in ("ls", "verify"):
        done = subprocess.run(
            [sys.executable, "-m", "substrax.checkpoint", command, str(store_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "read only" not in done.stderr
        assert "save_interval_steps" not in done.stderr


def test_prune_refuses_a_best_metric_no_step_records(store_dir, capsys):
    """A misspelled --best-metric would protect nothing: refused, exit 2, nothing deleted."""
    _fill(store_dir)
    for dry_run in (["--dry-run"], []):
        argv = ["prune", str(store_dir), "--max-to-keep", "1", "--keep-best", "1"]
        assert main([*argv, "--best-metric", "lsos", "--best-mode", "max", *dry_run]) == 2
        err = _error_line(capsys)
        assert "--best-metric 'lsos'" in err
        assert "the steps record: loss" in err
    with OrbaxCheckpointStore(store_dir, read_only=True) as store:
        assert store.list_steps() == [1, 2, 3, 4]


def test_upgrade_into_a_file_is_exit_2(store_dir, tmp_path, capsys):
    _fill(store_dir)
    file = tmp_path / "afile"
    file.write_text("x")
    for destination in (file, file / "below"):
        assert main(["upgrade", str(store_dir), str(destination)]) == 2
        err = _error_line(capsys)
        assert f"destination {destination} is not a directory" in err
        assert "Errno" not in err
    assert file.read_text() == "x"


def test_ls_lists_the_readable_steps_and_marks_a_damaged_one(store_dir, capsys):
    _fill(store_dir)
    (store_dir / "3" / "metadata" / "metadata").write_text('{"x":')
    assert main(["ls", "--json", str(store_dir)]) == 1
    out, err = capsys.readouterr()
    rows = {row["step"]: row for row in json.loads(out)}
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[3]["readable"] is False
    assert "is not valid JSON" in rows[3]["error"]
    assert rows[2]["readable"] is True
    assert rows[2]["metrics"] == {"loss": 0.3}
    assert err.startswith(PREFIX)
    assert err.count("\n") == 1
    assert "step(s) 3" in err
    assert main(["ls", str(store_dir)]) == 1
    table = capsys.readouterr().out
    assert "UNREADABLE" in table
    assert "loss=0.9" in table


def test_a_store_this_user_may_not_read_is_exit_2_naming_the_path(
    store_dir, run_where_file_modes_apply
):
    _fill(store_dir)
    store_dir.chmod(0)
    try:
        result = run_where_file_modes_apply(
            [sys.executable, "-m", "substrax.checkpoint", "ls", str(store_dir)]
        )
    finally:
        store_dir.chmod(0o755)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"permission denied on {store_dir}" in lines[0]
    assert "chmod" in lines[0]
    assert "Errno" not in lines[0]


def _plain_orbax_directory(root):
    """What orbax's own CheckpointManager writes: step folders without a substrax record."""
    import orbax.checkpoint as ocp

    options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False)
    with ocp.CheckpointManager(root, options=options) as manager:
        manager.save(0, args=ocp.args.StandardSave({"w": np.ones(3)}))
    return root


def test_upgrade_and_prune_refuse_what_holds_no_store_and_create_nothing(
    store_dir, tmp_path, capsys
):
    """Hostile finding: `upgrade` of a plain orbax directory, of one step's folder or of other
    files said "upgraded 0 step(s)" and made an empty store; `prune` locked an empty folder."""
    _fill(store_dir)
    others = tmp_path / "others"
    others.mkdir()
    (others / "notes.txt").write_text("x")
    sources = [_plain_orbax_directory(tmp_path / "orbax"), store_dir / "3", others]
    for source in sources:
        assert main(["upgrade", str(source), str(tmp_path / "new")]) == 2
        assert f"{source} holds no checkpoint store" in _error_line(capsys)
    assert (
        "its folders named like steps (0)"
        in (
            main(["ls", str(tmp_path / "orbax")]),
            _error_line(capsys),
        )[1]
    )
    empty = tmp_path / "empty"
    empty.mkdir()
    for dry_run in (["--dry-run"], []):
        assert main(["prune", str(empty), "--max-to-keep", "1", *dry_run]) == 2
        assert f"{empty} is empty: it holds no checkpoint store" in _error_line(capsys)
    assert main(["upgrade", str(empty), str(tmp_path / "new")]) == 2
    assert f"{empty} is empty" in _error_line(capsys)
    assert not (tmp_path / "new").exists()
    assert not any(empty.iterdir()), "prune made an empty folder a store"
    assert not [path for path in tmp_path.iterdir() if ".upgrading-" in path.name]


def _read_only_file_system(monkeypatch, root):
    """Every file or folder created under ``root`` fails as on a read-only mount (EROFS)."""
    real_open, real_mkdir = os.open, pathlib.Path.mkdir

    def refused(path):
        return OSError(errno.EROFS, "Read-only file system", str(path))

    def open_(path, flags, *args, **kwargs):
        if str(path).startswith(str(root)) and flags & os.O_CREAT:
            raise refused(path)
        return real_open(path, flags, *args, **kwargs)

    def mkdir(self, *args, **kwargs):
        if str(self).startswith(str(root)) and not self.is_dir():
            raise refused(self)
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)


def test_a_read_only_file_system_is_exit_2_naming_the_path(
    store_dir, tmp_path, capsys, monkeypatch
):
    """Hostile finding: `prune` and `upgrade` on a read-only mount printed a bare
    "[Errno 30] Read-only file system: ..." and exited 1."""
    _fill(store_dir)
    (store_dir / ".substrax-writer.lock").unlink()
    _read_only_file_system(monkeypatch, tmp_path)
    assert main(["prune", str(store_dir), "--max-to-keep", "1"]) == 2
    err = _error_line(capsys)
    assert f"{store_dir / '.substrax-writer.lock'} is on a read-only file system" in err
    assert "add --dry-run" in err
    assert "Errno" not in err
    assert main(["prune", str(store_dir), "--max-to-keep", "1", "--dry-run"]) == 0
    capsys.readouterr()
    assert main(["upgrade", str(store_dir), str(tmp_path / "ro" / "sub" / "new")]) == 2
    err = _error_line(capsys)
    assert f"error: {tmp_path / 'ro' / 'sub'}" in err
    assert "is on a read-only file system" in err
    assert "upgrade into a destination on a writable file system" in err


def _module(*args, env=None, **options):
    return subprocess.run(
        [sys.executable, "-m", "substrax.checkpoint", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, **(env or {})},
        **options,
    )


@pytest.mark.usefixtures("child_processes")
def test_the_command_line_reads_on_the_cpu_whatever_jax_platforms_says(store_dir, tmp_path):
    """Hostile finding: with a JAX_PLATFORMS the machine lacks, `verify` reported every step
    FAILED (a backend error, not the step's files), and `show` and `upgrade` printed tracebacks."""
    _fill(store_dir)
    bogus = {"JAX_PLATFORMS": "bogus"}
    verified = _module("verify", "--json", store_dir, env=bogus)
    assert verified.returncode == 0, verified.stdout + verified.stderr
    assert all(row["status"] == "ok" for row in json.loads(verified.stdout))
    shown = _module("show", store_dir, 2, env=bogus)
    assert (shown.returncode, shown.stderr) == (0, "")
    upgraded = _module("upgrade", store_dir, tmp_path / "new", env=bogus)
    assert (upgraded.returncode, upgraded.stderr) == (0, "")


@pytest.mark.usefixtures("child_processes")
def test_a_path_the_terminal_cannot_show_fails_no_command(store_dir, tmp_path):
    """Hostile finding: with PYTHONIOENCODING=ascii an upgrade into "é-new" completed, then
    exited 1 on printing its path (and a retry was refused: the destination was not empty)."""
    _fill(store_dir)
    destination = tmp_path / "sp ace" / "é-new"
    done = _module("upgrade", store_dir, destination, env={"PYTHONIOENCODING": "ascii"})
    assert (done.returncode, done.stderr) == (0, "")
    assert "\\xe9-new" in done.stdout
    with OrbaxCheckpointStore(destination, read_only=True) as store:
        assert store.list_steps() == [1, 2, 3, 4]
    missing = _module("show", destination, 9, env={"PYTHONIOENCODING": "ascii"})
    assert missing.returncode == 2
    assert "\\xe9-new (steps held: 1, 2, 3, 4)" in missing.stderr


@pytest.mark.usefixtures("child_processes")
def test_folders_named_like_steps_are_summed_up_in_one_line(store_dir, tmp_path):
    """Hostile finding: each numbered folder that is no step printed its own raw
    "WARNING:substrax.checkpoint._steps:..." line, at every command."""
    numbered = tmp_path / "numbered"
    for name in ("1", "2", "3"):
        (numbered / name).mkdir(parents=True)
    refused = _module("ls", numbered)
    assert refused.returncode == 2
    [line] = refused.stderr.splitlines()
    assert "its folders named like steps (1, 2, 3) hold no step's metadata record" in line
    _fill(store_dir)
    (store_dir / "77" / "results").mkdir(parents=True)
    listed = _module("verify", store_dir)
    assert listed.returncode == 0
    [line] = listed.stderr.splitlines()
    assert line.startswith("python -m substrax.checkpoint: warning: the folders named like steps")
    assert "(77)" in line


def test_upgrading_a_store_of_no_step_says_none(tmp_path, capsys):
    """A third pass: a store holding only its lock upgraded with "...: " and nothing after."""
    OrbaxCheckpointStore(tmp_path / "empty").close()
    assert main(["upgrade", str(tmp_path / "empty"), str(tmp_path / "copy")]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"to {tmp_path / 'copy'}: none")
