from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from substrax.mesh import create_device_mesh
from substrax.spmd import (
    BatchPlacementError,
    EvalStep,
    PrecisionPolicy,
    TrainStep,
    create_data_parallel_sharding,
    place_batch_on_shards,
    place_nnx_state_on_shards,
)
from substrax.testing import expect_compiles


class Classifier(nnx.Module):
    def __init__(self, rngs: nnx.Rngs):
        self.dense = nnx.Linear(8, 16, rngs=rngs)
        self.drop = nnx.Dropout(0.5, rngs=rngs)
        self.out = nnx.Linear(16, 3, rngs=rngs)

    def __call__(self, x):
        return self.out(self.drop(jax.nn.relu(self.dense(x))))


def metrics(model, batch):
    logits = model(batch["x"])
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])
    return {"loss": losses, "accuracy": jnp.argmax(logits, -1) == batch["label"]}


def numpy_metrics(model, batch):
    """The same metrics, computed eagerly on one device from host arrays."""
    model.eval()
    logits = np.asarray(model(jnp.asarray(batch["x"])))
    shifted = logits - logits.max(-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    picked = np.take_along_axis(logp, batch["label"][:, None], -1)[:, 0]
    return {
        "loss": float(-picked.mean()),
        "accuracy": float((logits.argmax(-1) == batch["label"]).mean()),
    }


@pytest.fixture(scope="module")
def eval_batch():
    rng = np.random.default_rng(1)
    return {
        "x": rng.normal(size=(32, 8)).astype(np.float32),
        "label": rng.integers(0, 3, size=32).astype(np.int32),
    }


def test_sharded_metrics_are_global_means_equal_to_one_device(eval_batch):
    mesh = create_device_mesh({"data": 8})
    sharding = create_data_parallel_sharding(mesh)
    model = Classifier(nnx.Rngs(0))
    evaluate = EvalStep(model, metrics, mesh=mesh, batch_sharding=sharding)
    placed = place_batch_on_shards(eval_batch, sharding)
    assert placed["x"].addressable_shards[0].data.shape == (4, 8)  # each device has 4 rows
    with expect_compiles(1):
        out = evaluate(placed)
        evaluate(eval_batch)  # a host batch is placed on the sharding, same program
    assert out["loss"].sharding == NamedSharding(mesh, P())  # replicated on every device
    expected = numpy_metrics(Classifier(nnx.Rngs(0)), eval_batch)
    assert float(out["loss"]) == pytest.approx(expected["loss"], rel=1e-5)
    assert float(out["accuracy"]) == pytest.approx(expected["accuracy"])
    assert not model.drop.deterministic  # eval mode applied inside the step only


def test_evaluate_weights_batches_by_rows(eval_batch):
    model = Classifier(nnx.Rngs(0))
    evaluate = EvalStep(model, metrics)
    first = {k: v[:24] for k, v in eval_batch.items()}
    second = {k: v[24:] for k, v in eval_batch.items()}
    whole = evaluate(eval_batch)
    combined = evaluate.evaluate([first, second])
    assert combined["loss"] == pytest.approx(float(whole["loss"]), rel=1e-5)
    assert combined["accuracy"] == pytest.approx(float(whole["accuracy"]))
    with pytest.raises(ValueError, match="no batches"):
        evaluate.evaluate([])


def padded(batch, rows, to):
    """``batch``'s first ``rows`` rows, padded with zeros to ``to`` rows, and their mask."""
    out = {
        k: np.concatenate([v[:rows], np.zeros((to - rows, *v.shape[1:]), v.dtype)])
        for k, v in batch.items()
    }
    return out | {"mask": (np.arange(to) < rows).astype(np.float32)}


def test_a_mask_leaves_the_padding_of_a_last_batch_out_of_every_mean(eval_batch):
    """A last batch padded so the data axis divides it: its padded rows counted in the mean
    (a differential review: accuracy 0.2625 for 0.2763 over 76 rows), whatever the metric did."""
    mesh = create_device_mesh({"data": 8})
    sharding = create_data_parallel_sharding(mesh)
    model = Classifier(nnx.Rngs(0))
    rows = {k: v[:28] for k, v in eval_batch.items()}
    batches = [padded(rows, 16, 16), padded({k: v[16:] for k, v in rows.items()}, 12, 16)]

    def scalar(model, batch):  # a metric the user reduces over the rows the mask counts
        right = (jnp.argmax(model(batch["x"]), -1) == batch["label"]) * batch["mask"]
        return {"accuracy": jnp.sum(right) / jnp.sum(batch["mask"])}

    expected = numpy_metrics(Classifier(nnx.Rngs(0)), rows)
    for metric_fn in (metrics, scalar):
        evaluate = EvalStep(model, metric_fn, mesh=mesh, batch_sharding=sharding, mask="mask")
        got = evaluate.evaluate([*batches, padded(rows, 0, 8)])  # all padding: adds nothing
        assert got["accuracy"] == pytest.approx(expected["accuracy"])
        last = evaluate(batches[1])  # one batch: the mean over its 12 rows
        assert float(last["accuracy"]) == pytest.approx(
            numpy_metrics(Classifier(nnx.Rngs(0)), {k: v[16:] for k, v in rows.items()})["accuracy"]
        )
    assert got.keys() == {"accuracy"}
    assert EvalStep(model, metrics, mask="mask").evaluate(batches)["loss"] == pytest.approx(
        expected["loss"], rel=1e-5
    )


def test_a_mask_the_batch_lacks_or_cannot_weigh_rows_with_is_refused(eval_batch):
    model = Classifier(nnx.Rngs(0))
    with pytest.raises(
        ValueError,
        match=r"EvalStep\(mask='valid'\): the batch has no 'valid' key \(it has \['label', 'x'\]\)",
    ):
        EvalStep(model, metrics, mask="valid")(eval_batch)
    flat = eval_batch | {"valid": np.ones((32, 1), np.float32)}
    with pytest.raises(ValueError, match=r"the mask has shape \(32, 1\); give one weight a row"):
        EvalStep(model, metrics, mask="valid")(flat)
    short = eval_batch | {"valid": np.ones(32, np.float32)}
    with pytest.raises(
        ValueError, match=r"a metric of shape \(3,\) has no row per mask entry \(the mask has 32\)"
    ):
        EvalStep(model, lambda _m, _b: {"per_class": jnp.zeros(3)}, mask="valid")(short)


def test_reads_the_train_steps_current_state_without_donating_it(eval_batch):
    model = Classifier(nnx.Rngs(0))
    step = TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param),
        lambda m, b: metrics(m, b)["loss"].mean(),
    )
    step(eval_batch)
    evaluate = EvalStep(step, metrics)
    before = float(evaluate(eval_batch)["loss"])
    for _ in range(5):
        step(eval_batch)
    assert model.dense.kernel.get_value().is_deleted()  # the step was not made to sync
    state = step.state
    after = float(evaluate(eval_batch)["loss"])
    assert after < before  # the trained state, not the one at construction
    kernel = state[0]["dense"]["kernel"].get_value()
    assert not kernel.is_deleted()  # evaluation donates nothing
    assert after == pytest.approx(numpy_metrics(step.model, eval_batch)["loss"], rel=1e-5)


def test_eval_mode_off_keeps_dropout(eval_batch):
    model = Classifier(nnx.Rngs(0))
    on = EvalStep(model, metrics)(eval_batch)
    off = EvalStep(model, metrics, eval_mode=False)(eval_batch)
    assert float(on["loss"]) != pytest.approx(float(off["loss"]), rel=1e-3)


def test_precision_policy_computes_in_bfloat16_and_returns_float32(eval_batch):
    seen: list[jnp.dtype] = []

    def recorded(model, batch):
        hidden = model.dense(batch["x"])
        seen.extend([model.dense.kernel.get_value().dtype, batch["x"].dtype, hidden.dtype])
        return metrics(model, batch)

    model = Classifier(nnx.Rngs(0))
    out = EvalStep(model, recorded, precision=PrecisionPolicy(compute_dtype="bfloat16"))(eval_batch)
    # the batch as given; the layer casts it and computes in bfloat16
    assert seen == [jnp.bfloat16, jnp.float32, jnp.bfloat16]
    assert out["loss"].dtype == jnp.float32
    expected = numpy_metrics(Classifier(nnx.Rngs(0)), eval_batch)["loss"]
    assert float(out["loss"]) == pytest.approx(expected, rel=2e-2)
    assert model.dense.kernel.get_value().dtype == jnp.float32


# --- EvalStep takes every batch through TrainStep's batch path ------------------------------


def _train_step_on(mesh):
    model = Classifier(nnx.Rngs(0))
    return TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param),
        lambda m, b: metrics(m, b)["loss"].mean(),
        mesh=mesh,
        batch_sharding=create_data_parallel_sharding(mesh),
    )


def test_a_bfloat16_metric_is_averaged_in_the_output_dtype():
    # the mean ran in bfloat16 before the cast: 1.005859375 came back as 1.0078125
    values = np.asarray([1.0, 1.0078125, 1.0078125, 1.0078125], np.float32)  # each a bfloat16
    model = nnx.Linear(1, 1, rngs=nnx.Rngs(0))
    evaluate = EvalStep(
        model,
        lambda _model, b: {"v": b["v"].astype(jnp.bfloat16)},
        precision=PrecisionPolicy(compute_dtype="bfloat16"),
    )
    out = evaluate({"v": values})
    assert out["v"].dtype == jnp.float32
    assert float(out["v"]) == 1.005859375


def test_a_jax_array_batch_is_placed_on_batch_sharding_like_a_host_one(eval_batch):
    mesh = create_device_mesh({"data": 8})
    seen = []

    def recorded(model, batch):
        jax.debug.inspect_array_sharding(batch["x"], callback=seen.append)
        return metrics(model, batch)

    evaluate = EvalStep(Classifier(nnx.Rngs(0)), recorded, mesh=mesh, batch_sharding=P("data"))
    on_one_device = jax.device_put(eval_batch, jax.devices()[3])
    out = evaluate(on_one_device)
    assert seen[0].is_equivalent_to(NamedSharding(mesh, P("data")), 2)  # split, not replicated
    with expect_compiles(0):  # the host batch takes the same program
        assert float(evaluate(eval_batch)["loss"]) == float(out["loss"])


@pytest.mark.parametrize("as_jax", [True, False], ids=["jax-array", "numpy"])
def test_a_batch_the_data_axis_does_not_divide_is_refused_as_the_train_step_refuses_it(
    eval_batch, as_jax
):
    mesh = create_device_mesh({"data": 8})
    step = _train_step_on(mesh)
    evaluate = EvalStep(step, metrics, batch_sharding=create_data_parallel_sharding(mesh))
    twelve = {k: v[:12] for k, v in eval_batch.items()}
    if as_jax:
        twelve = jax.device_put(twelve)
    with pytest.raises(BatchPlacementError) as by_step:
        step(twelve)
    with pytest.raises(BatchPlacementError) as by_eval:
        evaluate(twelve)
    with pytest.raises(BatchPlacementError):
        evaluate.evaluate([eval_batch, twelve])
    assert str(by_eval.value) == str(by_step.value)
    assert by_eval.value.path == "['label']"
    assert "(12) 8 ways over mesh axis 'data' (8)" in str(by_eval.value)


def test_an_empty_batch_is_skipped_by_evaluate(eval_batch):
    mesh = create_device_mesh({"data": 8})
    evaluate = EvalStep(
        Classifier(nnx.Rngs(0)), metrics, batch_sharding=create_data_parallel_sharding(mesh)
    )
    empty = {k: v[:0] for k, v in eval_batch.items()}
    expected = evaluate.evaluate([eval_batch])
    assert evaluate.evaluate([eval_batch, empty]) == expected  # not NaN
    assert evaluate.evaluate([empty, eval_batch, empty]) == expected
    with pytest.raises(ValueError, match="only empty batches"):
        evaluate.evaluate([empty, empty])


def test_evaluate_refuses_a_batch_whose_leaves_disagree_on_their_rows():
    """Hostile finding: a (3,) leaf sorted first weighted a 6-row and a 2-row batch as 3 rows each."""

    def weighted(model, batch):
        return {"loss": (model(batch["x"])[:, 0] - batch["y"]) ** 2 * batch["class_weights"][0]}

    evaluate = EvalStep(nnx.Linear(2, 1, rngs=nnx.Rngs(0)), weighted)
    batch = {
        "class_weights": np.ones(3, np.float32),  # shared by every row: sorts first
        "x": np.ones((6, 2), np.float32),
        "y": np.zeros(6, np.float32),
    }
    with pytest.raises(ValueError, match=r"\['class_weights'\] has 3, \['x'\] has 6"):
        evaluate.evaluate([batch])


@pytest.mark.parametrize("steps_per_call", [1, 2])
def test_an_eval_step_over_a_train_step_takes_its_batch_sharding(eval_batch, steps_per_call):
    """Hostile finding: ``EvalStep(step)`` took the batch replicated, so on several processes
    each computed the metric of its own rows, and a 12-row batch on 8 shards was accepted."""
    mesh = create_device_mesh({"data": 8})
    model = Classifier(nnx.Rngs(0))
    step = TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param),
        lambda m, b: metrics(m, b)["loss"].mean(),
        batch_sharding=P("data"),  # taken on the mesh the state gives
        mesh=mesh,
        steps_per_call=steps_per_call,
    )
    seen = []

    def recorded(model, batch):
        jax.debug.inspect_array_sharding(batch["x"], callback=seen.append)
        return metrics(model, batch)

    evaluate = EvalStep(step, recorded)
    assert step.batch_sharding == NamedSharding(mesh, P("data"))  # one batch's, never stacked
    evaluate(eval_batch)
    assert seen[0].is_equivalent_to(NamedSharding(mesh, P("data")), 2)  # split, not replicated
    twelve = {k: v[:12] for k, v in eval_batch.items()}
    with pytest.raises(BatchPlacementError, match=r"\(12\) 8 ways over mesh axis 'data'"):
        evaluate(twelve)


# --- a batch sharding taken from the train step is fitted to each eval batch ----------------


def _dict_sharded_step(mesh):
    model = Classifier(nnx.Rngs(0))
    data = NamedSharding(mesh, P("data"))
    return TrainStep(
        model,
        nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param),
        lambda m, b: metrics(m, b)["loss"].mean(),
        mesh=mesh,
        batch_sharding={"x": data, "label": data},
    )


def test_keys_the_eval_batch_lacks_are_ignored_and_others_split_by_rows(eval_batch):
    """Review: EvalStep(step) over a {x, label} batch_sharding refused an eval batch of only
    {x} ("batch_sharding['label'] names a part the batch does not have")."""
    mesh = create_device_mesh({"data": 8})
    step = _dict_sharded_step(mesh)
    seen = {}

    def recorded(model, batch):
        for name in ("x", "weight"):
            jax.debug.inspect_array_sharding(batch[name], callback=partial(seen.__setitem__, name))
        return {"mean_logit": model(batch["x"]) * batch["weight"][:, None]}

    evaluate = EvalStep(step, recorded)
    weight = np.linspace(0.0, 1.0, 32, dtype=np.float32)  # a key the prefix does not name
    out = evaluate({"x": eval_batch["x"], "weight": weight})
    for name, ndim in (("x", 2), ("weight", 1)):  # the uncovered key: the prefix's row split
        assert seen[name].is_equivalent_to(NamedSharding(mesh, P("data")), ndim), name
    model = Classifier(nnx.Rngs(0))
    model.eval()
    want = (np.asarray(model(jnp.asarray(eval_batch["x"]))) * weight[:, None]).mean()
    assert float(out["mean_logit"]) == pytest.approx(float(want), rel=1e-5)
    # a batch_sharding passed to the EvalStep is applied as given
    explicit = EvalStep(step, recorded, batch_sharding=step.batch_sharding)
    with pytest.raises(ValueError, match=r"batch_sharding\['label'\] names a part"):
        explicit({"x": eval_batch["x"]})


@pytest.mark.parametrize("scalar", [np.float32(24.0), np.asarray(24.0), jnp.asarray(24.0)])
def test_a_scalar_leaf_of_the_eval_batch_is_replicated(eval_batch, scalar):
    """Review: EvalStep(step) refused a 0-d ``n_valid`` under the step's P("data")."""
    mesh = create_device_mesh({"data": 8})
    step = _train_step_on(mesh)

    def valid_mean(model, batch):
        losses = metrics(model, batch)["loss"]
        valid = jnp.arange(losses.shape[0]) < batch["n_valid"]
        return {"loss": jnp.where(valid, losses, 0.0).sum() / batch["n_valid"]}

    batch = {**eval_batch, "n_valid": scalar}  # the last 8 rows are padding
    out = EvalStep(step, valid_mean)(batch)
    rows = {k: v[:24] for k, v in eval_batch.items()}
    want = numpy_metrics(Classifier(nnx.Rngs(0)), rows)["loss"]
    assert float(out["loss"]) == pytest.approx(want, rel=1e-5)
    out = EvalStep(_dict_sharded_step(mesh), valid_mean)(batch)  # under a dict prefix too
    assert float(out["loss"]) == pytest.approx(want, rel=1e-5)
    # evaluate counts the rows of the first leaf that has them (a scalar may sort first)
    first = {**batch, "a_count": scalar}
    assert EvalStep(step, valid_mean).evaluate([first])["loss"] == pytest.approx(want, rel=1e-5)


def test_an_indivisible_eval_batch_is_refused_saying_what_to_do(eval_batch):
    """Review: the 12-row final batch is refused (as the guide says), but the error named no
    way out for an EvalStep that took its sharding from the train step."""
    mesh = create_device_mesh({"data": 8})
    step = _train_step_on(mesh)
    twelve = {k: v[:12] for k, v in eval_batch.items()}
    with pytest.raises(BatchPlacementError, match=r"\(12\) 8 ways over mesh axis 'data'") as info:
        EvalStep(step, metrics)(twelve)
    message = str(info.value)
    assert "drop or pad the last rows" in message
    assert "pass EvalStep(..., batch_sharding=...) explicitly" in message
    assert "NamedSharding(mesh, PartitionSpec())" in message
    assert info.value.path == "['label']"
    # what it advises works: replicated, the 12 rows give the one-device metric
    replicated = EvalStep(step, metrics, batch_sharding=NamedSharding(mesh, P()))
    out = replicated(twelve)
    assert float(out["loss"]) == pytest.approx(
        numpy_metrics(Classifier(nnx.Rngs(0)), twelve)["loss"], rel=1e-5
    )
    assert replicated.evaluate([eval_batch, twelve])["loss"] == pytest.approx(
        numpy_metrics(
            Classifier(nnx.Rngs(0)), {k: np.concatenate([v, v[:12]]) for k, v in eval_batch.items()}
        )["loss"],
        rel=1e-5,
    )


def _reversed(shape):
    return Mesh(np.array(jax.devices()[::-1]).reshape(tuple(shape.values())), tuple(shape))


def _split_on(mesh):
    """A Classifier whose first kernel is split over ``data`` on ``mesh``, the rest replicated."""
    model = Classifier(nnx.Rngs(0))
    rules = {(lambda path, _: path[-2:] == ("dense", "kernel")): P(None, "data")}
    nnx.update(model, place_nnx_state_on_shards(nnx.state(model), mesh, rules))
    return model


@pytest.mark.parametrize("where", ["mesh=", "batch_sharding", "mesh= 4x2"])
def test_the_same_devices_in_another_order_are_taken_onto_the_eval_steps_mesh(eval_batch, where):
    """Hostile finding: EvalStep given mesh= or a batch sharding over the model's devices in
    another order failed with jax's "incompatible devices" (TrainStep took them)."""
    model = _split_on(create_device_mesh({"data": 8}))
    options = {
        "mesh=": {"mesh": _reversed({"data": 8})},
        "batch_sharding": {"batch_sharding": NamedSharding(_reversed({"data": 8}), P("data"))},
        "mesh= 4x2": {"mesh": _reversed({"data": 4, "model": 2})},
    }[where]
    evaluate = EvalStep(model, metrics, **options)
    out = evaluate(eval_batch)
    with expect_compiles(0):  # the state is taken onto the mesh alike at each call
        evaluate(eval_batch)
    expected = numpy_metrics(Classifier(nnx.Rngs(0)), eval_batch)
    assert float(out["loss"]) == pytest.approx(expected["loss"], rel=1e-5)
    assert float(out["accuracy"]) == pytest.approx(expected["accuracy"])
    assert model.dense.kernel.get_value().sharding.spec == P(None, "data")  # model untouched


def test_a_batch_already_on_the_models_devices_in_another_order_is_evaluated(eval_batch):
    """Hostile finding: a batch device_put on a reversed mesh, with no batch_sharding, failed
    with jax's "incompatible devices"."""
    model = _split_on(create_device_mesh({"data": 8}))
    placed = jax.device_put(eval_batch, NamedSharding(_reversed({"data": 8}), P("data")))
    out = EvalStep(model, metrics)(placed)
    expected = numpy_metrics(Classifier(nnx.Rngs(0)), eval_batch)
    assert float(out["loss"]) == pytest.approx(expected["loss"], rel=1e-5)
