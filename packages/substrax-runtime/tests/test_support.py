"""substrax.support: the shared atomic write, optional imports, CLI convention, tables, numbers."""

import argparse
import io
import os
import re
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from substrax.support import (
    EXIT_BROKEN_PIPE,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    CommandFailedError,
    MissingExtraError,
    Mode,
    UsageError,
    _atomic,
    check_float,
    check_int,
    check_seconds,
    emit,
    escape_unshowable_output,
    format_table,
    int_argument,
    print_table,
    require,
    run_command,
    write_atomically,
)


def test_output_an_ascii_terminal_cannot_show_is_escaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A hostile review: a command that did its work exited 1 printing a path with an "é" to
    an ASCII terminal (``'ascii' codec can't encode``)."""
    terminal = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    monkeypatch.setattr(sys, "stdout", terminal)
    monkeypatch.setattr(sys, "stderr", None)  # closed: left alone
    escape_unshowable_output()
    emit({}, "upgraded caf\u00e9", as_json=False)
    terminal.flush()
    assert terminal.buffer.getvalue() == b"upgraded caf\\xe9\n"  # pyright: ignore[reportAttributeAccessIssue]


def test_emit_without_a_stdout_shows_nothing_and_raises_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A hostile review: a CLI run with its stdout closed (``>&-``) did its work, then printed a
    traceback (``'NoneType' object has no attribute 'write'``) and exited 1."""
    monkeypatch.setattr(sys, "stdout", None)
    emit({"page": "p.html"}, "p.html", as_json=False)
    emit({"page": "p.html"}, "p.html", as_json=True)


def test_emit_writes_strict_json_that_any_parser_reads(capsys: pytest.CaptureFixture[str]) -> None:
    """Hostile finding: `run --json` printed NaN and Infinity, which a strict parser refuses."""
    import json

    emit({"val_loss": float("nan"), "rows": [float("inf"), -float("inf"), 0.5]}, "", as_json=True)

    def refuse(constant: str) -> None:
        raise ValueError(constant)

    printed = json.loads(capsys.readouterr().out, parse_constant=refuse)
    assert printed == {"val_loss": "NaN", "rows": ["Infinity", "-Infinity", 0.5]}


def test_write_atomically_replaces_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "state.json"
    write_atomically(target, "old")
    write_atomically(target, b"new")
    assert target.read_text() == "new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]


def test_write_atomically_through_a_link_replaces_its_target_and_keeps_the_link(
    tmp_path: Path,
) -> None:
    real, links = tmp_path / "real" / "state.json", tmp_path / "links"
    real.parent.mkdir()
    links.mkdir()
    real.write_text("old")
    (links / "state.json").symlink_to(real)
    write_atomically(links / "state.json", "new")
    assert (links / "state.json").is_symlink()
    assert real.read_text() == "new"
    assert sorted(p.name for p in real.parent.iterdir()) == ["state.json"]
    (tmp_path / "dir_link").symlink_to(real.parent, target_is_directory=True)
    write_atomically(tmp_path / "dir_link" / "state.json", "newer")  # a link above the file
    assert real.read_text() == "newer"
    (links / "dangling.json").symlink_to(tmp_path / "made.json")
    write_atomically(links / "dangling.json", "x")
    assert (links / "dangling.json").is_symlink()
    assert (tmp_path / "made.json").read_text() == "x"


def test_permissions_follow_the_umask_and_survive_a_rewrite(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomically(tmp_path / "new.txt", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o644
    (tmp_path / "new.txt").chmod(0o640)
    write_atomically(tmp_path / "new.txt", "y")
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640


def test_readers_never_see_a_partial_file(tmp_path: Path) -> None:
    target = tmp_path / "big.txt"
    contents = ["a" * 1_000_000, "b" * 2_000_000]
    write_atomically(target, contents[0])
    seen: set[str] = set()
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            text = target.read_text()
            seen.add(text[:1] + str(len(text)))

    reader = threading.Thread(target=read)
    reader.start()
    for i in range(30):
        write_atomically(target, contents[i % 2])
    stop.set()
    reader.join()
    assert seen <= {"a1000000", "b2000000"}


def test_a_writer_killed_mid_write_leaves_a_whole_file(
    tmp_path: Path, child_processes: None, wall_clock: Any
) -> None:
    target = tmp_path / "state.txt"
    write_atomically(target, "committed")
    code = (
        "import sys\n"
        "from substrax.support import write_atomically\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    write_atomically(sys.argv[1], 'x' * 8_000_000)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", code, str(target)], stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
        wall_clock.sleep(1.0)  # some writes done, one in flight
        child.kill()
        child.wait(timeout=10)
    assert target.read_text() in {"committed", "x" * 8_000_000}


def _temporary_of(target: Path, writer: str, *, age: float) -> Path:
    """A temporary file of ``target`` named for ``writer``, last touched ``age`` seconds ago."""
    leftover = target.with_name(f".{target.name}.{writer}00.tmp")
    leftover.write_text("x" * 1000)
    when = time.time() - age
    os.utime(leftover, (when, when))
    return leftover


def test_a_temporary_named_for_the_writing_process_and_host(tmp_path: Path) -> None:
    fd, temporary = _atomic._temporary_beside(tmp_path / "state.json")
    os.close(fd)
    digits = temporary.name.removeprefix(".state.json.").removesuffix(".tmp")
    assert re.fullmatch(r"[0-9a-f]{12}", digits)  # the length and alphabet other parts expect
    assert int(digits[:6], 16) == os.getpid()
    assert digits[:10] == _atomic._writer_tag(os.getpid())


def test_a_later_write_removes_what_a_dead_writer_left(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    gone = 0xFFFFFE  # past any pid_max: no such process
    dead = _temporary_of(target, _atomic._writer_tag(gone), age=3600)
    write_atomically(target, "new")
    assert target.read_text() == "new"
    assert not dead.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]


def test_a_temporary_that_may_still_be_written_is_kept(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    gone = 0xFFFFFE
    elsewhere = f"{gone:06x}{'0000' if _atomic._host_tag() != '0000' else '0001'}"
    kept = [
        _temporary_of(target, _atomic._writer_tag(os.getppid()), age=3600),  # a live writer
        _temporary_of(target, elsewhere, age=3600),  # a writer on another host
        _temporary_of(target, _atomic._writer_tag(gone), age=1),  # just written
        _temporary_of(tmp_path / "other.json", _atomic._writer_tag(gone), age=3600),
    ]
    write_atomically(target, "new")
    assert all(path.exists() for path in kept)


def test_every_temporary_name_taken_is_an_error_not_a_hang(tmp_path: Path) -> None:
    target = tmp_path / "state.json"
    writer = _atomic._writer_tag(os.getpid())
    for n in range(256):
        target.with_name(f".state.json.{writer}{n:02x}.tmp").write_text("")
    with pytest.raises(ValueError, match=r"temporary names .* are all taken; remove"):
        write_atomically(target, "x")
    assert not target.exists()


def test_a_failed_write_keeps_the_old_content_and_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "state.txt"
    write_atomically(target, "old")
    with pytest.raises(TypeError):
        write_atomically(target, 42)  # pyright: ignore[reportArgumentType]
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.txt"]


def test_a_file_in_the_way_of_the_directory_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("")
    with pytest.raises((FileExistsError, NotADirectoryError)):
        write_atomically(tmp_path / "blocker" / "state.txt", "x")


def test_require_names_both_extras() -> None:
    with pytest.raises(MissingExtraError) as caught:
        require("no_such_sdk.sub", who="MyLogger", distribution="substrax-tracking", extra="x")
    assert isinstance(caught.value, ImportError)
    assert caught.value.extra == "x"
    assert "MyLogger needs no_such_sdk" in str(caught.value)
    assert "substrax[x]" in str(caught.value)
    assert "substrax-tracking[x]" in str(caught.value)


def test_run_command_maps_errors_to_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    def raising(error: BaseException) -> Callable[[], int]:
        def command() -> int:
            raise error

        return command

    assert run_command("p", raising(UsageError("bad path"))) == EXIT_USAGE
    assert run_command("p", raising(CommandFailedError("it broke"))) == EXIT_FAILED
    assert run_command("p", raising(KeyError("no job 'x'")), usage=(KeyError,)) == EXIT_USAGE
    assert run_command("p", raising(OSError("disk")), failures=(OSError,)) == EXIT_FAILED
    assert run_command("p", raising(KeyboardInterrupt())) == EXIT_INTERRUPTED == 130
    assert capsys.readouterr().err.splitlines() == [
        "p: error: bad path",
        "p: error: it broke",
        "p: error: no job 'x'",
        "p: error: disk",
        "p: interrupted",
    ]
    with pytest.raises(ZeroDivisionError):  # a bug keeps its traceback
        run_command("p", raising(ZeroDivisionError()))


def test_a_broken_pipe_is_quiet_only_when_stdout_s_reader_went(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A hostile review: `| head` ended a command with "[Errno 32] Broken pipe", exit 1; it
    ends quietly with 141, as a shell has it. A second pass: a broken pipe to another file (a
    socket, a child) is still its error line, not a silent 141."""
    broken = BrokenPipeError(32, "Broken pipe")

    def command() -> int:
        raise broken

    class Gone(io.StringIO):  # a stdout whose reader went: its buffer cannot be written
        def flush(self) -> None:
            raise BrokenPipeError(32, "Broken pipe")

    assert run_command("p", command, failures=(OSError,)) == EXIT_FAILED  # stdout is fine
    assert capsys.readouterr().err == "p: error: [Errno 32] Broken pipe\n"
    monkeypatch.setattr(sys, "stdout", Gone())
    assert run_command("p", command, failures=(OSError,)) == EXIT_BROKEN_PIPE == 141
    assert capsys.readouterr().err == ""


def test_a_stderr_that_is_gone_still_gets_the_exit_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """A third pass: with stderr a pipe whose reader went, writing the error line raised out
    of run_command, and a usage error (2) exited 1."""

    class Gone(io.StringIO):
        def write(self, text: str) -> int:  # noqa: ARG002 - every write fails
            raise BrokenPipeError(32, "Broken pipe")

    def command() -> int:
        raise UsageError("no run 'nope'")

    monkeypatch.setattr(sys, "stderr", Gone())
    assert run_command("p", command) == EXIT_USAGE


def test_int_argument_takes_whole_numbers_within_its_bounds() -> None:
    seed = int_argument("--seed", minimum=1, maximum=9)
    assert (seed("1"), seed("9")) == (1, 9)
    for text in ("0", "10", "nine", "2.0"):
        with pytest.raises(argparse.ArgumentTypeError) as caught:
            seed(text)
        assert str(caught.value) == f"--seed takes an integer from 1 to 9, not {text!r}"
    assert int_argument("step")("1" + "0" * 20) == 10**20  # no maximum: none
    with pytest.raises(ValueError, match="maximum=0 is below minimum=1"):
        int_argument("--seed", minimum=1, maximum=0)


def test_tables_in_a_pipe_are_plain_text() -> None:
    stream = io.StringIO()
    print_table(["a", "bb"], [[1, None]], stream=stream)
    assert stream.getvalue() == format_table(["a", "bb"], [[1, None]]) + "\n"
    assert stream.getvalue().splitlines() == ["a  bb", "-  --", "1  -"]


@pytest.mark.parametrize(
    ("value", "error"), [(True, TypeError), (1.0, TypeError), ("3", TypeError), (0, ValueError)]
)
def test_check_int_refuses(value: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="n="):
        check_int("n", value, minimum=1)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, 2.0])
def test_check_float_refuses_non_finite_and_out_of_bounds(value: float) -> None:
    with pytest.raises(ValueError, match="lr="):
        check_float("lr", value, minimum=0, maximum=1)


def test_check_float_refuses_an_int_too_large_for_a_float_naming_it() -> None:
    # float(10**400) raised a bare OverflowError
    with pytest.raises(ValueError, match=r"^lr=<an int of about 401 digits> must be a finite"):
        check_float("lr", 10**400, minimum=0)
    with pytest.raises(ValueError, match=r"lr=<an int of about 5001 digits>"):
        check_float("lr", -(10**5000))


def test_write_atomically_refuses_an_empty_path_naming_it() -> None:
    # realpath("") is the working directory: it failed with IsADirectoryError
    with pytest.raises(ValueError, match=r"path='' names no file"):
        write_atomically("", "x")


def test_check_float_takes_numpy_scalars_only_when_real() -> None:
    assert check_float("lr", np.float32(0.5), minimum=0) == 0.5
    with pytest.raises(TypeError, match="not str"):
        check_float("lr", "0.5")
    assert check_seconds("t", 0) == 0.0
    with pytest.raises(ValueError, match="> 0"):
        check_seconds("t", 0, positive=True)


def test_mode_accepts_strings_and_refuses_others() -> None:
    assert Mode("min") is Mode.MIN
    assert Mode.MAX.better(2, 1)
    assert not Mode.MAX.better(1, 1)
    with pytest.raises(ValueError, match="'mni'"):
        Mode("mni")


@pytest.mark.usefixtures("child_processes")
def test_support_imports_no_jax() -> None:
    code = "import sys, substrax.support; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
