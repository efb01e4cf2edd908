"""The repository files the spec's README section promises, and what they say.

LICENSE (MIT, as every distribution's metadata says), SECURITY.md (a private address for
reports), CONTRIBUTING.md, a pre-commit configuration whose hooks include the test suite,
``setup.sh`` syncing the dev and test dependency groups, a missing extra named as
``substrax[wandb]``, and CI (``.ci/run``) running the checks, the README's command, the unit tier
at the lowest-direct resolution and the release tier, in that order.
"""

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[1]
DISTRIBUTIONS = sorted((ROOT / "packages").glob("*/pyproject.toml"))


def test_license_is_mit_as_every_distribution_declares() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 the substrax authors" in text
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text
    assert len(DISTRIBUTIONS) == 8
    for pyproject in DISTRIBUTIONS:
        project = tomllib.loads(pyproject.read_text())["project"]
        assert project["license"] == "MIT", pyproject


def test_security_policy_gives_a_private_address() -> None:
    text = (ROOT / "SECURITY.md").read_text()
    assert "never in a public issue" in text
    assert "https://github.com/avitai/substrax/security/advisories/new" in text


def test_readme_points_to_contributing_security_and_license() -> None:
    readme = (ROOT / "README.md").read_text()
    for name in ("CONTRIBUTING.md", "SECURITY.md", "LICENSE"):
        assert (ROOT / name).is_file(), name
        assert f"]({name})" in readme, name


def _hooks() -> dict[str, dict[str, object]]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    return {hook["id"]: hook for repo in config["repos"] for hook in repo["hooks"]}


def test_pre_commit_config_is_valid() -> None:
    pre_commit = shutil.which("pre-commit", path=str(Path(sys.executable).parent))
    assert pre_commit is not None, "pre-commit is in the dev dependency group"
    result = subprocess.run(
        [pre_commit, "validate-config", ".pre-commit-config.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_test_suite_is_a_hook_run_on_push() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    # `pre-commit install` installs the pre-push hook beside the pre-commit one.
    assert "pre-push" in config["default_install_hook_types"]
    hooks = _hooks()
    suite = hooks["pytest"]
    assert suite["entry"] == "uv run --locked pytest"  # the README's test command
    assert suite["stages"] == ["pre-push", "manual"]
    assert suite["pass_filenames"] is False
    # The lint hooks run on each commit (the default stages), not again on push.
    assert {"ruff-check", "ruff-format"} <= hooks.keys()
    assert "pre-push" not in config["default_stages"]
    assert all("stages" not in hook for name, hook in hooks.items() if name != "pytest")


def test_setup_script_syncs_the_dev_and_test_groups() -> None:
    result = subprocess.run(
        ["bash", str(ROOT / "setup.sh"), "--dry-run", "--backend", "cpu"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert "uv sync --locked --group dev --group test" in result.stdout.splitlines()
    groups = tomllib.loads((ROOT / "pyproject.toml").read_text())["dependency-groups"]
    assert any(requirement.startswith("pytest>=") for requirement in groups["test"])
    assert any(requirement.startswith("ruff>=") for requirement in groups["dev"])


def test_a_missing_extra_names_the_meta_package_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from substrax.support import MissingExtraError
    from substrax.tracking import WandbLogger

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    with pytest.raises(MissingExtraError) as caught:
        WandbLogger("run", "project")
    message = str(caught.value)
    # The spec's wording first, the part's own extra after it.
    assert re.search(r"install it with `uv add 'substrax\[wandb\]'`", message), message
    assert message.index("substrax[wandb]") < message.index("substrax-tracking[wandb]")
    assert caught.value.extra == "wandb"


def test_ci_runs_the_checks_the_readme_command_the_floors_and_the_release_tier_in_order() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    readme = (ROOT / "README.md").read_text()
    (test_command,) = {
        line.split("#")[0].strip()
        for line in readme.splitlines()
        if "# the unit and integration tiers" in line
    }
    assert test_command == "uv run --locked pytest"
    commands = [
        line.strip() for line in ci.splitlines() if line.strip() and not line.startswith("#")
    ]
    steps = [
        "uv run --locked pre-commit run --all-files --show-diff-on-failure",
        test_command,
        'uv run "${lowest_env[@]}" pytest packages -x --max-worker-restart=0 -q -m unit'
        ' --ignore-glob="packages/*/src/*"',
        "uv run --locked pytest -m release tests-integration",
    ]
    assert [commands.index(step) for step in steps] == sorted(commands.index(s) for s in steps)
    assert '"$python" -m pip install --quiet uv' in ci  # a fresh machine has no uv
    assert "rm -f uv.lock" in ci  # the scratch copy's lock, never the committed one
    assert "uv lock --resolution lowest-direct" in ci  # resolved while step 2 runs
    assert "--resolution lowest-direct" in ci.split("lowest_env=(", 1)[1].split(")", 1)[0]
    assert "-m unit" in ci  # the floors run the unit tier
    assert "SUBSTRAX_WHEELS" in ci  # the packages are built once for the release tier
    assert "--deselect" not in ci  # no test is left out of its tier
    assert (ROOT / "tests-integration" / "test_siblings.py").is_file()


# The spec's floors (its README): jax>=0.11.1, flax>=0.12.9, orbax-checkpoint>=0.11.33,
# pydantic>=2.10: every part that depends on one declares it (CI's lowest tier runs there).
SPEC_FLOORS = {"jax": "0.11.1", "flax": "0.12.9", "orbax-checkpoint": "0.11.33", "pydantic": "2.10"}


def _floors(pyproject: Path) -> dict[str, str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = [
        *project["dependencies"],
        *(r for extra in project.get("optional-dependencies", {}).values() for r in extra),
    ]
    floors: dict[str, str] = {}
    for requirement in requirements:
        found = re.fullmatch(r"([A-Za-z0-9_.-]+)(?:\[[^]]*\])?>=([^,]+)(?:,.*)?", requirement)
        assert found is not None, requirement
        floors[found[1]] = found[2]
    return floors


def test_the_environment_holds_the_bytecode_of_what_it_installs() -> None:
    """uv installs with bytecode, so a fresh interpreter reads jax's instead of compiling it."""
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["uv"]
    assert settings["compile-bytecode"] is True
    import jax

    source = Path(jax.__file__)
    assert Path(importlib.util.cache_from_source(str(source))).is_file(), source


@pytest.mark.parametrize("pyproject", DISTRIBUTIONS, ids=lambda path: path.parent.name)
def test_every_floor_is_in_the_readme_and_the_spec_floors_hold(pyproject: Path) -> None:
    floors = {
        name: version
        for name, version in _floors(pyproject).items()
        if not name.startswith("substrax")
    }
    if not floors:
        return  # the meta-package declares only its parts
    readme = (pyproject.parent / "README.md").read_text()
    notes = " ".join(readme.partition("## Version floors")[2].split())
    assert notes, f"{pyproject.parent.name}/README.md has no 'Version floors' section"
    for name, version in floors.items():
        assert f"`{name}>={version}`" in notes, (name, version)
    for name, version in SPEC_FLOORS.items():  # the spec's floors hold, each where declared
        assert floors.get(name, version) == version, name
