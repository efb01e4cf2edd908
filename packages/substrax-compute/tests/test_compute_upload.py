"""The upload set: what git would track, less .substraxignore and secrets, plus files named by a job.

Real git repositories in temporary directories; the fallback walk is checked against git itself.
"""

import shutil
import subprocess

import pytest

from substrax.compute import UploadFileNotFoundError, collect_upload
from substrax.compute._upload import human_size


TREE = {
    "pyproject.toml": "[project]\nname = 'p'\n",
    "train.py": "print('train')\n",
    "src/model.py": "MODEL = 1\n",
    ".gitignore": "data/\n*.log\n!keep.log\n",
    "data/big.csv": "1,2,3\n",
    "run.log": "noise\n",
    "keep.log": "kept\n",
    "notes.md": "untracked, not ignored\n",
    ".env": "TOKEN=secret\n",
    ".substrax.env": "JAX_PLATFORMS=cuda\n",
    "id_rsa": "-----BEGIN OPENSSH PRIVATE KEY-----\n",
    "config/.env.remote": "TOKEN=remote\n",
    "config/service-account.json": "{}\n",
    "certs/server.pem": "pem\n",
    "sub/.gitignore": "local.txt\n",
    "sub/local.txt": "only here\n",
    "sub/code.py": "CODE = 2\n",
    ".substraxignore": "scratch/\n",
    "scratch/tmp.py": "scratch\n",
    ".venv/lib/site.py": "venv\n",
    "__pycache__/train.cpython-312.pyc": "bytecode",
}
UPLOADED = (
    ".gitignore",
    ".substraxignore",
    "keep.log",
    "notes.md",
    "pyproject.toml",
    "src/model.py",
    "sub/.gitignore",
    "sub/code.py",
    "train.py",
)
HELD_BACK = (
    ".env",
    ".substrax.env",
    "certs/server.pem",
    "config/.env.remote",
    "config/service-account.json",
    "id_rsa",
)


def _git(root, *args):
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args],
        cwd=root,
        check=True,
        capture_output=True,
        timeout=60,
    )


def _tree(root):
    for name, text in TREE.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.fixture
def repo(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = _tree(tmp_path / "repo")
    _git(root, "init", "-q")
    _git(root, "add", "pyproject.toml", "train.py", "src", ".gitignore", "sub/.gitignore")
    _git(root, "commit", "-q", "-m", "init")
    return root


def test_git_project_uploads_what_git_would_track_and_holds_back_secrets(repo):
    upload = collect_upload(repo)
    assert upload.source == "git"
    assert upload.files == UPLOADED
    assert upload.held_back == HELD_BACK
    assert upload.sizes == tuple((repo / name).stat().st_size for name in UPLOADED)
    assert upload.total_bytes == sum(upload.sizes)


def test_the_walk_without_git_agrees_with_git(repo, tmp_path):
    plain = _tree(tmp_path / "plain")
    walked = collect_upload(plain)
    assert walked.source == "gitignore"
    assert (walked.files, walked.held_back) == (UPLOADED, HELD_BACK)
    assert (walked.files, walked.held_back) == (collect_upload(repo).files, HELD_BACK)


def test_a_missing_git_falls_back_to_the_gitignore_walk(repo, monkeypatch, tmp_path):
    empty = tmp_path / "no-git-here"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    upload = collect_upload(repo)
    assert upload.source == "gitignore"
    assert upload.files == UPLOADED


def test_files_named_by_the_job_are_uploaded_whatever_the_rules_say(repo):
    upload = collect_upload(repo, include_files=("config/.env.remote", "data/big.csv"))
    assert "config/.env.remote" in upload.files
    assert "data/big.csv" in upload.files
    assert "config/.env.remote" not in upload.held_back
    assert ".env" in upload.held_back


def test_a_named_file_must_be_a_file_inside_the_project(repo):
    for name in ("missing.txt", "src", "../outside.txt"):
        with pytest.raises(UploadFileNotFoundError, match="not a file in") as caught:
            collect_upload(repo, include_files=(name,))
        assert caught.value.name == name


def test_deleted_tracked_files_and_links_out_of_the_project_are_not_uploaded(repo, tmp_path):
    (repo / "train.py").unlink()
    outside = tmp_path / "outside.txt"
    outside.write_text("not the project's")
    (repo / "link.txt").symlink_to(outside)
    (repo / "inner.py").symlink_to(repo / "src" / "model.py")
    upload = collect_upload(repo)
    assert "train.py" not in upload.files
    assert "link.txt" not in upload.files
    assert "inner.py" in upload.files


def test_backend_ignore_patterns_and_nested_repositories(repo):
    nested = repo / "vendor" / "lib"
    nested.mkdir(parents=True)
    (nested / "lib.py").write_text("LIB = 1\n")
    (nested / "ignored.tmp").write_text("x")
    (nested / ".gitignore").write_text("*.tmp\n")
    _git(nested, "init", "-q")
    upload = collect_upload(repo, ignore=("notes.md",))
    assert "notes.md" not in upload.files
    assert {"vendor/lib/lib.py", "vendor/lib/.gitignore"} <= set(upload.files)
    assert "vendor/lib/ignored.tmp" not in upload.files


def test_copy_to_writes_exactly_the_upload_set(repo, tmp_path):
    upload = collect_upload(repo)
    target = upload.copy_to(tmp_path / "staged")
    copied = sorted(p.relative_to(target).as_posix() for p in target.rglob("*") if p.is_file())
    assert tuple(copied) == UPLOADED
    assert (target / "src" / "model.py").read_text() == "MODEL = 1\n"


def test_project_must_be_a_directory(tmp_path):
    file = tmp_path / "file"
    file.write_text("x")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        collect_upload(file)


def test_human_size():
    assert [human_size(n) for n in (0, 1023, 1024, 5 * 2**20, 2**40)] == [
        "0 B",
        "1023 B",
        "1.0 KiB",
        "5.0 MiB",
        "1024.0 GiB",
    ]


def test_secrets_are_held_back_at_any_depth_and_in_any_letter_case(repo):
    for name in ("sub/.docker/config.json", "sub/.kube/config", "keys/Server.PEM", "ID_RSA.bak"):
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("secret\n")
    upload = collect_upload(repo)
    assert set(upload.held_back) == {
        *HELD_BACK,
        "sub/.docker/config.json",
        "sub/.kube/config",
        "keys/Server.PEM",
        "ID_RSA.bak",
    }
    assert upload.files == UPLOADED


def test_a_link_to_a_secret_is_held_back_whatever_its_name(repo):
    (repo / "innocent.txt").symlink_to(".env")
    (repo / "notes").mkdir()
    (repo / "notes" / "key.txt").symlink_to(repo / "certs" / "server.pem")
    upload = collect_upload(repo)
    assert {"innocent.txt", "notes/key.txt"} & set(upload.files) == set()
    assert {"innocent.txt", "notes/key.txt"} <= set(upload.held_back)
    assert "innocent.txt" in collect_upload(repo, include_files=("innocent.txt",)).files


def test_a_named_file_must_be_named_by_its_normalised_relative_path(repo, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("not the project's")
    (repo / "away").symlink_to(tmp_path, target_is_directory=True)
    for name in (
        str(outside),
        str(repo / "train.py"),
        "./train.py",
        "src//model.py",
        "away/outside.txt",
    ):
        with pytest.raises(UploadFileNotFoundError, match="normalised path relative") as caught:
            collect_upload(repo, include_files=(name,))
        assert caught.value.name == name


def test_git_listing_nothing_falls_back_to_the_walk_and_says_so(tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    home = tmp_path / "home"
    home.mkdir()
    _git(home, "init", "-q")
    (home / ".gitignore").write_text("*\n")
    project = _tree(home / "code" / "project")
    upload = collect_upload(project)
    assert upload.source == "gitignore"
    assert (upload.files, upload.held_back) == (UPLOADED, HELD_BACK)


def test_the_tokens_of_common_ml_and_infrastructure_tools_are_held_back(repo):
    names = (
        ".huggingface_token",
        "home/.huggingface/token",
        "kaggle.json",
        "infra/prod.tfvars",
        "infra/terraform.tfstate",
        "config/secrets.toml",
        "conf/Secrets.YAML",
    )
    for name in names:
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text("token\n")
    upload = collect_upload(repo)
    assert set(upload.held_back) == {*HELD_BACK, *names}
    assert upload.files == UPLOADED


# The credential files of the tools substrax users use, as they lie in a project (a home
# directory's dot files copied in, a tool's config directory pointed inside the project). Each
# must be held back and reported, tracked by git or not.
CREDENTIAL_FILES = (
    # the hostile test's finding
    ".npmrc",
    ".pgpass",
    ".s3cfg",
    ".boto",
    ".databrickscfg",
    ".vault-token",
    "config/secret.yaml",
    "config/secret.json",
    "keys/release.gpg",
    "keys/signing.asc",
    "keys/AuthKey_ABC123.p8",
    ".cache/huggingface/token",
    # cloud CLIs
    ".aws/credentials",
    ".aws/config",
    "application_default_credentials.json",
    "deploy/my-project-service-account-key.json",
    ".config/gcloud/credentials.db",
    ".config/gcloud/legacy_credentials/me@example.com/adc.json",
    ".azure/msal_token_cache.json",
    ".azure/azureProfile.json",
    ".oci/config",
    ".lambda_cloud/lambda_keys",
    ".runpod/config.toml",
    ".sky/state.db",
    ".modal.toml",
    # package managers and git
    ".netrc",
    "_netrc",
    ".pypirc",
    ".git-credentials",
    ".cargo/credentials.toml",
    ".gem/credentials",
    ".config/gh/hosts.yml",
    # databases
    ".my.cnf",
    ".mylogin.cnf",
    # secrets files
    "secrets.yaml",
    "conf/secrets.json",
    "conf/secret.toml",
    "conf/secrets.yml",
    ".env",
    ".env.local",
    "deploy/.env.production",
    "deploy/prod.env",
    # keys
    ".ssh/config",
    ".ssh/known_hosts",
    "id_rsa",
    "id_rsa.pub",
    "keys/id_ed25519",
    "certs/server.pem",
    "certs/server.key",
    "certs/client.p12",
    "certs/client.pfx",
    ".gnupg/pubring.kbx",
    # Hugging Face, W&B
    ".huggingface/token",
    "hf_home/huggingface/stored_tokens",
    ".huggingface_token",
    "wandb/settings",
    ".config/wandb/settings",
    # Docker, Kubernetes
    ".docker/config.json",
    ".dockercfg",
    ".kube/config",
    "deploy/kubeconfig",
    "deploy/kubeconfig.yaml",
    "deploy/prod.kubeconfig",
    # Terraform, web servers
    "infra/terraform.tfstate",
    "infra/terraform.tfstate.backup",
    "infra/prod.tfvars",
    ".terraformrc",
    ".terraform.d/credentials.tfrc.json",
    ".htpasswd",
    "kaggle.json",
)

# Ordinary project files that only look like credentials: they are uploaded.
LOOK_ALIKES = (
    "README.md",
    "config.yaml",
    "configs/train.yaml",
    "data/train.json",
    "src/keys.py",
    "src/secret_sharing.py",
    "src/auth/token.py",
    "src/tokens.py",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    ".github/workflows/ci.yml",
    ".pre-commit-config.yaml",
    ".python-version",
    ".editorconfig",
    "uv.lock",
    "src/credentials.py",
    "src/gcloud/storage.py",
    "src/wandb_utils/settings.py",
    "src/kube/config.py",
    "docs/keys.md",
    "docs/secrets.md",
    "environment.yml",
    "src/huggingface/tokenizer.py",
    "notebooks/keyboard.ipynb",
    "scripts/docker/Dockerfile",
    ".docker/Dockerfile",
    "deploy/.kube/deployment.yaml",
    "terraform/main.tf",
    "src/config.toml",
)


def _add(root, names):
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("content\n")


def test_the_credential_files_of_common_tools_are_held_back_and_reported(repo):
    _add(repo, CREDENTIAL_FILES)
    upload = collect_upload(repo)
    leaked = sorted(set(CREDENTIAL_FILES) & set(upload.files))
    assert leaked == []
    assert set(CREDENTIAL_FILES) <= set(upload.held_back)
    assert upload.files == UPLOADED


def test_committed_credential_files_are_held_back_too(repo):
    _add(repo, CREDENTIAL_FILES)
    _git(repo, "add", "-f", *CREDENTIAL_FILES)
    _git(repo, "commit", "-q", "-m", "oops")
    upload = collect_upload(repo)
    assert set(CREDENTIAL_FILES) <= set(upload.held_back)
    assert set(CREDENTIAL_FILES) & set(upload.files) == set()


def test_the_walk_without_git_holds_back_the_same_credential_files(tmp_path):
    plain = _tree(tmp_path / "plain")
    _add(plain, CREDENTIAL_FILES)
    upload = collect_upload(plain)
    assert upload.source == "gitignore"
    assert set(CREDENTIAL_FILES) <= set(upload.held_back)
    assert upload.files == UPLOADED


def test_credential_files_deep_in_the_tree_and_in_any_case_are_held_back(repo):
    names = tuple(f"nested/Deep/{name.upper()}" for name in CREDENTIAL_FILES)
    _add(repo, names)
    upload = collect_upload(repo)
    assert set(names) & set(upload.files) == set()
    assert set(names) <= set(upload.held_back)


def test_look_alikes_of_credential_files_are_uploaded(repo):
    _add(repo, LOOK_ALIKES)
    _git(repo, "add", "-f", *LOOK_ALIKES)  # data/ is git-ignored: track data/train.json
    _git(repo, "commit", "-q", "-m", "code")
    upload = collect_upload(repo)
    assert set(LOOK_ALIKES) <= set(upload.files)
    assert upload.held_back == HELD_BACK


def test_a_credential_file_named_by_the_job_is_uploaded_and_the_others_stay_held_back(repo):
    _add(repo, CREDENTIAL_FILES)
    chosen = (".npmrc", ".cache/huggingface/token", ".aws/config")
    upload = collect_upload(repo, include_files=chosen)
    assert set(chosen) <= set(upload.files)
    assert set(chosen) & set(upload.held_back) == set()
    assert set(upload.held_back) == set(CREDENTIAL_FILES) - set(chosen) | set(HELD_BACK)
    assert ".aws/credentials" in upload.held_back


def test_the_guide_lists_every_held_back_pattern():
    from pathlib import Path

    from substrax.compute import NEVER_UPLOADED

    guide = Path(__file__).parents[3] / "docs" / "guides" / "compute.md"
    if not guide.is_file():
        pytest.skip("the docs are not next to this checkout")
    text = guide.read_text()
    missing = [pattern for pattern in NEVER_UPLOADED if f"`{pattern}`" not in text]
    assert missing == []


def test_a_dry_run_names_the_held_back_credential_files_and_the_override(repo, capsys):
    from substrax.compute import JobSpec, Task
    from substrax.compute._report import dry_run

    _add(repo, (".npmrc", ".cache/huggingface/token", ".aws/credentials"))
    task = Task(name="fit", argv=("python", "train.py"), timeout_seconds=5)
    spec = JobSpec(name="j", tasks=(task,), timeout_seconds=5, include_files=(".npmrc",))

    class Uploads:
        def upload_set(self, spec, *, project):
            return collect_upload(project, include_files=spec.include_files)

    assert dry_run("modal", Uploads(), spec, repo, as_json=False) == 0
    out = capsys.readouterr().out
    held = ", ".join(sorted({*HELD_BACK, ".aws/credentials", ".cache/huggingface/token"}))
    assert f"Held back as secrets: {held} (name one in the job's include_files" in out
    assert ".npmrc" in out.split("Held back")[0]


@pytest.mark.parametrize("git", [True, False], ids=["git", "walk"])
def test_state_directories_inside_the_project_are_never_uploaded(tmp_path, monkeypatch, git):
    """Hostile finding: a local `state_dir = ".substrax-state"` (or a relative
    SUBSTRAX_STATE_DIR) in the project sent every earlier run's outputs, logs, spec.json and
    manifest.json to Modal and SkyPilot."""
    root = _tree(tmp_path / "repo")
    pyproject = root / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text()
        + '[tool.substrax.compute.backends.local]\nstate_dir = ".substrax-state"\n'
        + '[tool.substrax.compute.backends.skypilot]\nstate_dir = "sky/state"\n'
    )
    if git:
        if shutil.which("git") is None:
            pytest.skip("git is not installed")
        _git(root, "init", "-q")
    runs = {
        ".substrax-state/runs/r-1/outputs/t/result.txt": "42",
        ".substrax-state/runs/r-1/worker.log": "log",
        "relstate/compute/runs/r-1.json": "{}",
        "sky/state/uploads/r-2/train.py": "copy",
        "modal-state/cancelled/r-3": "",
        "sky/keep.py": "code",
    }
    for name, text in runs.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    monkeypatch.chdir(root)
    monkeypatch.setenv("SUBSTRAX_STATE_DIR", "relstate")  # taken from the working directory
    upload = collect_upload(root, state_dirs=(root / "modal-state",))
    assert upload.files == tuple(sorted([*UPLOADED, "sky/keep.py"]))
    monkeypatch.setenv("SUBSTRAX_STATE_DIR", str(root))  # the project itself: not left out whole
    files = collect_upload(root).files
    assert "train.py" in files
    # a third pass: but its compute/ folder, earlier runs' records and outputs, was uploaded
    (root / "compute" / "runs").mkdir(parents=True)
    (root / "compute" / "runs" / "r-4.json").write_text("{}")
    assert "compute/runs/r-4.json" not in collect_upload(root).files
