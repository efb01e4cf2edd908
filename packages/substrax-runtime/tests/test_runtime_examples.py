import pytest

from substrax.examples import ExamplesRootNotADirectoryError, discover_examples


@pytest.fixture
def tree(tmp_path):
    for name in (
        "b.py",
        "a.py",
        "sub/c.py",
        "sub/_private.py",
        "_hidden/d.py",
        "notes.md",
        "sub/deep/e.py",
    ):
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    return tmp_path


def test_every_script_sorted_skipping_underscore_parts(tree):
    found = discover_examples(tree)
    assert [p.relative_to(tree).as_posix() for p in found] == [
        "a.py",
        "b.py",
        "sub/c.py",
        "sub/deep/e.py",
    ]


def test_underscore_above_root_does_not_matter(tmp_path):
    root = tmp_path / "_examples"
    root.mkdir()
    (root / "x.py").write_text("")
    assert discover_examples(str(root)) == [root / "x.py"]


def test_include_patterns(tree):
    found = discover_examples(tree, include=["sub/*", "a.py"])
    assert [p.relative_to(tree).as_posix() for p in found] == ["a.py", "sub/c.py", "sub/deep/e.py"]
    assert discover_examples(tree, include=[]) == []


def test_errors(tree):
    with pytest.raises(ExamplesRootNotADirectoryError, match="is not a directory") as info:
        discover_examples(tree / "missing")
    assert isinstance(info.value, NotADirectoryError)
    assert info.value.root == tree / "missing"
    with pytest.raises(TypeError, match="iterable of patterns"):
        discover_examples(tree, include="a.py")
    with pytest.raises(ValueError, match="names no directory"):  # not the working directory
        discover_examples("")
