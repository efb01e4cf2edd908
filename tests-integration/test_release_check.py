"""scripts/release_check.py: a released part that changed must bump its version."""

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "release_check.py"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_check", SCRIPT)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


release_check = _load()


def _git(root: Path, *argv: str) -> None:
    subprocess.run(["git", *argv], cwd=root, check=True, capture_output=True)


def _write_part(root: Path, name: str, version: str) -> Path:
    part = root / "packages" / name
    (part / "src").mkdir(parents=True, exist_ok=True)
    (part / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "{version}"\n')
    return part


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    _git(tmp_path, "init", "-q", "-b", "main")
    _git(tmp_path, "config", "user.email", "ci@example.invalid")
    _git(tmp_path, "config", "user.name", "ci")
    for name in ("substrax-alpha", "substrax-beta"):
        part = _write_part(tmp_path, name, "0.1.0")
        (part / "src" / "code.py").write_text("x = 1\n")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-qm", "first")
    _git(tmp_path, "tag", "substrax-alpha-v0.1.0")
    _git(tmp_path, "tag", "substrax-beta-v0.1.0")
    return tmp_path


def test_unchanged_released_parts_pass(repo: Path) -> None:
    statuses = release_check.release_status(repo)
    assert [(s.name, s.released, s.needs_bump) for s in statuses] == [
        ("substrax-alpha", True, False),
        ("substrax-beta", True, False),
    ]
    assert release_check.main(["--root", str(repo)]) == 0


def test_a_changed_part_that_kept_its_released_version_is_refused(
    repo: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (repo / "packages" / "substrax-beta" / "src" / "code.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "change beta")
    assert release_check.main(["--root", str(repo)]) == 1
    assert "refused: substrax-beta changed" in capsys.readouterr().err


def test_an_uncommitted_change_counts(repo: Path) -> None:
    (repo / "packages" / "substrax-alpha" / "src" / "new.py").write_text("y = 1\n")
    alpha = release_check.part_status(repo, repo / "packages" / "substrax-alpha")
    assert alpha.changed_files == ("packages/substrax-alpha/src/new.py",)
    assert alpha.needs_bump


def test_bumping_the_version_makes_it_the_pending_release(repo: Path) -> None:
    (repo / "packages" / "substrax-beta" / "src" / "code.py").write_text("x = 2\n")
    _git(repo, "commit", "-qam", "change beta")
    _write_part(repo, "substrax-beta", "0.1.1")
    _git(repo, "commit", "-qam", "bump beta")
    beta = release_check.part_status(repo, repo / "packages" / "substrax-beta")
    assert (beta.version, beta.released, beta.changed_files, beta.needs_bump) == (
        "0.1.1",
        False,
        (),
        False,
    )
    assert release_check.main(["--root", str(repo), "--json"]) == 0
