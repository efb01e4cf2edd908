"""The save path: validation, refusals decided once as a ``NotWrittenReason``, overwrites."""

import numpy as np
import pytest

from substrax.checkpoint import CheckpointNotWrittenError, NotWrittenReason, OrbaxCheckpointStore
from substrax.checkpoint._save import SaveRequest, refusal


def test_strict_writes(store_dir):
    items = {"model": {"w": np.zeros(2, np.float32)}}
    with OrbaxCheckpointStore(store_dir) as store:
        store.save(5, items)
        with pytest.raises(CheckpointNotWrittenError) as exists:
            store.save(5, items)
        assert (exists.value.reason, exists.value.step, exists.value.latest_step) == (
            "exists",
            5,
            5,
        )
        assert exists.value.reason is NotWrittenReason.EXISTS
        assert "pass overwrite=True" in str(exists.value)
        with pytest.raises(CheckpointNotWrittenError) as below:
            store.save(3, items)
        assert below.value.reason == "below_latest"
        assert below.value.reason in {"exists", "below_latest", "rejected"}
        store.save(5, {"model": {"w": np.ones(2, np.float32)}}, overwrite=True)
        assert store.restore(5).items["model"]["w"].tolist() == [1.0, 1.0]
        with pytest.raises(ValueError, match=r"step=-1 must be an integer >= 0"):
            store.save(-1, items)
        with pytest.raises(TypeError, match=r"step=True must be an integer >= 0, not bool"):
            store.save(True, items)
        with pytest.raises(ValueError, match="unknown checkpoint item"):
            store.save(6, {"weights": 1})
        with pytest.raises(ValueError, match="at least one item"):
            store.save(6, {})
        with pytest.raises(ValueError, match="reserved"):
            store.save(6, items, extra={"step": 1})
        assert store.list_steps() == [5]


@pytest.mark.parametrize(
    ("step", "steps", "overwrite", "expected"),
    [
        (1, [], False, None),
        (6, [1, 5], False, None),
        (5, [1, 5], False, NotWrittenReason.EXISTS),
        (5, [1, 5], True, None),
        (1, [1, 5], True, NotWrittenReason.BELOW_LATEST),
        (3, [1, 5], False, NotWrittenReason.BELOW_LATEST),
        (3, [1, 5], True, NotWrittenReason.BELOW_LATEST),
    ],
)
def test_one_refusal_per_save(step, steps, overwrite, expected):
    assert refusal(step, steps, overwrite=overwrite) is expected


def test_a_reason_is_its_string_and_says_what_to_do():
    assert [reason.value for reason in NotWrittenReason] == ["exists", "below_latest", "rejected"]
    error = CheckpointNotWrittenError(step=2, latest_step=4, reason="rejected")
    assert error.reason is NotWrittenReason.REJECTED
    assert str(error).endswith(NotWrittenReason.REJECTED.advice)
    with pytest.raises(ValueError, match="'later'"):
        CheckpointNotWrittenError(step=2, latest_step=4, reason="later")  # type: ignore[arg-type]


def test_a_request_holds_what_orbax_writes():
    request = SaveRequest.build(
        3,
        {"model": {"w": np.float32(2.0)}},
        epoch=1,
        metrics={"loss": 1},
        producer=None,
        extra={"note": "x"},
    )
    assert request.items["model"]["w"].shape == ()  # a NumPy scalar saved as a 0-d array
    assert request.dtypes["model"] == {"w": "float32"}
    assert (request.entry().epoch, dict(request.entry().metrics)) == (1, {"loss": 1.0})
    assert sorted(request.orbax_args(request.items)) == ["dtypes", "metadata", "model"]
