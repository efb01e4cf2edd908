import numpy as np
import pytest


@pytest.fixture(scope="session")
def host_batches():
    rng = np.random.default_rng(0)
    return [
        {
            "x": rng.normal(size=(16, 8)).astype(np.float32),
            "y": rng.normal(size=(16, 1)).astype(np.float32),
        }
        for _ in range(3)
    ]
