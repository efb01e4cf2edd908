import pytest
from pydantic import TypeAdapter, ValidationError

from substrax.typing import Checkpointable, CheckpointState, JsonValue, PyTree


class Iterator:
    def __init__(self):
        self.position = 0

    def get_state(self) -> CheckpointState:
        return {"position": self.position}

    def set_state(self, state: CheckpointState, /) -> None:
        self.position = state["position"]


def test_checkpointable_is_structural():
    assert isinstance(Iterator(), Checkpointable)
    assert not isinstance(object(), Checkpointable)

    class OnlyGet:
        def get_state(self):
            return {}

    assert not isinstance(OnlyGet(), Checkpointable)


def test_json_value_is_a_recursive_alias_pydantic_validates():
    adapter = TypeAdapter(JsonValue)
    value = {"a": [1, 2.5, "x", None, True, {"b": []}]}
    assert adapter.validate_python(value) == value
    with pytest.raises(ValidationError):
        adapter.validate_python({"a": object()})
    assert JsonValue.__value__ is not None


def test_pytree_is_any():
    assert PyTree is __import__("typing").Any  # as 0.1.22 had it: `PyTree = Any`
