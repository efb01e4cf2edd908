"""substrax.nnx_typing: the aliases at run time, in annotations, and under pyright strict."""

import json
import subprocess
import sys
import typing
from pathlib import Path

import jax
import pytest
from flax import nnx
from jax.tree_util import DictKey, FlattenedIndexKey, GetAttrKey, SequenceKey

import substrax.nnx_typing
from substrax.nnx_typing import KeyPath, NnxState, PathEntry, path_entry_key


ROOT = Path(__file__).resolve().parents[3]


def _leaf_names(state: NnxState) -> list[str]:
    paths: list[KeyPath] = [path for path, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    return sorted(".".join(str(path_entry_key(entry)) for entry in path) for path in paths)


class _Block(nnx.Module):
    def __init__(self) -> None:
        self.layers = nnx.List([nnx.Linear(2, 2, rngs=nnx.Rngs(0)) for _ in range(2)])


def test_the_module_path_and_its_names():
    assert substrax.nnx_typing.__all__ == ["KeyPath", "NnxState", "PathEntry", "path_entry_key"]
    assert typing.get_origin(NnxState.__value__) is nnx.State
    assert typing.get_args(KeyPath.__value__) == (PathEntry, ...)


def test_nnx_state_annotates_a_real_state_and_resolves():
    state = nnx.state(_Block())
    assert isinstance(state, nnx.State)
    assert _leaf_names(state) == [
        "layers.0.bias.value",
        "layers.0.kernel.value",
        "layers.1.bias.value",
        "layers.1.kernel.value",
    ]
    hints = typing.get_type_hints(_leaf_names)
    assert hints == {"state": NnxState, "return": list[str]}


def test_path_entry_is_a_union_isinstance_accepts():
    entries = [DictKey("w"), SequenceKey(3), GetAttrKey("kernel"), FlattenedIndexKey(1)]
    assert all(isinstance(entry, PathEntry) for entry in entries)
    assert not isinstance("w", PathEntry)
    assert [path_entry_key(entry) for entry in entries] == ["w", 3, "kernel", 1]
    assert path_entry_key(DictKey(7)) == 7
    with pytest.raises(TypeError, match="not a jax key-path entry"):
        path_entry_key("w")  # pyright: ignore[reportArgumentType]


_TYPED_USE = """
import jax
from flax import nnx

from substrax.nnx_typing import KeyPath, NnxState, path_entry_key


def names(state: NnxState) -> list[str]:
    paths: list[KeyPath] = [p for p, _ in jax.tree_util.tree_flatten_with_path(state)[0]]
    return [".".join(str(path_entry_key(e)) for e in p) for p in paths]


state: NnxState = nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0)))
print(names(state))
wrong: NnxState = 3
"""


@pytest.mark.usefixtures("child_processes")
def test_pyright_strict_accepts_a_state_and_refuses_anything_else(tmp_path):
    program = tmp_path / "typed_use.py"
    program.write_text(_TYPED_USE)
    result = subprocess.run(
        [sys.executable, "scripts/typecheck.py", "--outputjson", str(program)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    errors = [
        (d["range"]["start"]["line"] + 1, d["rule"])
        for d in json.loads(result.stdout)["generalDiagnostics"]
        if d["severity"] == "error"
    ]
    wrong_line = _TYPED_USE.splitlines().index("wrong: NnxState = 3") + 1
    assert errors == [(wrong_line, "reportAssignmentType")], result.stdout
