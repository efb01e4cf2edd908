"""Corrupt reads (``_corrupt_reads``): TensorStore's reports of bad stored bytes found in an
error's causes, and turned into ``CheckpointCorruptError`` naming step, item, leaf and file.
End to end (flipped bits, missing chunks) is in test_checkpoint_integrity and _damage."""

from pathlib import Path

import jax
import orbax.checkpoint as ocp
import pytest

from substrax.checkpoint import CheckpointCorruptError
from substrax.checkpoint._corrupt_reads import corrupt_error, corruption


REPORT = 'DATA_LOSS: Error reading "zarr3" at file "/s/7/model/w/c/0" [source locations]'


def test_a_report_is_found_in_the_causes_of_orbax_plain_exception():
    report = ValueError(REPORT)
    wrapped = Exception("orbax: reading failed")  # what `raise Exception(...) from report` makes
    wrapped.__cause__ = report
    assert corruption(wrapped) is report
    context = RuntimeError("raised while handling it")
    context.__context__ = wrapped
    assert corruption(context) is report


@pytest.mark.parametrize(
    "error",
    [
        ValueError("template for item 'model' does not match"),
        OSError("DATA_LOSS: not a ValueError, so not TensorStore's report"),
    ],
)
def test_other_errors_are_not_corruption(error):
    assert corruption(error) is None


def test_the_error_names_step_item_leaf_and_the_file_reported():
    info = ocp.type_handlers.ParamInfo(
        name="w",
        keypath=(jax.tree_util.DictKey("tree"), jax.tree_util.DictKey("w")),
        parent_dir=Path("/s/7/model"),
        ts_context=None,
    )
    error = corrupt_error(info, ValueError(REPORT))
    assert isinstance(error, CheckpointCorruptError)
    assert (error.step, error.item, error.leaf) == (7, "model", "tree/w")
    assert (error.directory, error.path) == (Path("/s"), Path("/s/7/model/w/c/0"))
    assert error.detail == 'DATA_LOSS: Error reading "zarr3" at file "/s/7/model/w/c/0"'
