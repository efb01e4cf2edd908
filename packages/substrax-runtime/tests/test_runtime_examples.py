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


def test_an_include_pattern_drops_a_leading_dot_slash(tree):
    found = discover_examples(tree, include=["./a.py", "././sub/c.py"])
    assert [p.relative_to(tree).as_posix() for p in found] == ["a.py", "sub/c.py"]


def test_an_include_pattern_that_matches_no_example_is_refused_naming_it(tree):
    with pytest.raises(ValueError, match=r"include pattern\(s\) 'nope\.py', '_hidden/\*' match no"):
        discover_examples(tree, include=["a.py", "nope.py", "_hidden/*"])
    with pytest.raises(TypeError, match="include patterns must be str, got 3"):
        discover_examples(tree, include=["a.py", 3])  # pyright: ignore[reportArgumentType]


def test_errors(tree):
    with pytest.raises(ExamplesRootNotADirectoryError, match="is not a directory") as info:
        discover_examples(tree / "missing")
    assert isinstance(info.value, NotADirectoryError)
    assert info.value.root == tree / "missing"
    with pytest.raises(TypeError, match="iterable of patterns"):
        discover_examples(tree, include="a.py")
    with pytest.raises(ValueError, match="names no directory"):  # not the working directory
        discover_examples("")


def test_hidden_files_and_directories_are_skipped(tree):
    for name in (".ipynb_checkpoints/a-checkpoint.py", "sub/.cache/f.py", ".hidden.py"):
        path = tree / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("")
    found = [p.relative_to(tree).as_posix() for p in discover_examples(tree)]
    assert found == ["a.py", "b.py", "sub/c.py", "sub/deep/e.py"]


def test_symlinked_directories_are_followed_once_without_looping(tmp_path):
    root, outside = tmp_path / "examples", tmp_path / "outside"
    (root / "a").mkdir(parents=True)
    outside.mkdir()
    (root / "top.py").write_text("")
    (root / "a" / "x.py").write_text("")
    (outside / "o.py").write_text("")
    (root / "linked").symlink_to(outside, target_is_directory=True)
    (root / "a" / "loop").symlink_to(root, target_is_directory=True)  # back up: a loop
    (root / "broken").symlink_to(tmp_path / "nowhere", target_is_directory=True)
    found = [p.relative_to(root).as_posix() for p in discover_examples(root)]
    assert found == ["a/x.py", "linked/o.py", "top.py"]


def test_a_root_that_is_no_path_is_a_type_error():
    with pytest.raises(TypeError, match=r"root must be the examples directory .* got 3"):
        discover_examples(3)  # pyright: ignore[reportArgumentType]
