"""A run's outputs read from a bucket with the cloud's own command (``gcloud``, ``aws``).

``gs://`` goes through ``gcloud storage``, ``s3://`` through ``aws s3``, and ``r2://`` through
``aws s3`` at Cloudflare's endpoint, the way SkyPilot reaches R2: the endpoint
``https://<account id>.r2.cloudflarestorage.com`` (the account id is the first line of
``~/.cloudflare/accountid``), the ``r2`` profile, and ``~/.cloudflare/r2.credentials`` as the
credentials file. An object that is not there is told apart from one that cannot be read.
"""

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ._errors import BackendRequestError, FetchToolNotFoundError


R2_ACCOUNT_ID = "~/.cloudflare/accountid"
R2_CREDENTIALS = "~/.cloudflare/r2.credentials"
R2_PROFILE = "r2"
_NOT_FOUND = ("matched no objects", "(404)", "NoSuchKey")
"""What ``gcloud storage cat`` and ``aws s3 cp`` print for an object that is not there."""


@dataclass(frozen=True, slots=True)
class BucketCommand:
    """A command line that reads a bucket, and the environment it needs (None: this one's)."""

    argv: tuple[str, ...]
    env: dict[str, str] | None = None


def r2_endpoint(uri: str, *, backend: str) -> str:
    """Cloudflare's endpoint for this account's R2 buckets, as SkyPilot builds it.

    Raises:
        BackendRequestError: ``~/.cloudflare/accountid`` is missing, unreadable or empty.
    """
    path = Path(R2_ACCOUNT_ID).expanduser()
    try:
        account = next(iter(path.read_text().splitlines()), "").strip()
    except OSError as error:
        account, problem = "", f"{path} cannot be read ({error.strerror or error})"
    else:
        problem = f"{path} is empty"
    if not account:
        raise BackendRequestError(
            backend,
            f"reach the R2 bucket {uri}",
            f"{problem}: write your Cloudflare account id there and the {R2_PROFILE!r} profile in "
            f"{R2_CREDENTIALS}, as SkyPilot's R2 setup does (`sky check` verifies it)",
        )
    return f"https://{account}.r2.cloudflarestorage.com"


def _aws(verb: str, uri: str, *rest: str, backend: str) -> BucketCommand:
    if not uri.startswith("r2://"):
        return BucketCommand(("aws", "s3", verb, uri, *rest))
    endpoint = r2_endpoint(uri, backend=backend)
    argv = ("aws", "s3", verb, f"s3://{uri.removeprefix('r2://')}", *rest)
    credentials = str(Path(R2_CREDENTIALS).expanduser())
    return BucketCommand(
        (*argv, "--endpoint-url", endpoint, "--profile", R2_PROFILE),
        {**os.environ, "AWS_SHARED_CREDENTIALS_FILE": credentials},
    )


def read_command(uri: str, *, backend: str) -> BucketCommand:
    """The command that prints the object at ``uri``.

    Example:
        >>> from substrax.compute._buckets import read_command
        >>> read_command("gs://b/run/manifest.json", backend="skypilot").argv
        ('gcloud', 'storage', 'cat', 'gs://b/run/manifest.json')
    """
    if uri.startswith("gs://"):
        return BucketCommand(("gcloud", "storage", "cat", uri))
    return _aws("cp", uri, "-", backend=backend)


def sync_command(uri: str, target: Path, *, backend: str) -> BucketCommand:
    """The command that copies everything under ``uri`` into ``target``."""
    if uri.startswith("gs://"):
        return BucketCommand(("gcloud", "storage", "rsync", "--recursive", uri, str(target)))
    return _aws("sync", uri, str(target), backend=backend)


def read_object(uri: str, *, backend: str, what: str) -> str | None:
    """The text of the object at ``uri``, or None when the bucket has no such object.

    Raises:
        BackendRequestError: The object could not be read (no CLI, no credentials, no network,
            a refusal); ``what`` says what was being read.
    """
    command = read_command(uri, backend=backend)
    tool = command.argv[0]
    if shutil.which(tool) is None:
        raise BackendRequestError(
            backend, f"read {what}", f"the `{tool}` command is not on PATH; install it and log in"
        )
    try:
        done = subprocess.run(
            command.argv, capture_output=True, text=True, check=False, timeout=120, env=command.env
        )
    except (OSError, subprocess.SubprocessError) as error:
        raise BackendRequestError.of(backend, f"read {what}", error) from error
    if done.returncode == 0:
        return done.stdout
    if any(marker in done.stderr for marker in _NOT_FOUND):
        return None
    said = " ".join(done.stderr.split())[-300:] or "no message"
    raise BackendRequestError(backend, f"read {what}", f"`{tool}` exited {done.returncode}: {said}")


def sync_to(uri: str, target: Path, *, backend: str) -> None:
    """Copy everything under ``uri`` into ``target`` (an hour at most).

    Raises:
        FetchToolNotFoundError: The cloud's command is not on ``PATH``.
        BackendRequestError: The copy failed.
    """
    command = sync_command(uri, target, backend=backend)
    if shutil.which(command.argv[0]) is None:
        raise FetchToolNotFoundError(command.argv[0], uri)
    try:
        subprocess.run(command.argv, check=True, timeout=3600, env=command.env)
    except (OSError, subprocess.SubprocessError) as error:
        raise BackendRequestError.of(backend, f"copy {uri} to {target}", error) from error
