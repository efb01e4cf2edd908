"""Shared helpers for substrax-runtime's tests."""

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import pytest


def _child_env(extra: Mapping[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "XLA_"))}
    env.update(extra or {})
    return env


def run_child(program: str, *, env: Mapping[str, str] | None = None, timeout: float = 120) -> Any:
    """Run ``program`` in a fresh interpreter; return the JSON on its last stdout line."""
    result = subprocess.run(
        [sys.executable, "-c", program],
        env=_child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def child():
    return run_child
