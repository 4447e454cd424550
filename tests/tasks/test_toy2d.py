"""2-D toy task: sample distribution, splits, grid, metrics."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from scipy import stats

from study.config import parse
from trainables.errors import ConfigError
from trainables.loop import BundleRun
from trainables.models.classify import ClassifyBatch, classify_losses
from trainables.models.mlp import MLP, MLPConfig
from trainables.registry import TASKS
from trainables.seeding import derive_seedset, torch_generator
from trainables.tasks.toy2d import Toy2D, Toy2DConfig

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def _factors(x: np.ndarray) -> np.ndarray:
    """(Y1, Y2) recovered from X = Y - U with U in [0, 1): Y = ceil(X)."""
    return np.ceil(x).astype(np.int64)


@pytest.fixture(scope="module")
def task() -> Toy2D:
    return Toy2D(Toy2DConfig())


def test_registered():
    assert TASKS.get("toy2d") is Toy2D


def test_training_distribution(task: Toy2D):
    data = task.build(data_seed=0)
    s = task.sample_train(data, np.random.default_rng(1), 30_000)
    assert s.x.shape == (30_000, 2) and s.x.dtype == np.float32 and s.y.dtype == np.int64
    factors = _factors(s.x)
    assert np.array_equal(factors[:, 0], s.y)
    combos, counts = np.unique(factors, axis=0, return_counts=True)
    assert combos.tolist() == [[0, 0], [0, 1], [1, 0]]  # never (1, 1)
    assert np.allclose(counts / counts.sum(), 1 / 3, atol=0.015)
    noise = factors - s.x  # U, per coordinate
    assert noise.min() >= 0.0 and noise.max() <= 1.0
    assert abs(noise.mean() - 0.5) < 0.01 and abs(noise.var() - 1 / 12) < 0.005
    assert abs(np.corrcoef(noise[:, 0], noise[:, 1])[0, 1]) < 0.03


def test_splits(task: Toy2D):
    data = task.build(data_seed=0)
    roles = {n: (s.role, len(s)) for n, s in data.splits.items()}
    assert roles == {
        "train": ("train", 3000),
        "train_eval": ("val", 1000),
        "test": ("test", 1000),
        "grid": ("test", 41 * 41),
    }
    assert data.meta == {"input_shape": (2,), "n_classes": 2}
    test = data.splits["test"].data
    assert (_factors(test.x) == 1).all() and (test.y == 1).all()
    train_eval = _factors(data.splits["train_eval"].data.x)
    assert not (train_eval == 1).all(axis=1).any()


def test_grid(task: Toy2D):
    grid = task.decision_grid()
    assert grid.x.shape == (1681, 2)
    axis = np.linspace(-1, 1, 41)
    i1, i2 = 7, 30
    assert np.allclose(grid.x[i1 * 41 + i2], [axis[i1], axis[i2]])
    assert grid.x.min() == -1.0 and grid.x.max() == 1.0
    assert np.array_equal(grid.y, (grid.x[:, 0] > 0).astype(np.int64))  # the true Y1 rule
    decl = json.loads(json.dumps(task.analysis()))  # pure data
    assert decl["decision_boundary"]["grid"] == [-1.0, 1.0, 41]
    assert decl["decision_boundary"]["split"] == "grid"
    named = {a[0] for a in decl["scatter"]} | {h["split"] for h in decl["histograms"]}
    assert named | set(decl["test_splits"]) <= set(task.build(data_seed=0).splits)


def test_determinism(task: Toy2D):
    a, b, c = (task.build(data_seed=s) for s in (5, 5, 6))
    for name in ("train", "train_eval", "test"):
        assert np.array_equal(a.splits[name].data.x, b.splits[name].data.x)
        assert not np.array_equal(a.splits[name].data.x, c.splits[name].data.x)
    s1, s2 = (task.sample_train(a, np.random.default_rng(3), 10) for _ in range(2))
    assert np.array_equal(s1.x, s2.x)


def test_scores(task: Toy2D):
    data = task.build(data_seed=0)
    split, grid = data.splits["train_eval"], data.splits["grid"]
    right = [np.array([1 - c, c], dtype=np.float32) for c in split.data.y]
    assert task.score(split, right)["accuracy"].mean() == 1.0
    assert task.score(split, [1 - int(c) for c in split.data.y])["accuracy"].mean() == 0.0
    p = np.linspace(0, 1, len(grid))
    scored = task.score(grid, [np.array([1 - q, q]) for q in p])
    assert set(scored) == {"accuracy", "p_y1"} and np.allclose(scored["p_y1"], p)
    x1_rule = [
        np.array([1.0, 0.0]) if x1 <= 0 else np.array([0.0, 1.0]) for x1 in grid.data.x[:, 0]
    ]
    assert task.score(grid, x1_rule)["accuracy"].mean() == 1.0
    x2_rule = [
        np.array([1.0, 0.0]) if x2 <= 0 else np.array([0.0, 1.0]) for x2 in grid.data.x[:, 1]
    ]
    assert task.score(grid, x2_rule)["accuracy"].mean() == pytest.approx(
        (20 * 20 + 21 * 21) / 41**2
    )  # agree when both > 0 or both <= 0
    assert task.render(grid, np.array([0.25, 0.75])) == "0.750000"
    assert task.render(split, np.array([0.25, 0.75])) == "1 (p=0.750)"
    with pytest.raises(ValueError, match="probability"):
        task.score(grid, [0] * len(grid))


def test_bad_config():
    with pytest.raises(ConfigError, match=r"task\.grid"):
        Toy2DConfig(grid=(1.0, -1.0, 41))
    with pytest.raises(ConfigError, match=r"task\.n_eval"):
        Toy2DConfig(n_eval=0)


# --- TensorFlow Playground's training (Li et al.'s appendix): model options and the config ---


def _playground_mlp(hidden: tuple[int, ...], k: int, seeds: tuple[int, ...] = ()) -> MLP:
    cfg = MLPConfig(
        hidden=hidden, activation="tanh", output_activation="tanh", init="playground", loss="square"
    )
    model = MLP(cfg, {"input_shape": (2,), "n_classes": 2}, k)
    for member, seed in enumerate(seeds):
        model.init_member(member, torch_generator(seed))
    return model


def test_square_loss_on_the_tanh_output_matches_playground_by_hand() -> None:
    """A linear tanh unit, two examples: loss, gradient and one SGD step worked by hand with
    Playground's rules (nn.ts: dE/do = o - t, times 1 - o^2; the update divides the summed
    derivatives by their count)."""
    model = _playground_mlp((), 1)
    w, b = [0.5, -0.25], 0.1
    with torch.no_grad():
        model.weights[0][0] = torch.tensor([w])
        model.biases[0][0] = torch.tensor([b])
    x = [[1.0, 2.0], [-0.5, 0.3]]
    y = [1, 0]  # Playground targets +1, -1
    batch = ClassifyBatch(x=torch.tensor([x]), y=torch.tensor([y]))
    loss = model.loss(batch, None, "mean")
    grads = torch.autograd.grad(loss.sum(), [model.weights[0], model.biases[0]])
    want_loss, want_gw, want_gb = 0.0, [0.0, 0.0], 0.0
    for xi, yi in zip(x, y, strict=True):
        o = math.tanh(w[0] * xi[0] + w[1] * xi[1] + b)
        t = 2 * yi - 1
        want_loss += 0.5 * (o - t) ** 2 / 2
        d = (o - t) * (1 - o * o) / 2  # dE/d(total input), averaged over the batch of 2
        want_gw = [want_gw[0] + d * xi[0], want_gw[1] + d * xi[1]]
        want_gb += d
    assert float(loss[0].detach()) == pytest.approx(want_loss, rel=1e-6)
    assert grads[0][0, 0].tolist() == pytest.approx(want_gw, rel=1e-5)
    assert float(grads[1][0, 0]) == pytest.approx(want_gb, rel=1e-5)
    # the per-example loss the trainer reports, and the probabilities: (1 + o) / 2
    o = [math.tanh(w[0] * xi[0] + w[1] * xi[1] + b) for xi in x]
    with torch.no_grad():
        per_example = model.example_losses(batch)[0].tolist()
        probs = model.predict(batch)[0]
    assert per_example == pytest.approx([0.5 * (o[0] - 1) ** 2, 0.5 * (o[1] + 1) ** 2], rel=1e-6)
    assert [float(p[1]) for p in probs] == pytest.approx([(1 + v) / 2 for v in o], rel=1e-6)
    assert [int(np.argmax(p)) for p in probs] == [int(v > 0) for v in o]


def test_square_loss_is_mean_square_error_of_p1_minus_p0_on_any_binary_logits() -> None:
    logits = torch.tensor([[[0.3, -1.2], [2.0, 2.5]]])  # (1, 2, 2)
    y = torch.tensor([[0, 1]])
    p = torch.softmax(logits, -1)[0]
    o = (p[:, 1] - p[:, 0]).tolist()
    got = classify_losses(logits, y, "square")[0].tolist()
    assert got == pytest.approx([0.5 * (o[0] + 1) ** 2, 0.5 * (o[1] - 1) ** 2], rel=1e-6)
    with pytest.raises(ConfigError, match=r"model\.loss"):
        classify_losses(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), "square")


def test_tanh_output_and_hidden_activation() -> None:
    model = _playground_mlp((3,), 1, (5,))
    assert [tuple(w.shape) for w in model.weights] == [(1, 3, 2), (1, 1, 3)]
    x = torch.tensor([[[0.2, -0.7], [0.9, 0.1]]])
    (w1, w2), (b1, b2) = ([p[0].detach() for p in ps] for ps in (model.weights, model.biases))
    a = torch.tanh(x[0] @ w1.T + b1) @ w2.T + b2  # (2, 1): Playground's forwardProp
    logits = model(ClassifyBatch(x=x, y=torch.zeros(1, 2, dtype=torch.long)))
    assert torch.allclose(logits[0], torch.cat([-a, a], dim=1), atol=1e-6)
    with pytest.raises(ConfigError, match=r"model\.output_activation"):
        MLP(MLPConfig(output_activation="tanh"), {"input_shape": (2,), "n_classes": 3}, 1)


def test_playground_init_per_member_and_independent_across_members() -> None:
    model = _playground_mlp((64, 64), 3, (1, 2, 1))
    w = model.weights[1].detach()  # (3, 64, 64)
    for member in range(3):
        v = w[member].flatten().numpy()
        assert v.min() >= -0.5 and v.max() < 0.5  # Math.random() - 0.5
        assert abs(v.mean()) < 0.02 and abs(v.var() - 1 / 12) < 0.006  # U(-0.5, 0.5)
        assert stats.kstest(v + 0.5, "uniform").pvalue > 0.01
    for b in model.biases:
        assert (b.detach() == 0.1).all()  # Node.bias = 0.1, no draw
    assert torch.equal(w[0], w[2])  # same init seed, same draws
    r = np.corrcoef(w[0].flatten().numpy(), w[1].flatten().numpy())[0, 1]
    assert abs(r) < 0.05  # seeds 1 and 2 draw independently


def test_new_options_at_their_defaults_keep_the_identity() -> None:
    assert set(MLPConfig().identity()) == {"hidden", "init", "loss"}
    assert "fresh_samples" not in Toy2DConfig().identity()
    assert Toy2DConfig(fresh_samples=False).identity()["fresh_samples"] is False
    assert Toy2D(Toy2DConfig(fresh_samples=False)).fresh_samples is False
    assert Toy2D(Toy2DConfig()).fresh_samples is True and Toy2D.fresh_samples is True


def test_the_paper_config_trains_on_its_fixed_points(torch_threads) -> None:
    """configs/li2021_toy.yaml as shipped, cut to 4 epochs: SGD passes over the 250 fixed
    points (25 updates of 10 per epoch), the tanh unit's squared error falls."""
    raw = yaml.safe_load((CONFIGS / "li2021_toy.yaml").read_text())
    spec = parse(raw).points[0].spec
    train, model = spec.train, spec.model
    assert (train.optimizer, train.lr, train.batch_size, train.max_epochs) == ("sgd", 0.1, 10, 1024)
    assert (model.loss, model.output_activation, model.init) == ("square", "tanh", "playground")
    assert train.data_order == "fixed"  # Playground's one order of its points
    raw["task"]["n_eval"] = 200
    raw["train"]["max_epochs"] = 4
    spec = parse(raw).points[0].spec
    task = spec.make_task()
    seeds = [derive_seedset(2021, i) for i in range(2)]
    data = task.build(seeds[0].data_seed)
    assert len(data.train) == 250
    run = BundleRun(spec, seeds, task, data, "cpu")
    while not run.done:
        run.train_round()
    assert (run.epoch, run.step) == (4, 100)
    curves = run.finalize()
    for member in curves:
        rows = member["metrics"]
        objective = [r["value"] for r in rows if (r["split"], r["metric"]) == ("train", "objective")]
        assert len(objective) == 4 and objective[-1] < objective[0] < 0.5  # it falls
        ev = {(r["split"], r["metric"]): r["value"] for r in member["evals"]}
        assert ev["train_eval", "accuracy"] > 0.8
        assert 0.0 <= ev["grid", "p_y1"] <= 1.0
