"""Image loaders on tiny files generated in the released formats."""

from __future__ import annotations

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from fedclust.data.images import (
    flatten_unit,
    keep_frequent_classes,
    load_image_dataset,
    read_idx,
)
from fedclust.data.tabular import DatasetError


def _write_idx(path: Path, arr: np.ndarray) -> None:
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}i", *arr.shape)
    with gzip.open(path, "wb") as fh:
        fh.write(header + arr.astype(np.uint8).tobytes())


def _images(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)


def test_idx_roundtrip(tmp_path: Path) -> None:
    arr = _images(np.random.default_rng(0), 3)
    _write_idx(tmp_path / "a-idx3-ubyte.gz", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "a-idx3-ubyte.gz"), arr)


def test_emnist_digits_is_transposed_back(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    img, lab = _images(rng, 5), rng.integers(0, 10, 5).astype(np.uint8)
    d = tmp_path / "emnist"
    d.mkdir()
    # the release stores every image transposed
    _write_idx(d / "emnist-digits-train-images-idx3-ubyte.gz", img.transpose(0, 2, 1))
    _write_idx(d / "emnist-digits-train-labels-idx1-ubyte.gz", lab)
    x, y = load_image_dataset("emnist-digits", str(tmp_path), "train")
    np.testing.assert_array_equal(x, img)
    np.testing.assert_array_equal(y, lab.astype(np.int64))
    assert y.dtype == np.int64 and x.dtype == np.uint8


@pytest.mark.parametrize("name", ["kmnist", "k49"])
def test_official_npz(tmp_path: Path, name: str) -> None:
    rng = np.random.default_rng(2)
    for split, n in (("train", 6), ("test", 4)):
        np.savez_compressed(tmp_path / f"{name}-{split}-imgs.npz", _images(rng, n))
        np.savez_compressed(tmp_path / f"{name}-{split}-labels.npz", np.arange(n) % 3)
    x, y = load_image_dataset(name, str(tmp_path), "train")
    assert x.shape == (6, 28, 28) and y.tolist() == [0, 1, 2, 0, 1, 2]
    xa, _ = load_image_dataset(name, str(tmp_path), "all")
    assert xa.shape[0] == 10


def test_mnist_layout_and_idx_fallback(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    img, lab = _images(rng, 4), np.array([1, 2, 3, 4], dtype=np.uint8)
    (tmp_path / "mnist").mkdir()
    np.savez_compressed(tmp_path / "mnist" / "mnist-train.npz", x=img, y=lab)
    x, y = load_image_dataset("mnist", str(tmp_path))
    np.testing.assert_array_equal(x, img)
    _write_idx(tmp_path / "t10k-images-idx3-ubyte.gz", img[:2])
    _write_idx(tmp_path / "t10k-labels-idx1-ubyte.gz", lab[:2])
    x, y = load_image_dataset("mnist", str(tmp_path), "test")
    assert x.shape == (2, 28, 28) and y.tolist() == [1, 2]


def test_missing_and_unknown(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match="kmnist-train-imgs.npz"):
        load_image_dataset("kmnist", str(tmp_path))
    with pytest.raises(DatasetError, match="allowed"):
        load_image_dataset("cifar", str(tmp_path))
    with pytest.raises(DatasetError, match="split"):
        load_image_dataset("digits", "", "val")


def test_digits_embedded_and_scaling() -> None:
    x, y = load_image_dataset("digits", "", "train")
    xt, _ = load_image_dataset("digits", "", "test")
    assert x.shape[1:] == (8, 8) and x.shape[0] + xt.shape[0] == 1797 and x.max() == 255
    f = flatten_unit(x)
    assert f.shape == (x.shape[0], 64) and 0.0 <= f.min() and f.max() == 1.0


def test_keep_frequent_classes() -> None:
    y = np.array([0, 0, 0, 1, 2, 2, 2, 5, 5, 5])
    x = np.arange(10)
    xk, yk, kept = keep_frequent_classes(x, y, 3)
    assert kept.tolist() == [0, 2, 5] and yk.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert xk.tolist() == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_k49_filter_counts_training_samples_only(tmp_path: Path) -> None:
    """Class 2 has 3 training samples (below the threshold) but 5 with the test split: with
    ``split=all`` it must still be dropped (paper 000: ≥ 6000 *training* samples)."""
    from fedclust.fedcref.client import _dataset

    rng = np.random.default_rng(4)
    y_train, y_test = np.array([0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2]), np.array([2, 2, 0, 1])
    for split, y in (("train", y_train), ("test", y_test)):
        np.savez_compressed(tmp_path / f"k49-{split}-imgs.npz", _images(rng, len(y)))
        np.savez_compressed(tmp_path / f"k49-{split}-labels.npz", y)
    _, y_all = _dataset("k49", str(tmp_path), "all", 4)
    assert sorted(np.unique(y_all).tolist()) == [0, 1] and y_all.size == 10
