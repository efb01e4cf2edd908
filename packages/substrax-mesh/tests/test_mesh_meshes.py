import json

import jax
import numpy as np
import pytest
from jax.sharding import AxisType

from substrax.mesh import (
    DeviceMeshManager,
    MeshInfo,
    MeshShapeError,
    _meshes,
    create_device_mesh,
    create_multihost_mesh,
    mesh_info,
)


def test_mapping_and_pairs_give_the_same_auto_mesh():
    by_map = create_device_mesh({"data": 2, "model": 4})
    by_pairs = create_device_mesh([("data", 2), ("model", 4)])
    assert by_map.axis_names == by_pairs.axis_names == ("data", "model")
    assert dict(by_map.shape) == {"data": 2, "model": 4}
    assert by_map.axis_types == (AxisType.Auto, AxisType.Auto)
    assert list(by_map.devices.flat) == list(by_pairs.devices.flat)


def test_a_smaller_mesh_uses_the_first_devices():
    mesh = create_device_mesh({"data": 4})
    assert set(mesh.devices.flat) == set(jax.devices()[:4])


def test_a_smaller_mesh_is_warned_about_once_naming_the_devices_left_out(caplog, monkeypatch):
    # forget what earlier tests in this process were warned about
    monkeypatch.setattr(_meshes, "_warned_smaller", set())
    with caplog.at_level("WARNING", logger="substrax.mesh"):
        create_device_mesh({"data": 3})
        create_device_mesh({"data": 3})
        create_device_mesh({"data": 8})
    warnings = [r.getMessage() for r in caplog.records if "left out" in r.getMessage()]
    assert warnings == [
        "mesh shape {'data': 3} uses 3 of the 8 devices; the other 5 are left out and stay "
        "idle. Size the mesh to every device (e.g. {'data': jax.device_count()}), or pass "
        "devices= to choose them (said once per mesh size)"
    ]


def test_devices_given_are_never_told_to_pass_devices(caplog, monkeypatch):
    """A review as a 0.1.22 user: devices= given, the warning still said "pass devices= to
    choose them"; as many as the mesh takes warn of nothing."""
    monkeypatch.setattr(_meshes, "_warned_smaller", set())
    with caplog.at_level("WARNING", logger="substrax.mesh"):
        mesh = create_device_mesh({"data": 2}, devices=jax.devices()[2:4])
        create_device_mesh({"data": 2}, devices=jax.devices()[2:])
    assert list(mesh.devices.flat) == jax.devices()[2:4]
    assert [r.getMessage() for r in caplog.records] == [
        "mesh shape {'data': 2} takes the first 2 of the 6 devices given; pass as many as it takes"
    ]


def test_an_array_of_devices_is_read_in_its_order():
    """A second pass: mesh_utils' (2, 4) array of devices was read as 2 devices (and too few
    given were told to "pass devices=", which the caller had done: see the next test)."""
    grid = np.array(jax.devices()).reshape(2, 4)
    mesh = create_device_mesh({"data": 2, "model": 4}, devices=grid)
    assert mesh.devices.tolist() == grid.tolist()


def test_axis_types_are_honoured_and_checked():
    mesh = create_device_mesh({"data": 2}, axis_types=[AxisType.Explicit])
    assert mesh.axis_types == (AxisType.Explicit,)
    with pytest.raises(ValueError, match="axis_types has 2 entries for the 1 axes"):
        create_device_mesh({"data": 2}, axis_types=[AxisType.Auto, AxisType.Auto])


def test_too_many_devices_is_refused_with_shape_and_count():
    with pytest.raises(MeshShapeError) as info:
        create_device_mesh({"data": 16})
    assert str(info.value) == (
        "mesh shape {'data': 16} needs 16 devices; 8 are visible (set JAX_NUM_CPU_DEVICES or pass devices=)"
    )
    assert info.value.mesh_shape == {"data": 16}
    assert info.value.device_count == 8


def test_explicit_devices_are_counted():
    with pytest.raises(MeshShapeError, match="needs 4 devices; 2 were given in devices="):
        create_device_mesh({"data": 4}, devices=jax.devices()[:2])
    mesh = create_device_mesh({"data": 2}, devices=jax.devices()[6:])
    assert list(mesh.devices.flat) == jax.devices()[6:]


@pytest.mark.parametrize(
    ("shape", "error", "match"),
    [
        ({}, MeshShapeError, "mesh shape is empty"),
        ({"data": 0}, MeshShapeError, "has size=0 must be an integer >= 1"),
        ([("data", 2), ("data", 2)], MeshShapeError, "appears twice"),
        ([("data",)], TypeError, "pairs"),
    ],
)
def test_malformed_shapes_are_refused(shape, error, match):
    with pytest.raises(error, match=match):
        create_device_mesh(shape)


def test_manager_layouts():
    assert dict(DeviceMeshManager.create_data_parallel_mesh().shape) == {"data": 8}
    assert dict(DeviceMeshManager.create_data_parallel_mesh(2).shape) == {"data": 2}
    assert dict(DeviceMeshManager.create_model_parallel_mesh(4).shape) == {"model": 4}
    assert dict(DeviceMeshManager.create_hybrid_mesh(2, 4).shape) == {"data": 2, "model": 4}
    with pytest.raises(MeshShapeError, match="needs 16 devices"):
        DeviceMeshManager.create_model_parallel_mesh(16)
    with pytest.raises(MeshShapeError, match="needs 12 devices"):
        DeviceMeshManager.create_hybrid_mesh(3, 4)


def test_get_mesh_info_is_the_documented_plain_dict_json_accepts():
    mesh = DeviceMeshManager.create_hybrid_mesh(2, 4)
    info = DeviceMeshManager.get_mesh_info(mesh)
    assert type(info) is dict
    assert type(info["axes"]) is dict
    assert info == {"total_devices": 8, "axes": {"data": 2, "model": 4}}
    assert json.loads(json.dumps(info)) == info
    info["axes"]["data"] = 3  # a fresh dict each call: changing it changes nothing else
    assert DeviceMeshManager.get_mesh_info(mesh)["axes"] == {"data": 2, "model": 4}


def test_mesh_info_reads_like_the_documented_dict():
    info = mesh_info(DeviceMeshManager.create_hybrid_mesh(2, 4))
    assert isinstance(info, MeshInfo)
    assert info == {"total_devices": 8, "axes": {"data": 2, "model": 4}}
    assert info["total_devices"] == 8
    assert dict(info) == info.as_dict()
    assert str(info) == "{'total_devices': 8, 'axes': {'data': 2, 'model': 4}}"
    assert info.axes["model"] == 4
    with pytest.raises(TypeError):
        info.axes["data"] = 3  # type: ignore[index]


def test_multihost_mesh_on_one_process_is_the_plain_mesh():
    mesh = create_multihost_mesh({"data": 4, "model": 2})
    assert dict(mesh.shape) == {"data": 4, "model": 2}
    assert mesh.axis_types == (AxisType.Auto, AxisType.Auto)
    with pytest.raises(MeshShapeError, match="lacks"):
        create_multihost_mesh({"data": 4}, {"pipeline": 2})
    with pytest.raises(MeshShapeError, match="needs 16 devices"):
        create_multihost_mesh({"data": 8}, {"data": 2})


@pytest.mark.parametrize(
    ("ici", "dcn", "match"),
    [
        ({"data": 4}, {"data": 2}, r"stacks 2 processes, but the 8 devices span 1 processes"),
        ({"data": 8, "model": 1}, {"data": -1, "model": -1}, r"'data' has size=-1 .* >= 1"),
        ({"data": 8}, {"data": 0}, r"'data' has size=0 must be an integer >= 1"),
        ({"data": 4}, {"data": 2.0}, r"'data' has size=2.0 .*, not float"),
        ({"data": 4}, {"data": True}, r"'data' has size=True .*, not bool"),
    ],
)
def test_multihost_mesh_refuses_a_bad_dcn_shape_naming_it(ici, dcn, match):
    with pytest.raises(MeshShapeError, match=match) as info:
        create_multihost_mesh(ici, dcn)
    assert "dcn_shape" in str(info.value)
    with pytest.raises(TypeError, match="dcn_shape must be a mapping"):
        create_multihost_mesh({"data": 8}, [("data", 1)])  # pyright: ignore[reportArgumentType]


def test_a_dcn_shape_of_ones_over_devices_of_two_processes_is_refused():
    """Hostile finding: dcn {"data": 1} (a typo for 2) over two processes made a mesh of process
    0's devices: it trained on half the data, and process 1 failed on a bare StopIteration."""

    class Device:  # what the mesh reads of a device: its process (no TPU slice)
        def __init__(self, process_index: int) -> None:
            self.process_index = process_index

    devices = [Device(index // 4) for index in range(8)]
    with pytest.raises(MeshShapeError, match=r"stacks 1 processes, but the 8 devices span 2"):
        create_multihost_mesh({"data": 8}, {"data": 1}, devices=devices)
    with pytest.raises(MeshShapeError, match=r"needs 4 devices; 8 are visible"):
        create_multihost_mesh({"data": 4}, {"data": 1}, devices=devices)


@pytest.mark.parametrize("bad", [None, "data", {"data": 2}])
def test_mesh_info_refuses_what_is_not_a_mesh_naming_it(bad):
    with pytest.raises(TypeError, match=r"mesh must be a jax.sharding.Mesh"):
        DeviceMeshManager.get_mesh_info(bad)
    with pytest.raises(TypeError, match=rf"mesh must be .*, not {type(bad).__name__}"):
        mesh_info(bad)
