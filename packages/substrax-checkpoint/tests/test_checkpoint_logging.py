"""The store leaves absl's logger alone; ``quiet_orbax_notices`` is the documented opt-in."""

import pytest

from substrax.testing import run_python


_CHILD = """
import json, logging, sys
import numpy as np
from substrax.checkpoint import OrbaxCheckpointStore, quiet_orbax_notices

absl = logging.getLogger("absl")
with OrbaxCheckpointStore(sys.argv[1], async_save=False) as store:
    store.save(1, {"model": {"w": np.zeros(2)}})
with OrbaxCheckpointStore(sys.argv[1], read_only=True) as reader:
    reader.restore(1)
untouched = list(absl.filters)
quiet_orbax_notices()
quiet_orbax_notices()
print(json.dumps({"before": len(untouched), "after": len(absl.filters)}))
"""


@pytest.mark.usefixtures("child_processes")
def test_only_an_opt_in_filters_the_absl_logger(store_dir):
    done = run_python(_CHILD, str(store_dir), timeout=120).check()
    assert done.last_json() == {"before": 0, "after": 1}
    assert "save_interval_steps=0" in done.stderr  # orbax's own notice, shown by default
