"""Paired MNIST: the IDX loader, pair construction rules, disjoint pools, determinism.

Most tests use a synthetic MNIST written to a temporary folder whose every image encodes
its class and its index in the file, so a pair can be decoded back into (y1, y2) and the
pool each half came from.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest

from trainables.errors import ConfigError, DataError
from trainables.registry import TASKS
from trainables.tasks.mnist_pairs import (
    IMAGE_MAGIC,
    LABEL_MAGIC,
    MnistPairs,
    MnistPairsConfig,
    read_idx,
)

README_SHA256 = {
    "t10k-images-idx3-ubyte.gz": "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
    "t10k-labels-idx1-ubyte.gz": "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
    "train-labels-idx1-ubyte.gz": "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
}


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    """An IDX file of a uint8 array, written independently of the loader."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload) if compress else payload)


def synthetic_mnist(n: int, offset: int = 0, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Images whose pixel (0, 0) is 10 * label and pixels (0, 1), (0, 2) the index (+offset)."""
    labels = np.random.default_rng(seed).integers(0, 10, n).astype(np.uint8)
    images = np.zeros((n, 28, 28), dtype=np.uint8)
    index = np.arange(n) + offset
    images[:, 0, 0] = labels * 10
    images[:, 0, 1], images[:, 0, 2] = index // 256, index % 256
    return images, labels


def decode(x: np.ndarray) -> dict[str, np.ndarray]:
    """(n, 1, 28, 56) pairs of synthetic images -> labels and file indices of both halves."""
    pixels = np.rint(x[:, 0, 0] * 255).astype(np.int64)  # (n, 56)
    return {
        "y1": pixels[:, 0] // 10,
        "y2": pixels[:, 28] // 10,
        "i1": pixels[:, 1] * 256 + pixels[:, 2],
        "i2": pixels[:, 29] * 256 + pixels[:, 30],
    }


@pytest.fixture(scope="module")
def fake_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mnist")
    images, labels = synthetic_mnist(1000)
    write_idx(root / "t10k-images-idx3-ubyte.gz", images, compress=True)
    write_idx(root / "t10k-labels-idx1-ubyte", labels, compress=False)
    return root


def _task(data_dir: Path, **fields: object) -> MnistPairs:
    fields = {"train_pool_size": 800, "n_curve": 300, "n_final": 0, **fields}
    return MnistPairs(MnistPairsConfig(data_dir=str(data_dir), **fields))


def test_registered():
    assert TASKS.get("mnist_pairs") is MnistPairs


def test_reference_files_match_readme_sha256(shared_data: Path):
    for name, digest in README_SHA256.items():
        assert hashlib.sha256((shared_data / "mnist" / name).read_bytes()).hexdigest() == digest


def test_loader_reads_real_files_gzip_and_raw(shared_data: Path, tmp_path: Path):
    images = read_idx(shared_data / "mnist" / "t10k-images-idx3-ubyte.gz", IMAGE_MAGIC)
    labels = read_idx(shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz", LABEL_MAGIC)
    assert images.shape == (10_000, 28, 28) and images.dtype == np.uint8
    assert labels.shape == (10_000,) and set(np.unique(labels).tolist()) == set(range(10))
    raw = tmp_path / "t10k-labels-idx1-ubyte"
    raw.write_bytes(
        gzip.decompress((shared_data / "mnist" / "t10k-labels-idx1-ubyte.gz").read_bytes())
    )
    assert np.array_equal(read_idx(raw, LABEL_MAGIC), labels)


@pytest.mark.parametrize("compress", [False, True])
def test_loader_round_trip_and_checks(tmp_path: Path, compress: bool):
    images, labels = synthetic_mnist(50)
    write_idx(tmp_path / "img", images, compress)
    write_idx(tmp_path / "lab", labels, compress)
    assert np.array_equal(read_idx(tmp_path / "img", IMAGE_MAGIC), images)
    assert np.array_equal(read_idx(tmp_path / "lab", LABEL_MAGIC), labels)
    with pytest.raises(DataError, match="magic"):
        read_idx(tmp_path / "lab", IMAGE_MAGIC)  # labels where images are expected
    payload = (tmp_path / "img").read_bytes()
    payload = gzip.decompress(payload) if compress else payload
    (tmp_path / "short").write_bytes(payload[:-10])
    with pytest.raises(DataError, match="truncated"):
        read_idx(tmp_path / "short")
    (tmp_path / "junk").write_bytes(b"\x01\x02\x03\x04" + payload[4:])
    with pytest.raises(DataError, match="not an IDX file"):
        read_idx(tmp_path / "junk")


def test_data_dir_is_required(tmp_path: Path):
    with pytest.raises(ConfigError) as err:
        MnistPairs(MnistPairsConfig()).check()
    assert err.value.field == "task.data_dir"
    with pytest.raises(ConfigError, match=r"task\.data_dir"):
        MnistPairs(MnistPairsConfig()).build(data_seed=0)
    with pytest.raises(ConfigError, match="t10k-images-idx3-ubyte"):
        _task(tmp_path).check()
    with pytest.raises(ConfigError, match=r"task\.train_pool_size"):
        _task(Path("unused"), train_pool_size=0)


def _unfit_t10k(tmp_path: Path, case: str) -> Path:
    """A t10k images/labels pair that is valid IDX but unfit for the task in one way."""
    images, labels = synthetic_mnist(300, seed=1)
    if case == "5x5":
        images = images[:, :5, :5]
    elif case == "fewer-labels":
        labels = labels[:-1]
    elif case == "class-absent":
        labels = np.where(labels == 3, 4, labels)
    elif case == "empty":
        images, labels = images[:0], labels[:0]
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images, compress=False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels, compress=case == "fewer-labels")
    return tmp_path


@pytest.mark.parametrize(
    ("case", "needle"),
    [("5x5", "images are 5x5 pixels, expected 28x28"), ("fewer-labels", "300 images but 299 labels"),
     ("class-absent", "no image of classes [3]"), ("empty", "no images")],
)
def test_check_refuses_files_the_pairs_cannot_use(tmp_path: Path, case: str, needle: str):
    """Header-valid IDX files of the wrong image size, counts or classes passed the check (5x5
    images then failed in the convnet, in a Ray worker)."""
    _task(_unfit_t10k(tmp_path, "ok"), train_pool_size=100).check()  # the same files, fit
    with pytest.raises(ConfigError) as err:
        _task(_unfit_t10k(tmp_path, case), train_pool_size=100).check()
    assert err.value.field == "task.data_dir" and needle in err.value.problem, str(err.value)
    assert "MNIST IDX files" in err.value.fix


def test_check_refuses_a_train_pool_of_every_image(fake_dir: Path):
    with pytest.raises(ConfigError) as err:
        _task(fake_dir, train_pool_size=1000).check()
    assert err.value.field == "task.train_pool_size" and "only 1000 test images" in err.value.problem
    with pytest.raises(ConfigError, match=r"task\.train_pool_size"):
        _task(fake_dir, train_pool_size=1000, pool_source="auto").check()  # no train file: split too
    _task(fake_dir, train_pool_size=900).check()


def test_splits_roles_and_shapes(fake_dir: Path):
    data = _task(fake_dir, n_final=500).build(data_seed=3)
    roles = {n: (s.role, len(s)) for n, s in data.splits.items()}
    assert roles == {
        "train": ("train", 800),
        "train_eval": ("val", 300),
        "test": ("test", 300),
        "train_eval_full": ("val", 500),
        "test_full": ("test", 500),
    }
    assert data.meta["input_shape"] == (1, 28, 56) and data.meta["n_classes"] == 10
    assert data.meta["pool_source"] == "t10k_split" and data.meta["pool_sizes"] == (800, 200)
    pair = data.splits["test"].data
    assert pair.x.shape == (300, 1, 28, 56) and pair.x.dtype == np.float32
    assert data.splits["train"].data.x.shape == (800, 1, 28, 56)
    assert pair.x.min() >= 0.0 and pair.x.max() <= 1.0 and pair.y.dtype == np.int64


@pytest.mark.parametrize("setting", ["A", "B"])
def test_pair_rules(fake_dir: Path, setting: str):
    task = _task(fake_dir, setting=setting)
    data = task.build(data_seed=3)
    fresh = task.sample_train(data, np.random.default_rng(5), 2000)
    for arrays in (data.splits["train"].data, data.splits["train_eval"].data, fresh):
        d = decode(arrays.x)
        assert np.array_equal(d["y1"], arrays.y)
        diffs = set(((d["y2"] - d["y1"]) % 10).tolist())
        assert diffs == ({0, 1} if setting == "A" else set(range(10)))
    d = decode(data.splits["test"].data.x)
    assert set(((d["y2"] - d["y1"]) % 10).tolist()) == set(range(2, 10))


def test_pools_are_disjoint(fake_dir: Path):
    task = _task(fake_dir)
    data = task.build(data_seed=3)
    train = data.splits["train"].data
    train_pool = set(train.ids.tolist())
    assert len(train_pool) == 800
    assert np.array_equal(decode(train.x)["i1"], train.ids)  # each pool image once, on the left
    fresh = decode(task.sample_train(data, np.random.default_rng(0), 3000).x)
    seen_train = set(fresh["i1"].tolist()) | set(fresh["i2"].tolist())
    test = decode(data.splits["test"].data.x)
    seen_test = set(test["i1"].tolist()) | set(test["i2"].tolist())
    assert seen_train <= train_pool
    assert seen_test and not seen_test & train_pool
    assert len(seen_train) > 700  # pairs range over the whole pool


def test_determinism(fake_dir: Path):
    task = _task(fake_dir)
    a, b, c = (task.build(data_seed=s) for s in (3, 3, 4))
    for name in ("train", "train_eval", "test"):
        assert np.array_equal(a.splits[name].data.x, b.splits[name].data.x)
        assert not np.array_equal(a.splits[name].data.x, c.splits[name].data.x)
    s1, s2 = (task.sample_train(a, np.random.default_rng(9), 64) for _ in range(2))
    s3 = task.sample_train(a, np.random.default_rng(10), 64)
    assert np.array_equal(s1.x, s2.x) and np.array_equal(s1.y, s2.y)
    assert not np.array_equal(s1.x, s3.x)


def test_real_train_file_becomes_the_train_pool(tmp_path: Path):
    images, labels = synthetic_mnist(300, seed=1)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images, compress=False)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels, compress=False)
    train_images, train_labels = synthetic_mnist(500, offset=1000, seed=2)
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", train_images, compress=True)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", train_labels, compress=True)
    task = _task(tmp_path, train_pool_size=100)
    data = task.build(data_seed=0)
    assert data.meta["pool_source"] == "train_file" and data.meta["pool_sizes"] == (500, 300)
    assert (decode(task.sample_train(data, np.random.default_rng(0), 500).x)["i1"] >= 1000).all()
    assert (decode(data.splits["test"].data.x)["i1"] < 1000).all()
    split = _task(tmp_path, train_pool_size=100, pool_source="t10k_split").build(data_seed=0)
    assert split.meta["pool_sizes"] == (100, 200)


def test_real_reference_data_builds(shared_data: Path):
    data = MnistPairs(MnistPairsConfig(data_dir=str(shared_data / "mnist"))).build(data_seed=0)
    assert data.meta["pool_sizes"] == (8_000, 2_000)
    assert len(data.splits["test_full"]) == 2_000 and len(data.splits["train_eval"]) == 100
    assert len(np.unique(data.splits["train"].data.ids)) == 8_000


@pytest.mark.parametrize("n_final", [0, 50])
def test_analysis_declares_existing_splits(fake_dir: Path, n_final: int):
    task = _task(fake_dir, n_final=n_final)
    splits = set(task.build(data_seed=0).splits)
    decl = json.loads(json.dumps(task.analysis()))  # pure data
    named = {a[0] for a in decl["scatter"]} | {h["split"] for h in decl["histograms"]}
    assert named | set(decl["test_splits"]) <= splits


def test_accuracy_takes_probability_vectors_or_class_ids(fake_dir: Path):
    task = _task(fake_dir)
    split = task.build(data_seed=0).splits["test"]
    y = split.data.y
    probs = [np.eye(10, dtype=np.float32)[c] * 0.9 + 0.01 for c in y]
    probs[0] = np.eye(10, dtype=np.float32)[(y[0] + 1) % 10]
    acc = task.score(split, probs)["accuracy"]
    assert acc.shape == (len(y),) and acc[0] == 0.0 and acc[1:].all()
    assert task.score(split, [int(c) for c in y])["accuracy"].all()
    assert task.render(split, probs[1]).startswith(f"{y[1]} (p=")
