"""Every ``python`` code block in the docs and the READMEs runs.

The blocks of one page run top to bottom as one program in a fresh interpreter (a page reads as a
script: later blocks use what earlier ones defined), from an empty working directory, with 8
emulated CPU devices and ``AVITAI_OUTPUT_DIR`` pointing into the test's temporary directory.
A block that cannot run here (it needs a cloud account, say) is preceded by a comment that says
so, ``<!-- not run: needs a Modal account -->``, and is skipped; it still has to compile.
"""

import re
from pathlib import Path

import pytest

from substrax.runtime import JaxRuntime
from substrax.testing import run_python


ROOT = Path(__file__).resolve().parents[1]
_BLOCK = re.compile(
    r"(?P<skip><!--\s*not run:(?P<why>[^>]*)-->\s*\n)?^```python[^\n]*\n(?P<code>.*?)^```",
    re.DOTALL | re.MULTILINE,
)
PAGES = sorted(
    path
    for pattern in ("README.md", "packages/*/README.md", "docs/**/*.md")
    for path in ROOT.glob(pattern)
    if "```python" in path.read_text()
)


def page_program(page: Path) -> tuple[str, list[str]]:
    """The page's runnable blocks joined into one program, and the reasons of skipped blocks."""
    runnable: list[str] = []
    skipped: list[str] = []
    for match in _BLOCK.finditer(page.read_text()):
        code = match["code"]
        compile(code, f"{page}:block", "exec")
        if match["skip"]:
            skipped.append(match["why"].strip())
        else:
            runnable.append(code)
    return "\n".join(runnable), skipped


def test_every_distribution_readme_has_an_example() -> None:
    distributions = {path.parent.name for path in ROOT.glob("packages/*/README.md")}
    with_examples = {page.parent.name for page in PAGES if page.parent.parent.name == "packages"}
    assert with_examples == distributions


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_page_blocks_run(page: Path, tmp_path: Path) -> None:
    program, skipped = page_program(page)
    assert program.strip() or skipped, f"{page} has no python block"
    if not program.strip():
        return
    result = run_python(
        program,
        runtime=JaxRuntime(platforms=("cpu",), cpu_devices=8),
        env={"AVITAI_OUTPUT_DIR": str(tmp_path / "outputs"), "WANDB_MODE": "offline"},
        cwd=tmp_path,
        timeout=300,
    )
    result.check()
