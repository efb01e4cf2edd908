"""Report which parts changed since their last version bump; refuse a release that kept one.

Each distribution under ``packages/`` carries its own version, and a release of it is tagged
``<distribution>-v<version>`` (``substrax-runtime-v0.2.0``). A part whose version is already
released and whose files changed since must bump its version (and its CHANGELOG) before the next
release; a part whose version is not released yet is the pending release and passes. Run from
anywhere inside the repository::

    uv run python scripts/release_check.py          # a table; exit 1 if a changed part kept its version
    uv run python scripts/release_check.py --json   # the same as JSON

Uncommitted changes count as changes.
"""

import argparse
import json
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True, slots=True, kw_only=True)
class PartStatus:
    """One distribution's release state."""

    name: str
    version: str
    bumped_in: str | None
    released: bool
    changed_files: tuple[str, ...]

    @property
    def tag(self) -> str:
        """The tag a release of this version carries."""
        return f"{self.name}-v{self.version}"

    @property
    def needs_bump(self) -> bool:
        """Whether this version is released and the part changed after it was set."""
        return self.released and bool(self.changed_files)


def _git(root: Path, *argv: str) -> str:
    return subprocess.run(
        ["git", *argv], cwd=root, capture_output=True, text=True, check=True
    ).stdout


def _bump_commit(root: Path, pyproject: Path) -> str | None:
    """The newest commit that changed the ``version = ...`` line of ``pyproject``."""
    relative = pyproject.relative_to(root).as_posix()
    log = _git(root, "log", "--format=%H", "-G", r"^version = ", "--", relative)
    commits = log.split()
    return commits[0] if commits else None


def part_status(root: Path, package_dir: Path) -> PartStatus:
    """The release state of the distribution in ``package_dir``."""
    pyproject = package_dir / "pyproject.toml"
    project = tomllib.loads(pyproject.read_text())["project"]
    bumped_in = _bump_commit(root, pyproject)
    tag = f"{project['name']}-v{project['version']}"
    released = bool(_git(root, "tag", "--list", tag).strip())
    relative = package_dir.relative_to(root).as_posix()
    if bumped_in is None:
        changed: set[str] = set()
    else:
        committed = _git(root, "diff", "--name-only", f"{bumped_in}..HEAD", "--", relative)
        uncommitted = _git(root, "status", "--porcelain", "--untracked-files=all", "--", relative)
        changed = set(committed.split())
        changed.update(line[3:] for line in uncommitted.splitlines() if line.strip())
    return PartStatus(
        name=project["name"],
        version=project["version"],
        bumped_in=bumped_in,
        released=released,
        changed_files=tuple(sorted(changed)),
    )


def release_status(root: Path) -> list[PartStatus]:
    """The release state of every distribution under ``root/packages``."""
    return [
        part_status(root, pyproject.parent)
        for pyproject in sorted(root.glob("packages/*/pyproject.toml"))
    ]


def main(argv: list[str] | None = None) -> int:
    """Print the table (or JSON); exit 1 when a changed part kept its version."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--root", type=Path, default=None, help="the repository (default: here)")
    args = parser.parse_args(argv)
    root = args.root or Path(_git(Path.cwd(), "rev-parse", "--show-toplevel").strip())
    statuses = release_status(root.resolve())
    if args.json:
        rows = [{**asdict(s), "needs_bump": s.needs_bump} for s in statuses]
        print(json.dumps(rows, indent=2))
    else:
        width = max(len(s.name) for s in statuses)
        print(f"{'part':<{width}}  version  released  changed since its version was set")
        for s in statuses:
            released = "yes" if s.released else "no"
            print(
                f"{s.name:<{width}}  {s.version:<7}  {released:<8}  {len(s.changed_files)} file(s)"
            )
    stale = [s.name for s in statuses if s.needs_bump]
    if stale:
        print(
            f"refused: {', '.join(stale)} changed since their released version was set; "
            "bump each one's version and CHANGELOG",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
