r"""Which project files a remote backend uploads: what git would track, never a secret by accident.

The rule, shared by every backend that copies the project somewhere else:

1. Start from what git would track: ``git ls-files --cached --others --exclude-standard`` when
   the project is in a git work tree, else (or when git lists no file, e.g. under a parent
   repository that ignores everything) a walk that honours every ``.gitignore`` in the project.
2. Leave out ``.git``, ``.venv`` and caches (``ALWAYS_LEFT_OUT``), substrax's state
   directories inside the project (``state_directories``: earlier runs' records, logs and
   outputs), then what the project's own ``.substraxignore`` (gitignore syntax, at the project
   root) and a backend's ``ignore`` setting name.
3. Hold back the credential files of common tools (``NEVER_UPLOADED``: ``.env*``, keys,
   cloud CLI, package manager, database, Hugging Face, W&B, Docker and Kubernetes credentials,
   ...; at any depth, whatever the letter case), and any link whose target looks like one. A
   link that leads out of the project is never uploaded.
4. Add the files the job names in ``include_files``, whatever the rules above say.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from substrax.compute import collect_upload
    >>> with tempfile.TemporaryDirectory() as directory:
    ...     root = Path(directory)
    ...     for name in ("train.py", ".env", "id_rsa", "notes.txt"):
    ...         _ = (root / name).write_text("x")
    ...     _ = (root / ".substraxignore").write_text("notes.txt\n")
    ...     upload = collect_upload(root)
    ...     with_key = collect_upload(root, include_files=("id_rsa",))
    >>> upload.files, upload.held_back
    (('.substraxignore', 'train.py'), ('.env', 'id_rsa'))
    >>> with_key.files
    ('.substraxignore', 'id_rsa', 'train.py')
"""

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Literal, Protocol, cast, runtime_checkable

import pathspec

from ._backend import default_state_dir
from ._errors import ProjectDirectoryError, UploadFileNotFoundError
from ._toml import read_toml


if TYPE_CHECKING:
    from ._spec import JobSpec


UPLOAD_IGNORE_FILE = ".substraxignore"
"""The project's own ignore file (gitignore syntax, project root): files no backend uploads."""

ALWAYS_LEFT_OUT: tuple[str, ...] = (
    ".git/", ".venv/", "__pycache__/", "*.pyc", ".pytest_cache/", ".ruff_cache/", ".mypy_cache/",
)  # fmt: skip
"""Gitignore patterns never uploaded: version control, the environment, caches."""

NEVER_UPLOADED: tuple[str, ...] = (
    # environment and secrets files
    ".env*", "*.env", "secret.json", "secret.yaml", "secret.yml", "secret.toml",
    "secrets.json", "secrets.yaml", "secrets.yml", "secrets.toml", ".htpasswd", "*.keytab",
    # private keys, certificates, key stores
    "*.pem", "*.key", "*.p8", "*.p12", "*.pfx", "*.jks", "*.keystore", "*.ppk", "*.kdbx",
    "*.gpg", "*.asc", "id_rsa*", "id_dsa*", "id_ecdsa*", "id_ed25519*", ".ssh/", ".gnupg/",
    # cloud CLIs and key files: AWS, Google Cloud, Azure, OCI, S3 tools, Databricks
    ".aws/", "**/.config/gcloud/", "credentials*.json", "*-credentials.json",
    "*_credentials.json", "*service-account*.json", "*service_account*.json",
    "client_secret*.json", ".azure/", ".oci/", ".s3cfg", ".boto", ".databrickscfg",
    # GPU clouds and the backends: Modal, SkyPilot, Lambda, RunPod
    ".modal.toml", ".sky/", ".lambda_cloud/", ".runpod/",
    # package managers, git and its hosts
    ".netrc", "_netrc", ".pypirc", ".npmrc", "**/.cargo/credentials*", "**/.gem/credentials",
    ".git-credentials", "**/.config/gh/hosts.yml",
    # databases and vaults
    ".pgpass", ".my.cnf", ".mylogin.cnf", ".vault-token",
    # Hugging Face (``$HF_HOME/token``), W&B (``.netrc``, a settings file's ``api_key``), Kaggle
    "**/huggingface/token", "**/huggingface/stored_tokens", "**/.huggingface/token",
    "**/.huggingface/stored_tokens", ".huggingface_token", "**/wandb/settings", "kaggle.json",
    # Docker and Kubernetes
    "**/.docker/config.json", ".dockercfg", "**/.kube/config", "kubeconfig", "kubeconfig.yaml",
    "kubeconfig.yml", "*.kubeconfig",
    # Terraform (state and variables hold secrets in the clear)
    "*.tfvars", "*.tfstate", "*.tfstate.*", ".terraformrc", "terraform.rc",
)  # fmt: skip
"""Gitignore patterns (lower case) of files that hold secrets: held back unless a job names them.

The credential files of the tools substrax users use, wherever they lie in the project (a name
without a ``/`` matches at any depth, a ``dir/`` pattern holds back the whole directory,
``**/a/b`` matches ``a/b`` under any directory). They are matched against each path in lower
case, and against the target of a link. A job ships one on purpose by naming it in
``include_files``.
"""

type UploadSource = Literal["git", "gitignore"]

_STEP = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadSet:
    """The files a backend uploads from a project, with their sizes.

    Attributes:
        root: The project root (resolved).
        files: Paths relative to ``root`` (POSIX, sorted).
        sizes: Each file's size in bytes, in the order of ``files``.
        held_back: Files left out because they look like secrets (the job did not name them).
        source: ``"git"`` when git listed the files, ``"gitignore"`` for the fallback walk
            (no git work tree, no git, or git listed no file).
    """

    root: Path
    files: tuple[str, ...]
    sizes: tuple[int, ...]
    held_back: tuple[str, ...]
    source: UploadSource

    @property
    def total_bytes(self) -> int:
        """The size of every uploaded file together, in bytes."""
        return sum(self.sizes)

    def copy_to(self, target: Path) -> Path:
        """Copy the files to ``target`` (created; it must not exist yet); return ``target``."""
        target.mkdir(parents=True, exist_ok=False)
        for name in self.files:
            destination = target / name
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(self.root / name, destination)
        return target


@runtime_checkable
class UploadsProject(Protocol):
    """A backend that copies the project elsewhere and can say which files it would copy."""

    def upload_set(self, spec: "JobSpec", *, project: Path) -> UploadSet:
        """The files ``submit`` would upload for ``spec`` from ``project``."""
        ...


def _spec(lines: Iterable[str]) -> pathspec.GitIgnoreSpec:
    return pathspec.GitIgnoreSpec.from_lines(list(lines))


def _read_lines(path: Path) -> list[str]:
    return path.read_text(errors="replace").splitlines() if path.is_file() else []


def _git_files(project: Path) -> list[str] | None:
    """What git would track under ``project``, or None when git is missing or it is no work tree."""
    argv = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    try:
        result = subprocess.run(argv, cwd=project, capture_output=True, check=False, timeout=120)
    except (OSError, subprocess.SubprocessError):
        return None
    if result.returncode != 0:
        return None
    files: list[str] = []
    for name in result.stdout.decode(errors="surrogateescape").split("\0"):
        if not name:
            continue
        path = project / name
        if path.is_dir() and not path.is_symlink():  # a submodule: list its own files
            files += [f"{name.rstrip('/')}/{inner}" for inner in _git_files(path) or ()]
        else:
            files.append(name)
    return files


def _ignored(rules: list[tuple[str, pathspec.GitIgnoreSpec]], relative: str) -> bool:
    """Gitignore semantics over nested ``.gitignore`` files: the deepest matching rule wins."""
    verdict = False
    for base, spec in rules:
        if base and not relative.startswith(f"{base}/"):
            continue
        result = spec.check_file(relative[len(base) + 1 :] if base else relative)
        if result.include is not None:
            verdict = result.include
    return verdict


def _walked_files(project: Path, skipped: Sequence[str] = ()) -> list[str]:
    """The files a walk finds, honouring every ``.gitignore`` as git would, less ``skipped``."""
    rules: list[tuple[str, pathspec.GitIgnoreSpec]] = []
    files: list[str] = []
    for directory, dirnames, filenames in os.walk(project):
        base = Path(directory).relative_to(project).as_posix()
        base = "" if base == "." else base
        ignore = Path(directory) / ".gitignore"
        if ignore.is_file():
            rules.append((base, _spec(_read_lines(ignore))))
        prefix = f"{base}/" if base else ""
        dirnames[:] = sorted(
            d
            for d in dirnames
            if d != ".git"
            and f"{prefix}{d}/" not in skipped
            and not _ignored(rules, f"{prefix}{d}/")
        )
        files += [f"{prefix}{f}" for f in filenames if not _ignored(rules, f"{prefix}{f}")]
    return files


def _configured_state_dirs(root: Path) -> list[Path]:
    """The ``state_dir`` of each ``[tool.substrax.compute.backends.*]`` table.

    A relative one is the project's; none when ``pyproject.toml`` can't be read (reading the
    job's configuration says why).
    """
    table: object = {}
    with contextlib.suppress(OSError, ValueError):
        table = read_toml(root / "pyproject.toml")
    for key in ("tool", "substrax", "compute", "backends"):
        table = cast("dict[str, object]", table).get(key, {}) if isinstance(table, dict) else {}
    if not isinstance(table, dict):
        return []
    settings = [s for s in cast("dict[str, object]", table).values() if isinstance(s, dict)]
    places = [cast("dict[str, object]", s).get("state_dir") for s in settings]
    return [root / Path(p).expanduser() for p in places if isinstance(p, str) and p]


def state_directories(project: Path, also: Sequence[Path] = ()) -> tuple[str, ...]:
    r"""The state directories inside ``project``, as ``dir/`` paths relative to it.

    ``$SUBSTRAX_STATE_DIR`` (else the user's state directory), each backend's ``state_dir`` in
    the project's ``pyproject.toml`` and the directories in ``also``: a state directory holds
    every earlier run's records, logs and outputs, which are never uploaded.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.compute._upload import state_directories
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     root = Path(directory).resolve()
        ...     _ = (root / "pyproject.toml").write_text(
        ...         '[tool.substrax.compute.backends.local]\nstate_dir = ".runs"\n')
        ...     state_directories(root, also=[root / "sky-state", root.parent])
        ('.runs/', 'sky-state/')
    """
    root = project.resolve()
    found: set[str] = set()
    # the user's state directory holds substrax's under compute/ (the project itself, when
    # SUBSTRAX_STATE_DIR is "." there: then that folder alone)
    places = (default_state_dir() / "compute", *_configured_state_dirs(root), *also)
    for place in places:
        where = (root / place).resolve()
        if where != root and where.is_relative_to(root):
            found.add(f"{where.relative_to(root).as_posix()}/")
    return tuple(sorted(found))


def _is_project_file(project: Path, name: str) -> bool:
    """Whether ``name`` is a file whose real path (links followed) is inside ``project``."""
    path = project / name
    return path.is_file() and path.resolve().is_relative_to(project)


def _looks_secret(secret: pathspec.GitIgnoreSpec, project: Path, name: str) -> bool:
    """Whether ``name``, or what it resolves to through links, matches a secret pattern."""
    real = (project / name).resolve().relative_to(project).as_posix()
    return any(secret.match_file(candidate.lower()) for candidate in {name, real})


def _check_named(project: Path, name: str) -> str:
    """``name`` from ``include_files``, refused unless a normalised relative path to a file."""
    path = PurePosixPath(name)
    relative = bool(name) and not path.is_absolute() and ".." not in path.parts
    if not relative or path.as_posix() != name or not _is_project_file(project, name):
        raise UploadFileNotFoundError(name, project)
    return name


def collect_upload(
    project: Path,
    *,
    include_files: Sequence[str] = (),
    ignore: Sequence[str] = (),
    state_dirs: Sequence[Path] = (),
) -> UploadSet:
    """The files a backend uploads from ``project`` (see the module's rule).

    Args:
        project: The project root.
        include_files: Files (relative to ``project``) to upload whatever the rules say.
        ignore: More gitignore patterns to leave out (a backend's ``ignore`` setting).
        state_dirs: More state directories to leave out (the backend's own ``state_dir``),
            besides those ``state_directories`` finds.

    Raises:
        UploadFileNotFoundError: A name in ``include_files`` is not a file inside the project,
            named by its normalised relative path (as the job's configuration requires).
        ProjectDirectoryError: ``project`` is not a directory.

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from substrax.compute import collect_upload
        >>> with tempfile.TemporaryDirectory() as directory:
        ...     _ = (Path(directory) / "a.py").write_text("print(1)")
        ...     collect_upload(Path(directory)).total_bytes
        8
    """
    root = project.resolve()
    if not root.is_dir():
        raise ProjectDirectoryError(project)
    listed = _git_files(root)
    source: UploadSource = "git" if listed else "gitignore"
    states = state_directories(root, state_dirs)
    candidates = sorted(
        {PurePosixPath(n).as_posix() for n in listed or _walked_files(root, states)}
    )
    left_out = _spec([*ALWAYS_LEFT_OUT, *_read_lines(root / UPLOAD_IGNORE_FILE), *ignore])
    secret = _spec(NEVER_UPLOADED)
    kept: set[str] = set()
    held: set[str] = set()
    for name in candidates:
        if not _is_project_file(root, name) or left_out.match_file(name):
            continue
        if any(name.startswith(state) for state in states):
            continue
        (held if _looks_secret(secret, root, name) else kept).add(name)
    for name in include_files:
        kept.add(_check_named(root, name))
        held.discard(name)
    files = tuple(sorted(kept))
    return UploadSet(
        root=root,
        files=files,
        sizes=tuple((root / name).stat().st_size for name in files),
        held_back=tuple(sorted(held)),
        source=source,
    )


def human_size(size: int) -> str:
    """A byte count for people: bytes, KiB, MiB or GiB with one decimal.

    Example:
        >>> from substrax.compute._upload import human_size
        >>> human_size(512), human_size(1536), human_size(3 * 2**30)
        ('512 B', '1.5 KiB', '3.0 GiB')
    """
    if size < _STEP:
        return f"{size} B"
    value = size / _STEP
    for unit in ("KiB", "MiB"):
        if value < _STEP:
            return f"{value:.1f} {unit}"
        value /= _STEP
    return f"{value:.1f} GiB"
