"""run_example: one example per interpreter, outputs redirected, main()'s result read back."""

import textwrap
from pathlib import Path

import pytest

from substrax.testing import (
    ChildFailedError,
    ExampleNotFoundError,
    ExampleTimeoutError,
    run_example,
)


EXAMPLE = textwrap.dedent(
    """
    import json
    import os
    from pathlib import Path

    import numpy as np


    def main():
        out = Path(os.environ["AVITAI_OUTPUT_DIR"])
        (out / "result.txt").write_text("42")
        return {"loss": np.float32(0.5), "steps": np.array(3), "shape": (2, 3), "cwd": os.getcwd()}


    if __name__ == "__main__":
        print(json.dumps({"script": True, "cwd": os.getcwd()}))
    """
)


@pytest.fixture
def repo(tmp_path) -> Path:
    root = tmp_path / "repo"
    (root / "examples").mkdir(parents=True)
    (root / "examples" / "train.py").write_text(EXAMPLE)
    return root


def _run(repo: Path, tmp_path: Path, name: str, text: str | None = None, **options):
    """Run ``examples/<name>`` (first written with ``text``, if given); main() unless told not."""
    if text is not None:
        (repo / "examples" / name).write_text(text)
    options = {"output_dir": tmp_path / "out", "timeout": 60, "call_main": True, **options}
    return run_example(Path("examples") / name, repo_root=repo, **options)


@pytest.mark.usefixtures("child_processes")
def test_call_main_returns_the_json_summary_and_writes_outside_the_repo(repo, tmp_path):
    out = tmp_path / "out"
    run = run_example(
        Path("examples/train.py"), repo_root=repo, output_dir=out, timeout=60, call_main=True
    ).check()
    assert run.summary == {"loss": 0.5, "steps": 3, "shape": [2, 3], "cwd": str(repo)}
    assert run.path == repo / "examples" / "train.py"
    assert run.output_dir == out.resolve()
    assert (out / "result.txt").read_text() == "42"
    assert sorted(p.name for p in (repo / "examples").iterdir()) == ["train.py"]
    # paths given as text, as 0.1.22's users may pass them
    again = run_example(
        "examples/train.py", repo_root=str(repo), output_dir=str(out), timeout=60, call_main=True
    ).check()
    assert (again.summary, again.path, again.output_dir) == (run.summary, run.path, run.output_dir)


@pytest.mark.usefixtures("child_processes")
def test_without_call_main_the_file_runs_as_a_script(repo, tmp_path):
    run = run_example(
        repo / "examples" / "train.py",
        repo_root=repo,
        output_dir=tmp_path / "out",
        timeout=60,
        call_main=False,
    )
    assert run.summary is None
    assert run.check().result.last_json() == {"script": True, "cwd": str(repo)}


@pytest.mark.usefixtures("child_processes")
def test_a_failing_example_is_returned_and_check_raises(repo, tmp_path):
    run = _run(repo, tmp_path, "broken.py", "def main():\n    raise RuntimeError('nope')\n")
    assert run.summary is None
    with pytest.raises(ChildFailedError, match="RuntimeError: nope"):
        run.check()


@pytest.mark.usefixtures("child_processes")
def test_an_example_that_prints_the_marker_and_exits_before_main_returns_has_no_summary(
    repo, tmp_path
):
    # hostile finding: printing the marker line and a JSON line, then os._exit(0), faked main()'s
    # result; each run's marker now ends with a token the example never sees
    text = textwrap.dedent(
        """
        import os


        def main():
            print("substrax.testing: main() returned:")
            print('{"final_loss": 0.0}', flush=True)
            os._exit(0)
        """
    )
    with pytest.raises(ValueError, match="exited 0 but printed no summary"):
        _run(repo, tmp_path, "faked.py", text)


@pytest.mark.usefixtures("child_processes")
def test_an_example_that_leaves_stdout_replaced_is_told_so(repo, tmp_path):
    """Hostile finding: the message pointed at an early exit only."""
    text = "import io\nimport sys\n\n\ndef main():\n    sys.stdout = io.StringIO()\n"
    with pytest.raises(ValueError, match=r"or replace sys\.stdout .* and leave it replaced"):
        _run(repo, tmp_path, "quiet.py", text)


@pytest.mark.usefixtures("child_processes")
def test_a_missing_main_is_named(repo, tmp_path):
    run = _run(repo, tmp_path, "no_main.py", "x = 1\n")
    assert "defines no main()" in run.result.stderr


@pytest.mark.usefixtures("child_processes")
def test_a_slow_example_raises_a_timeout_with_its_stderr(repo, tmp_path):
    slow = "import sys, time\nprint('warming up', file=sys.stderr, flush=True)\ntime.sleep(30)\n"
    with pytest.raises(ExampleTimeoutError) as caught:
        _run(repo, tmp_path, "slow.py", slow, timeout=1.5, call_main=False)
    assert caught.value.path == repo / "examples" / "slow.py"
    assert caught.value.timeout == 1.5
    assert "warming up" in caught.value.stderr_tail


def test_a_conflicting_output_dir_in_env_is_refused(repo, tmp_path):
    with pytest.raises(ValueError, match="AVITAI_OUTPUT_DIR"):
        _run(repo, tmp_path, "train.py", env={"AVITAI_OUTPUT_DIR": str(tmp_path / "elsewhere")})


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"timeout": -1}, ValueError, r"timeout=-1 must be a finite number of seconds > 0"),
        ({"timeout": 0}, ValueError, r"timeout=0 must be a finite number of seconds > 0"),
        ({"timeout": "60"}, TypeError, r"timeout='60' must be a finite number"),
        ({"call_main": "no"}, TypeError, r"call_main must be True or False, not str 'no'"),
        ({"call_main": 1}, TypeError, r"call_main must be True or False, not int 1"),
    ],
)
def test_a_bad_timeout_or_call_main_is_refused_before_output_dir_is_made(
    repo, tmp_path, options, error, match
):
    out = tmp_path / "not_made"
    with pytest.raises(error, match=match):
        _run(repo, tmp_path, "train.py", output_dir=out, **options)
    assert not out.exists()


def test_a_missing_example_is_refused(repo, tmp_path):
    with pytest.raises(ExampleNotFoundError, match=r"missing\.py") as caught:
        _run(repo, tmp_path, "missing.py", output_dir=tmp_path)
    assert isinstance(caught.value, FileNotFoundError)
    assert caught.value.path == (repo / "examples" / "missing.py").resolve()


PATHS_EXAMPLE = textwrap.dedent(
    """
    import importlib.util
    import sys


    def main():
        return {
            "argv": sys.argv,
            "sibling": importlib.util.find_spec("sibling") is not None,
            "at_root": importlib.util.find_spec("at_root") is not None,
        }
    """
)


@pytest.fixture
def paths_repo(repo) -> Path:
    """A repository whose example can import a module beside it and one at the root, if let."""
    (repo / "examples" / "sibling.py").write_text("")
    (repo / "at_root.py").write_text("")
    return repo


@pytest.mark.usefixtures("child_processes")
def test_call_main_gives_main_an_empty_command_line(paths_repo, tmp_path):
    run = _run(paths_repo, tmp_path, "paths.py", PATHS_EXAMPLE).check()
    assert run.summary["argv"] == [str(paths_repo / "examples" / "paths.py")]


@pytest.mark.usefixtures("child_processes")
def test_call_main_puts_the_script_directory_on_sys_path_as_a_script_run_does(paths_repo, tmp_path):
    run = _run(paths_repo, tmp_path, "paths.py", PATHS_EXAMPLE, env={"PYTHONSAFEPATH": ""})
    assert run.check().summary["sibling"] is True


@pytest.mark.usefixtures("child_processes")
def test_call_main_honours_pythonsafepath(paths_repo, tmp_path):
    run = _run(paths_repo, tmp_path, "paths.py", PATHS_EXAMPLE, env={"PYTHONSAFEPATH": "1"})
    assert run.check().summary["sibling"] is False


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("call_main", [True, False])
def test_the_repository_root_is_kept_off_sys_path(paths_repo, tmp_path, call_main):
    (paths_repo / "examples" / "paths.py").write_text(PATHS_EXAMPLE)
    script = "import json\nfrom paths import main\nprint(json.dumps(main()))\n"
    (paths_repo / "examples" / "as_script.py").write_text(script)
    name = "paths.py" if call_main else "as_script.py"
    run = _run(paths_repo, tmp_path, name, call_main=call_main).check()
    summary = run.summary if call_main else run.result.last_json()
    assert summary["at_root"] is False


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("safe_path", ["", "1"])
@pytest.mark.parametrize("call_main", [True, False])
def test_a_pythonpath_that_names_the_repository_root_is_kept(
    paths_repo, tmp_path, call_main, safe_path
):
    # call_main dropped every entry that was the root, the user's PYTHONPATH too: a module at the
    # root imported when the file ran as a script and not when main() was called
    text = (
        PATHS_EXAMPLE
        + "\nif __name__ == '__main__':\n    print(__import__('json').dumps(main()))\n"
    )
    env = {"PYTHONPATH": ".", "PYTHONSAFEPATH": safe_path}
    run = _run(paths_repo, tmp_path, "paths.py", text, call_main=call_main, env=env).check()
    summary = run.summary if call_main else run.result.last_json()
    assert summary["at_root"] is True
    assert summary["sibling"] is not bool(safe_path)  # its own directory: not with safe path


@pytest.mark.usefixtures("child_processes")
def test_a_line_printed_after_main_returned_does_not_hide_its_summary(repo, tmp_path):
    text = "import atexit\natexit.register(print, 'bye')\n\ndef main():\n    return {'ok': 1}\n"
    run = _run(repo, tmp_path, "with_exit_hook.py", text).check()
    assert run.summary == {"ok": 1}
    assert run.result.stdout.splitlines()[-1] == "bye"


PROGRESS_EXAMPLE = textwrap.dedent(
    """
    import json


    def main():
        print(json.dumps({"epoch": 0}))  # JSON of its own, before the summary
        print("..", end="", flush=True)  # progress dots: the line is left unfinished
        return {"final": 1}
    """
)


@pytest.mark.usefixtures("child_processes")
def test_the_summary_is_what_main_returned_after_an_unfinished_line(repo, tmp_path):
    run = _run(repo, tmp_path, "progress.py", PROGRESS_EXAMPLE).check()
    assert run.summary == {"final": 1}
    assert run.result.stdout.startswith('{"epoch": 0}\n..\n')
    assert run.result.last_json() == {"final": 1}  # still the last line


@pytest.mark.usefixtures("child_processes")
def test_json_an_exit_hook_prints_is_not_taken_for_the_summary(repo, tmp_path):
    text = "import atexit\natexit.register(print, '{\"late\": 1}')\n\ndef main():\n    pass\n"
    run = _run(repo, tmp_path, "late_json.py", text).check()
    assert run.summary is None  # main() returned None
    assert run.result.last_json() == {"late": 1}


SPAWN_EXAMPLE = textwrap.dedent(
    """
    import multiprocessing


    def square(x):
        return x * x


    def main():
        with multiprocessing.get_context("spawn").Pool(2) as pool:
            return {"squares": pool.map(square, [1, 2, 3]), "name": __name__}


    if __name__ == "__main__":
        raise AssertionError("call_main must not run the script's main block")
    """
)


@pytest.mark.usefixtures("child_processes")
def test_call_main_loads_the_example_so_spawned_children_import_it(repo, tmp_path):
    run = _run(repo, tmp_path, "spawn.py", SPAWN_EXAMPLE, timeout=120).check()
    assert run.summary == {"squares": [1, 4, 9], "name": "__mp_main__"}
