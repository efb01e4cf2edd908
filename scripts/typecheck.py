"""Run pyright (strict) over every part, with ``substrax`` seen as the namespace it is installed as.

In the workspace the meta-package's ``substrax/__init__.py`` sits on the path beside the parts'
``src`` directories and extends the namespace at import time (``pkgutil.extend_path``). pyright
resolves imports statically and always prefers a regular package to namespace portions, so it
would look for ``substrax.runtime`` inside the meta-package alone. This script lays out a
type-checking environment, ``build/typecheck-env``, whose site-packages lists every part's ``src``
and the real site-packages (whose editable ``.pth`` files, the meta-package's among them, pyright
then does not follow), and runs pyright against it. The meta-package's own file is still checked.

Usage: ``uv run python scripts/typecheck.py [pyright arguments]``.
"""

import subprocess
import sys
import sysconfig
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
ENV = ROOT / "build" / "typecheck-env"


def lay_out_environment() -> Path:
    """Write ``build/typecheck-env`` for this interpreter and return its path."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    site_packages = ENV / "lib" / version / "site-packages"
    site_packages.mkdir(parents=True, exist_ok=True)
    (ENV / "pyvenv.cfg").write_text(
        f"home = {Path(sys.base_prefix) / 'bin'}\n"
        "include-system-site-packages = false\n"
        f"version_info = {'.'.join(map(str, sys.version_info[:3]))}\n"
    )
    parts = sorted(str(src) for src in ROOT.glob("packages/substrax-*/src"))
    (site_packages / "substrax_parts.pth").write_text(
        "\n".join([*parts, sysconfig.get_paths()["purelib"]]) + "\n"
    )
    return ENV


def main(argv: list[str]) -> int:
    """Lay out the environment, then run pyright with ``argv`` passed through."""
    env = lay_out_environment()
    pyright = Path(sys.executable).parent / "pyright"
    command = [str(pyright), "--venvpath", str(env.parent), *argv]
    return subprocess.run(command, cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
