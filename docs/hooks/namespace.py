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


def _lay_out_namespace() -> None:
    VIEW.mkdir(parents=True, exist_ok=True)
    for stale in VIEW.iterdir():
        stale.unlink()
    (VIEW / "__init__.py").symlink_to(
        ROOT / "packages" / "substrax" / "src" / "substrax" / "__init__.py"
    )
    for part in sorted(ROOT.glob("packages/substrax-*/src/substrax/*")):
        if part.is_dir() and not part.name.startswith("_"):
            (VIEW / part.name).symlink_to(part)


_lay_out_namespace()
