"""The pieces of the ``skypilot`` backend's task: its name and its ``setup`` and ``run`` commands.

``cluster_name`` names the task and its cluster after the run, uniquely and within SkyPilot's
rules; ``setup_script`` syncs the locked project with uv; ``run_script`` starts the worker with
the jax coordinator on the first of ``SKYPILOT_NODE_IPS``.
"""

import hashlib
import re
import shlex

from ._spec import JobSpec


COORDINATOR_PORT = 8476
SPEC_ENV = "SUBSTRAX_JOB_SPEC"
WORKER_PYTHON = "uv run --frozen --no-sync python"
"""The default ``worker_python``: the interpreter of the project ``setup`` synced."""
CLUSTER_NAME_MAX = 63
"""The longest cluster name ``cluster_name`` gives (a label value's limit; SkyPilot shortens
the name it gives each cloud itself)."""
_RUN_SUFFIX = len("20260101T000000Z-abcdef")


def setup_script(spec: JobSpec) -> str:
    """The setup commands: install uv when missing, then sync the locked project with extras.

    Example:
        >>> from substrax.compute import JobSpec
        >>> from substrax.compute._skypilot_task import setup_script
        >>> spec = JobSpec.model_validate_json(
        ...     '{"name": "j", "timeout_seconds": 1, "extras": ["cuda12"],'
        ...     ' "tasks": [{"name": "t", "argv": ["python"], "timeout_seconds": 1}]}'
        ... )
        >>> setup_script(spec).splitlines()[-1]
        'uv sync --frozen --extra cuda12'
    """
    sync = ["uv", "sync", "--frozen"]
    for extra in spec.extras:
        sync += ["--extra", extra]
    return "\n".join(
        [
            "set -euo pipefail",
            "command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh",
            'export PATH="$HOME/.local/bin:$PATH"',
            shlex.join(sync),
        ]
    )


def cluster_name(run_id: str) -> str:
    """The run's cluster (and task) name, valid for SkyPilot and never another run's.

    It is ``sx-<run id>`` in lower case, each run of characters other than letters and digits
    one ``-``. Past ``CLUSTER_NAME_MAX`` characters it is ``sx-``, the start of the job name, a
    hash of the whole run id, and the run id's time and random suffix, which are always kept.

    Example:
        >>> from substrax.compute._skypilot_task import cluster_name
        >>> cluster_name("train_v2-20260101T000000Z-abcdef")
        'sx-train-v2-20260101t000000z-abcdef'
        >>> cluster_name("x" * 60 + "-20260101T000000Z-abcdef")
        'sx-xxxxxxxxxxxxxxxxxxxxxxxxxxx-2d62b044-20260101t000000z-abcdef'
    """
    slug = re.sub(r"[^a-z0-9]+", "-", run_id.lower()).strip("-")
    name = f"sx-{slug}".rstrip("-")
    if len(name) <= CLUSTER_NAME_MAX:
        return name
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    tail = slug[-_RUN_SUFFIX:].strip("-")
    head = slug[: CLUSTER_NAME_MAX - len(f"sx---{digest}") - len(tail)].strip("-")
    return "-".join(part for part in ("sx", head, digest, tail) if part)


def run_script(run_id: str, worker_python: str = WORKER_PYTHON) -> str:
    """The run commands: the spec from the environment, the jax coordinator, then the worker.

    Example:
        >>> from substrax.compute._skypilot_task import run_script
        >>> run_script("r", "/opt/venv/bin/python").splitlines()[-1].split(" --spec")[0]
        '/opt/venv/bin/python -m substrax.compute.worker'
    """
    outputs = shlex.quote(f"/outputs/{run_id}")
    return "\n".join(
        [
            "set -euo pipefail",
            'export PATH="$HOME/.local/bin:$PATH"',
            f'spec="$(mktemp)"; printf "%s" "${SPEC_ENV}" > "$spec"',
            'export JAX_COORDINATOR_ADDRESS="$(echo "$SKYPILOT_NODE_IPS" | head -n1)'
            f':{COORDINATOR_PORT}"',
            'export JAX_NUM_PROCESSES="$SKYPILOT_NUM_NODES"',
            'export JAX_PROCESS_ID="$SKYPILOT_NODE_RANK"',
            f'{worker_python} -m substrax.compute.worker --spec "$spec" '
            f'--project . --outputs {outputs} --node-rank "$SKYPILOT_NODE_RANK"',
        ]
    )
