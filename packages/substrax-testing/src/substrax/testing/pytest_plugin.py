"""Placeholder plugin: emulate 8 CPU devices until the full plugin lands."""

import os


def pytest_configure() -> None:
    """Emulate 8 CPU devices for the test session."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
