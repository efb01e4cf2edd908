"""datarax 0.1.17's ``IteratorCheckpoint`` saving an iterator state, then restoring it; a JSON line.

Run by test_siblings.py in the siblings' environment: ``python datarax_iterator_state.py
{save|restore} ROOT`` saves (for ``save``) a state of NumPy int64, uint64, uint32, float64 and
bool values and a Python int past 2**32 as the ``data_iterator`` item of substrax's store, then
restores it into a fresh iterator without a template, and prints what was saved and restored.
"""

import json
import sys
from pathlib import Path

import datarax
import jax
import numpy as np
from datarax.checkpoint import IteratorCheckpoint

import substrax.checkpoint


class Iterator:
    def __init__(self, state):
        self.state = state

    def get_state(self):
        return dict(self.state)

    def set_state(self, state):
        self.state = dict(state)


def saved_state():
    return {
        "sampler_repr": "SequentialSampler(num_records=6)",
        "epoch": 2,
        "position": 2**40 + 3,
        "order": np.arange(6, dtype=np.int64) * 2**33 + 1,
        "seed": np.uint64(2**64 - 1),
        "rng_state": np.array([2**32 - 1, 7], np.uint32),
        "weights": np.array([0.1, 1e300], np.float64),
        "done": np.array([True, False]),
    }


def describe(state):
    return {
        key: [
            type(value).__name__,
            str(getattr(value, "dtype", "")),
            repr(np.asarray(value).tolist()),
        ]
        for key, value in sorted(state.items())
    }


mode, root = sys.argv[1], Path(sys.argv[2])
if mode == "save":
    with IteratorCheckpoint(root, max_to_keep=2) as checkpoint:
        checkpoint.save(Iterator(saved_state()), 5, epoch=2)
with IteratorCheckpoint(root, max_to_keep=2) as checkpoint:
    fresh = Iterator({"sampler_repr": "SequentialSampler(num_records=6)"})
    checkpoint.restore(fresh)
print(
    json.dumps(
        {
            "restored": describe(fresh.state),
            "saved": describe(saved_state()),
            "x64": bool(jax.config.jax_enable_x64),
            "datarax": datarax.__version__,
            "substrax": substrax.checkpoint.__file__,
        }
    )
)
