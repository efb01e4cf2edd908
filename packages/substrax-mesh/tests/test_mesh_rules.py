import pytest
from jax.sharding import PartitionSpec as P

from substrax.mesh import (
    LogicalAxisRules,
    MeshRules,
    UnknownLogicalAxisError,
    as_logical_rules,
    create_device_mesh,
    create_named_sharding,
    data_parallel_rules,
    fsdp_rules,
    partition_spec_for_names,
)


def test_mesh_rules_call_and_presets():
    assert data_parallel_rules()("data", "embed") == ("data", None)
    assert fsdp_rules("d", "m")("data", "embed", "mlp", "heads") == ("d", "m", "m", "m")
    with pytest.raises(UnknownLogicalAxisError, match="'vocab' is not in the rules") as info:
        MeshRules(data="data")("vocab")
    assert info.value.name == "vocab"
    assert "heads" in info.value.known


def test_mesh_rules_is_frozen_and_keyword_only():
    rules = MeshRules(data="data")
    with pytest.raises(AttributeError):
        rules.data = "x"  # type: ignore[misc]
    with pytest.raises(TypeError):
        MeshRules("data")  # type: ignore[misc]


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        (3, TypeError, r"logical axis 'mlp' maps to 3 \(int\); use a mesh axis name"),
        (("model", 1), TypeError, r"logical axis 'mlp' maps to \('model', 1\)"),
        ("", ValueError, r"logical axis 'mlp' maps to '', an empty mesh axis name"),
        (("model", ""), ValueError, r"logical axis 'mlp' maps to \('model', ''\), an empty"),
    ],
)
def test_mesh_rules_refuse_what_is_not_a_mesh_axis_naming_the_field(bad, error, match):
    with pytest.raises(error, match=match):
        MeshRules(data="data", mlp=bad)


def test_mesh_rules_keep_several_axes_as_a_hashable_tuple():
    rules = MeshRules(data=["replica", "data"])  # type: ignore[arg-type]
    assert rules.data == ("replica", "data")
    assert rules("data") == (("replica", "data"),)
    assert hash(rules) == hash(MeshRules(data=("replica", "data")))  # type: ignore[arg-type]


def test_logical_axis_rules_is_an_open_mapping():
    rules = LogicalAxisRules([("batch", ("data", "fsdp")), ("vocab", "model"), ("embed", None)])
    assert rules("batch", "vocab", None) == (("data", "fsdp"), "model", None)
    assert rules.spec("vocab", "embed") == P("model", None)
    assert dict(rules) == {"batch": ("data", "fsdp"), "vocab": "model", "embed": None}
    assert rules.to_flax() == (("batch", ("data", "fsdp")), ("vocab", "model"), ("embed", None))
    assert as_logical_rules(rules) is rules
    assert as_logical_rules(fsdp_rules())["mlp"] == "model"
    assert as_logical_rules({"x": "data"}) == LogicalAxisRules({"x": "data"})


def test_logical_axis_rules_refusals():
    with pytest.raises(ValueError, match="mapped twice"):
        LogicalAxisRules([("a", "data"), ("a", "model")])
    with pytest.raises(TypeError, match="maps to 3"):
        LogicalAxisRules({"a": 3})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("rules", "error", "match"),
    [
        (None, TypeError, r"rules=None \(NoneType\) must be a mapping from logical axis names"),
        ("batch", TypeError, r"rules='batch' \(str\) must be a mapping"),
        ([1], TypeError, r"rules must be \(name, mesh axes\) pairs; got 1 \(int\)"),
        ([("a", "b", "c")], TypeError, r"pairs; got \('a', 'b', 'c'\)"),
        ({3: "data"}, TypeError, r"logical axis name 3 \(int\) must be a non-empty str"),
        ({"": "data"}, ValueError, r"logical axis name '' must be a non-empty str"),
        ({"batch": ""}, ValueError, r"logical axis 'batch' maps to '', an empty mesh axis"),
    ],
)
def test_logical_axis_rules_refuse_malformed_entries_naming_them(rules, error, match):
    with pytest.raises(error, match=match):
        LogicalAxisRules(rules)
    assert LogicalAxisRules([["batch", "data"]]) == {"batch": "data"}  # pairs as lists (JSON)


def test_partition_spec_for_names():
    assert partition_spec_for_names(fsdp_rules(), "data", "mlp") == P("data", "model")
    assert partition_spec_for_names({"rows": "data"}, "rows", None) == P("data", None)
    with pytest.raises(UnknownLogicalAxisError):
        partition_spec_for_names(data_parallel_rules(), "nope")


def test_create_named_sharding():
    mesh = create_device_mesh({"data": 2, "model": 4})
    assert create_named_sharding(mesh).spec == P()
    sharding = create_named_sharding(mesh, None, ("data", "model"))
    assert sharding.spec == P(None, ("data", "model"))
    assert sharding.mesh is mesh
    with pytest.raises(ValueError, match="'pipeline' is not an axis of the mesh"):
        create_named_sharding(mesh, "pipeline")
