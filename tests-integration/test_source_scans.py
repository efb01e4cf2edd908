"""The repository's own sources, read by substrax.testing.source_scans: what the house rules forbid.

A library leaves the process to its entry point: no part writes the environment or configures
logging when imported, and only entry points (a CLI's main, ``configure_entry_point_logging``)
do either at all. Every ``make_mesh(`` a user reads names its axis types (jax's default became
``Explicit`` in 0.11), and an example builds its mesh when run, never when imported.
"""

import ast
from pathlib import Path

import pytest

from substrax.testing.source_scans import (
    SourceText,
    configures_logging,
    documented_texts,
    import_time_lines,
    is_main_guard,
    matching_lines,
    python_files,
    unguarded_make_mesh_calls,
    writes_environment,
)


ROOT = Path(__file__).resolve().parents[1]
PARTS = sorted(ROOT.glob("packages/*/src"))
SOURCES = [path for part in PARTS for path in python_files(part)]
EXAMPLES = python_files(ROOT / "examples")
PREDICATES = {"writes_environment": writes_environment, "configures_logging": configures_logging}
# (file under packages/, function) where a part may change process-wide state: its entry points.
ALLOWED = {
    "configures_logging": {
        ("substrax-runtime/src/substrax/runtime/_logging.py", "configure_entry_point_logging"),
        ("substrax-tracking/src/substrax/tracking/_cli.py", "exit_with_main"),
    },
    "writes_environment": set[tuple[str, str]](),
}
# The check's own docstring and docs section show calls it finds, on purpose: (path, scope).
SHOWN_ON_PURPOSE = {
    ("packages/substrax-testing/src/substrax/testing/_mesh_calls.py", "unguarded_make_mesh_calls"),
    ("docs/packages/testing.md", ""),
}


def _calls_make_mesh(node: ast.AST) -> bool:
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name == "make_mesh"


def test_the_scans_see_every_part():
    assert len(PARTS) >= 7
    assert len(SOURCES) > 100
    assert EXAMPLES


@pytest.mark.parametrize("check", sorted(PREDICATES))
def test_no_part_changes_process_state_when_imported(check):
    found = [str(hit) for path in SOURCES for hit in import_time_lines(path, PREDICATES[check])]
    assert found == []


@pytest.mark.parametrize("check", sorted(PREDICATES))
def test_only_entry_points_change_process_state(check):
    found: list[SourceText] = [
        hit for path in SOURCES for hit in matching_lines(path, PREDICATES[check])
    ]
    places = {
        (Path(hit.path).relative_to(ROOT / "packages").as_posix(), hit.scope): hit for hit in found
    }
    outside = [str(places[place]) for place in sorted(places.keys() - ALLOWED[check])]
    assert outside == [], f"{check} outside an entry point"


def test_every_example_builds_its_mesh_when_run_not_when_imported():
    found = [str(hit) for path in EXAMPLES for hit in import_time_lines(path, _calls_make_mesh)]
    assert found == []
    unguarded = [
        path.name
        for path in EXAMPLES
        if not any(is_main_guard(node) for node in ast.parse(path.read_text()).body)
    ]
    assert unguarded == [], "examples without an `if __name__ == '__main__':` block"


def test_every_documented_make_mesh_call_names_its_axis_types():
    texts = [
        text
        for part in PARTS
        for text in documented_texts(
            ROOT,
            package=part,
            pages=sorted(part.parent.glob("README.md")),
            page_directories=["docs"] if part == PARTS[0] else [],
            script_directories=["examples"] if part == PARTS[0] else [],
        )
    ]
    texts += documented_texts(ROOT, package="examples", pages=["README.md"])
    assert {text.path.partition("/")[0] for text in texts} >= {"docs", "examples", "packages"}
    found = [hit for text in texts for hit in unguarded_make_mesh_calls(text)]
    assert [str(hit) for hit in found if (hit.path, hit.scope) not in SHOWN_ON_PURPOSE] == []
    assert {(hit.path, hit.scope) for hit in found} == SHOWN_ON_PURPOSE  # the check sees them
