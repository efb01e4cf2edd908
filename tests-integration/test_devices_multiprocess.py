"""substrax.devices' batch placement across two jax processes on 127.0.0.1, 4 CPU devices each.

``shard_batch_dim`` over a global mesh assembles the global batch from each process's rows;
``distribute_batch`` and ``replicate_across_devices`` stay on the calling process's devices.
"""

import textwrap

from substrax.runtime import JaxRuntime
from substrax.testing import run_distributed


WORKER = textwrap.dedent(
    """
    import json
    import numpy as np

    from substrax.runtime import initialize_distributed
    info = initialize_distributed(initialization_timeout=90, heartbeat_timeout=60)  # load is no dead peer
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    from substrax.devices import distribute_batch, replicate_across_devices, shard_batch_dim
    from substrax.mesh import create_device_mesh

    assert (jax.process_count(), jax.local_device_count(), jax.device_count()) == (2, 4, 8)
    mesh = create_device_mesh({"data": 8})
    global_x = np.arange(16 * 3, dtype=np.float32).reshape(16, 3)
    # the rows this process's devices hold, in order: what its data loader would yield
    index = NamedSharding(mesh, P("data")).addressable_devices_indices_map((16, 3))
    starts = sorted({idx[0].start for idx in index.values()})
    rows = np.concatenate([np.arange(s, s + 2) for s in starts])
    placed = shard_batch_dim({"x": global_x[rows], "tag": "train"}, mesh)
    gather = jax.jit(lambda a: a, out_shardings=NamedSharding(mesh, P()))
    local = distribute_batch({"x": global_x[rows]})["x"]
    weights = replicate_across_devices(np.ones(3, np.float32))
    print(json.dumps({
        "process": info.process_id,
        "global_shape": list(placed["x"].shape),
        "global": not placed["x"].is_fully_addressable,
        "assembled_equal": bool(np.array_equal(np.asarray(gather(placed["x"])), global_x)),
        "tag": placed["tag"],
        "local_shape": list(local.shape),
        "local_devices": sorted(d.id for d in local.devices()),
        "local_equal": bool(np.array_equal(np.asarray(local), global_x[rows])),
        "weight_devices": sorted(d.id for d in weights.devices()),
        "mine": sorted(d.id for d in jax.local_devices()),
    }))
    """
)


def test_two_processes_shard_a_global_batch_and_keep_local_placement_local():
    runs = run_distributed(WORKER, num_processes=2, runtime=JaxRuntime(cpu_devices=4), timeout=240)
    outputs = [run.check().last_json() for run in runs]
    assert [o["process"] for o in outputs] == [0, 1]
    for o in outputs:
        assert o["global_shape"] == [16, 3]
        assert o["global"]
        assert o["assembled_equal"]
        assert o["tag"] == "train"
        assert o["local_shape"] == [8, 3]
        assert o["local_equal"]
        assert o["local_devices"] == o["weight_devices"] == o["mine"]
    assert set(outputs[0]["mine"]).isdisjoint(outputs[1]["mine"])
