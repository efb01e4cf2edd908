"""mkdocs hook: give mkdocstrings one ``substrax`` package that holds every part.

In the workspace each part lives in its own ``src`` directory under the shared ``substrax``
namespace, and the meta-package's ``substrax/__init__.py`` extends the namespace at import time
(``pkgutil.extend_path``). griffe reads source statically: it would take the meta-package's
directory for the whole package and miss the parts. This hook lays out, under ``build/``, the
tree an installed ``substrax`` has (the meta ``__init__`` plus one link per part) and mkdocs.yml
points mkdocstrings there.
"""

from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
VIEW = ROOT / "build" / "docs-namespace" / "substrax"


def _link(link: Path, target: Path) -> None:
    """Point ``link`` at ``target``; safe when another build lays out the same view at once."""
    if link.is_symlink() and link.resolve() == target.resolve():
        return
    link.unlink(missing_ok=True)
    try:
        link.symlink_to(target)
    except FileExistsError:  # a concurrent build made the same link first
        if link.resolve() != target.resolve():
            raise


def _lay_out_namespace() -> None:
    VIEW.mkdir(parents=True, exist_ok=True)
    wanted = {"__init__.py": ROOT / "packages" / "substrax" / "src" / "substrax" / "__init__.py"}
    for part in sorted(ROOT.glob("packages/substrax-*/src/substrax/*")):
        if part.is_dir() and not part.name.startswith("_"):
            wanted[part.name] = part
    for stale in VIEW.iterdir():
        if stale.name not in wanted:
            stale.unlink(missing_ok=True)
    for name, target in wanted.items():
        _link(VIEW / name, target)


_lay_out_namespace()
