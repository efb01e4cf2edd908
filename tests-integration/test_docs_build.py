"""The docs site builds with ``mkdocs build --strict`` and holds every page.

The build runs as it does for a user (``mkdocs build --strict`` from the repository root, into a
temporary directory): any warning (a broken link, a missing snippet, an API name mkdocstrings
cannot resolve) fails it. The built site is then checked page by page against the ``nav`` of
``mkdocs.yml``, and every Markdown page under ``docs/`` must be in the nav.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml


ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXCLUDED = ("snippets/", "hooks/")  # exclude_docs in mkdocs.yml: included or code, not pages


def nav_pages(nav: object) -> list[str]:
    """Every page path of a mkdocs nav tree, in order."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [page for entry in nav for page in nav_pages(entry)]
    if isinstance(nav, dict):
        return [page for value in nav.values() for page in nav_pages(value)]
    return []


def built_path(site: Path, page: str) -> Path:
    """Where mkdocs writes a page with directory URLs: ``a/b.md`` -> ``a/b/index.html``."""
    stem = page.removesuffix(".md")
    if stem == "index" or stem.endswith("/index"):
        return site / f"{stem}.html"
    return site / stem / "index.html"


CONFIG = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
PAGES = nav_pages(CONFIG["nav"])


ONE_BUILD = pytest.mark.xdist_group("docs-site")  # every test of the built site on one worker


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    return out


def test_every_markdown_page_is_in_the_nav() -> None:
    pages = {
        str(path.relative_to(DOCS))
        for path in DOCS.rglob("*.md")
        if not str(path.relative_to(DOCS)).startswith(EXCLUDED)
    }
    assert pages == set(PAGES)


@ONE_BUILD
@pytest.mark.parametrize("page", PAGES)
def test_page_is_built(site: Path, page: str) -> None:
    html = built_path(site, page)
    assert html.is_file(), f"{page} was not built (expected {html})"
    text = html.read_text(encoding="utf-8")
    source = (DOCS / page).read_text(encoding="utf-8")
    title = next(line[2:].strip() for line in source.splitlines() if line.startswith("# "))
    assert title.split(" (")[0] in text


@ONE_BUILD
@pytest.mark.parametrize(
    ("page", "names"),
    [
        (
            "packages/runtime.md",
            ["JaxRuntime", "detect_devices", "resolve_output_dir", "split_key"],
        ),
        ("packages/mesh.md", ["LogicalAxisRules", "shard_model", "create_multihost_mesh"]),
        ("packages/spmd.md", ["place_batch_on_shards", "TrainStep", "OptimizerConfig"]),
        (
            "packages/checkpoint.md",
            ["OrbaxCheckpointStore", "PreemptionHandler", "RetentionPolicy"],
        ),
        ("packages/tracking.md", ["MLFlowLogger", "WandbLogger", "EarlyStopping"]),
        ("packages/compute.md", ["JobSpec", "read_compute_config", "load_backend"]),
        ("packages/testing.md", ["TraceCounter", "expect_compiles", "run_python"]),
    ],
)
def test_api_pages_document_the_public_names(site: Path, page: str, names: list[str]) -> None:
    text = built_path(site, page).read_text(encoding="utf-8")
    modules = _modules(page)
    for name in names:
        ids = [f'id="substrax.{module}.{name}"' for module in modules]
        assert any(i in text for i in ids), f"no API entry for {name} on {page}"


def _modules(page: str) -> list[str]:
    source = (DOCS / page).read_text(encoding="utf-8")
    return [
        line.removeprefix("::: substrax.")
        for line in source.splitlines()
        if line.startswith("::: substrax.")
    ]


@ONE_BUILD
def test_benchmarks_page_shows_the_results(site: Path) -> None:
    text = built_path(site, "benchmarks.md").read_text(encoding="utf-8")
    results = (DOCS / "snippets" / "benchmarks-results.md").read_text(encoding="utf-8")
    assert "--8<--" not in text  # the snippet was included, not shown as text
    assert "<table>" in text
    assert "what it measures" in text
    first_benchmark = next(line for line in results.splitlines() if line.startswith("### "))
    assert first_benchmark.removeprefix("### ") in text


def _run_all_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("run_all", module)
    spec.loader.exec_module(module)
    return module


def test_run_all_records_every_outcome(tmp_path: Path) -> None:
    run_all = _run_all_module()
    (tmp_path / "fast.py").write_text('"""Prints a table."""\nprint("a  b\\n1  2")\n')
    (tmp_path / "broken.py").write_text('"""Fails."""\nraise SystemExit("no data")\n')
    (tmp_path / "slow.py").write_text('"""Never ends."""\nimport time\ntime.sleep(60)\n')
    (tmp_path / "_helper.py").write_text("")
    (tmp_path / "run_all.py").write_text("")
    scripts = run_all.discover(tmp_path)
    assert [p.name for p in scripts] == ["broken.py", "fast.py", "slow.py"]

    outcomes = [run_all.run_one(p, args=(), timeout=5) for p in scripts]
    outcomes.append(run_all.missing("gone"))
    assert [o.status for o in outcomes] == [
        "failed (exit 1)",
        "ok",
        "timed out after 5 s",
        "missing",
    ]
    assert outcomes[0].stderr.strip() == "no data"

    page = run_all.render(outcomes, quick=False, started=run_all.dt.datetime(2026, 1, 1))
    assert "| [`fast`](#fast) | Prints a table. | ok |" in page
    assert "```text\na  b\n1  2\n```" in page
    assert "no data" in page  # a failure shows its stderr
    assert "`benchmarks/gone.py` does not exist yet." in page


def test_run_all_refuses_an_unknown_benchmark() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run_all.py"), "--only", "nope"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "unknown benchmark(s) ['nope']" in result.stderr


TOML_BLOCK = re.compile(r"^```toml\n(?P<body>.*?)^```", re.DOTALL | re.MULTILINE)
COMPUTE_TOML = [
    (page, number, match["body"])
    for page in sorted(DOCS.rglob("*.md"))
    for number, match in enumerate(TOML_BLOCK.finditer(page.read_text(encoding="utf-8")))
    if "[tool.substrax.compute" in match["body"]
]


@pytest.mark.parametrize(
    ("page", "number", "body"),
    COMPUTE_TOML,
    ids=[f"{p.relative_to(DOCS)}-{n}" for p, n, _ in COMPUTE_TOML],
)
def test_compute_toml_blocks_are_valid(tmp_path: Path, page: Path, number: int, body: str) -> None:
    """Each ``[tool.substrax.compute]`` example reads, and each of its jobs and backends resolves."""
    from substrax.compute import load_backend, read_compute_config, resolve_job

    del page, number
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "example.py").write_text("print('hi')\n")
    (tmp_path / "pyproject.toml").write_text(body)
    config = read_compute_config(tmp_path)
    for job in config.jobs.values():  # the files a job asks to upload by name exist in a project
        for included in job.include_files:
            (tmp_path / included).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / included).write_text("TOKEN=example\n")
    for name, settings in config.backends.items():
        assert load_backend(name, settings).name == name
    for job in config.jobs:
        assert resolve_job(config, job, project=tmp_path).tasks
