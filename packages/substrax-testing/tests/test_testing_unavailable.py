"""An example that cannot run here says why (exit 77), and is reported unavailable, not failed."""

import sys
import textwrap
from pathlib import Path

import pytest

from substrax.testing import (
    EXIT_UNAVAILABLE,
    ChildFailedError,
    ChildResult,
    ExampleRun,
    run_example,
    run_python,
    unavailable_reason,
)


NEEDS_A_GPU = textwrap.dedent(
    """
    import sys


    def main():
        print("unavailable: needs 1 gpu device; visible: 8 cpu", file=sys.stderr)
        raise SystemExit(77)


    if __name__ == "__main__":
        main()
    """
)


def _example(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "repo" / "examples" / "gpu_only.py"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    return path


@pytest.mark.usefixtures("child_processes")
@pytest.mark.parametrize("call_main", [True, False])
def test_an_example_that_exits_77_is_unavailable_with_its_reason(tmp_path, call_main):
    path = _example(tmp_path, NEEDS_A_GPU)
    run = run_example(
        path,
        repo_root=path.parents[1],
        output_dir=tmp_path / "out",
        timeout=60,
        call_main=call_main,
    )
    assert run.result.returncode == EXIT_UNAVAILABLE == 77
    assert run.unavailable == "needs 1 gpu device; visible: 8 cpu"
    assert run.status == "unavailable: needs 1 gpu device; visible: 8 cpu"
    assert run.summary is None
    with pytest.raises(ChildFailedError):
        run.check()


@pytest.mark.usefixtures("child_processes")
def test_failed_and_succeeded_runs_are_not_unavailable(tmp_path):
    failed = run_python("import sys; sys.exit('unavailable: but the status is 1')", timeout=60)
    assert unavailable_reason(failed) is None
    ok = run_python("import sys; print('unavailable: x', file=sys.stderr)", timeout=60)
    assert unavailable_reason(ok, ["unavailable"]) is None
    silent = run_python("raise SystemExit(77)", timeout=60)
    assert unavailable_reason(silent) == "(no reason given)"


@pytest.mark.usefixtures("child_processes")
def test_signatures_mark_a_missing_capability_in_a_failure():
    run = run_python("import no_such_sdk_here", timeout=60)
    assert unavailable_reason(run) is None
    signatures = ["Unable to initialize backend", "NO MODULE NAMED", "no_such_sdk"]
    assert unavailable_reason(run, signatures) == "NO MODULE NAMED"  # the first, as given
    assert unavailable_reason(run, ["Unable to initialize backend"]) is None
    for wrong in ("no module named", [""], [None]):  # a text is not a list of them
        with pytest.raises(TypeError, match="signatures must be a sequence of non-empty texts"):
            unavailable_reason(run, wrong)


@pytest.mark.usefixtures("child_processes")
def test_a_test_skips_an_unavailable_example_with_the_reason(pytester, tmp_path):
    path = _example(tmp_path, NEEDS_A_GPU)
    pytester.makepyfile(
        test_inner=textwrap.dedent(
            f"""
            from pathlib import Path

            from substrax.testing import run_example


            def test_gpu_example(tmp_path):
                path = Path({str(path)!r})
                run = run_example(
                    path, repo_root=path.parents[1], output_dir=tmp_path, timeout=60,
                    call_main=True,
                )
                run.check_or_skip()
                raise AssertionError("must be skipped")


            def test_missing_extra(tmp_path):
                path = Path({str(path)!r}).with_name("wandb_example.py")
                path.write_text("import wandb_is_not_here\\n")
                run = run_example(
                    path, repo_root=path.parents[1], output_dir=tmp_path, timeout=60,
                    call_main=False,
                )
                run.check_or_skip(["No module named"])
            """
        )
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(skipped=2)
    result.stdout.fnmatch_lines_random(
        [
            "SKIPPED *: unavailable: needs 1 gpu device; visible: 8 cpu",
            "SKIPPED *: unavailable: ModuleNotFoundError: No module named 'wandb_is_not_here'",
        ]
    )
    assert "unavailable: unavailable" not in result.stdout.str()


def test_a_signature_spanning_a_line_break_skips_with_the_signature(tmp_path):
    result = ChildResult(
        argv=(sys.executable, "-c", "pass"),
        returncode=1,
        stdout="",
        stderr="RuntimeError: no\nCUDA device found\n",
        seconds=0.1,
    )
    run = ExampleRun(path=tmp_path / "e.py", output_dir=tmp_path, result=result, summary=None)
    with pytest.raises(pytest.skip.Exception, match=r"^unavailable: no\nCUDA$"):
        run.check_or_skip(["no\nCUDA"])
