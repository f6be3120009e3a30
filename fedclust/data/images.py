"""Image datasets in their released formats (shared by FedCRef and EMD-CFL).

:func:`load_image_dataset` returns ``(x, y)`` with ``x`` uint8 images of shape ``(N, H, W)``
(0 = background, the usual MNIST orientation; 28×28 for every dataset except the embedded
scikit-learn ``digits``, which are 8×8 rescaled from 0..16 to 0..255) and ``y`` int64 labels.

Where the files are looked for (``data_dir`` is the run-config ``data-dir``), first match wins:

==============  =========================================================================
name            files (in ``data_dir/<sub>/`` or directly in ``data_dir/``)
==============  =========================================================================
mnist           ``mnist/mnist-{train,test}.npz`` (keys ``x``, ``y``) or the official
                ``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]``
fashion-mnist   ``fashion-mnist/fashion-mnist-{train,test}.npz`` or the official IDX files
emnist-digits   ``emnist/emnist-digits-{train,test}-{images-idx3,labels-idx1}-ubyte[.gz]``
                (the "gzip.zip" release). The released images are stored transposed; they are
                transposed back here so that they look like MNIST.
kmnist          ``kmnist/kmnist-{train,test}-{imgs,labels}.npz`` (official, key ``arr_0``)
k49             ``k49/k49-{train,test}-{imgs,labels}.npz`` (official, key ``arr_0``); all 49
                classes — use :func:`keep_frequent_classes` for the paper's 31-class subset
digits          embedded (``sklearn.datasets.load_digits``); no files
==============  =========================================================================

``split`` is ``"train"``, ``"test"`` or ``"all"`` (train followed by test). The embedded
``digits`` have no official split: ``test`` is every fifth sample (index % 5 == 0), ``train``
the rest.
"""

from __future__ import annotations

import functools
import gzip
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from fedclust.data.tabular import DatasetError

IMAGE_DATASETS: tuple[str, ...] = ("mnist", "fashion-mnist", "emnist-digits", "kmnist", "k49",
                                   "digits")
SPLITS: tuple[str, ...] = ("train", "test", "all")

_SUBDIRS = {"mnist": ("mnist", ""), "fashion-mnist": ("fashion-mnist", "fashion_mnist", ""),
            "emnist-digits": ("emnist", "emnist-digits", "gzip", ""),
            "kmnist": ("kmnist", ""), "k49": ("k49", "kmnist", "")}
_HINT = {
    "mnist": "download the four IDX files from yann.lecun.com",
    "fashion-mnist": "download the IDX files from "
                     "github.com/zalandoresearch/fashion-mnist",
    "emnist-digits": "download gzip.zip from https://www.nist.gov/itl/products-and-services/"
                     "emnist-dataset and unpack the emnist-digits-* files",
    "kmnist": "download kmnist-*-imgs.npz / kmnist-*-labels.npz from "
              "https://github.com/rois-codh/kmnist",
    "k49": "download k49-*-imgs.npz / k49-*-labels.npz from https://github.com/rois-codh/kmnist",
}


def read_idx(path: str | Path) -> NDArray[np.uint8]:
    """Read an IDX file (optionally gzip-compressed) into an array of its declared shape.

    The IDX header is two zero bytes, a type byte (0x08 = unsigned byte) and the number of
    dimensions, followed by one big-endian int32 per dimension.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        raw = fh.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise DatasetError(f"data-dir file {path.name}: not an IDX file (bad magic number). "
                           f"Fix: download it again")
    if raw[2] != 0x08:
        raise DatasetError(f"data-dir file {path.name}: its IDX data type is not unsigned byte "
                           f"(0x08). Fix: download the released file again")
    ndim = raw[3]
    dims = tuple(int(d) for d in np.frombuffer(raw, dtype=">i4", count=ndim, offset=4))
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DatasetError(f"data-dir file {path.name}: its IDX header says {dims} but the "
                           f"file holds {data.size} bytes. Fix: download it again")
    return data.reshape(dims).copy()


def _find(data_dir: Path, name: str, candidates: list[str]) -> Path | None:
    for sub in _SUBDIRS[name]:
        for cand in candidates:
            for suffix in ("", ".gz"):
                p = data_dir / sub / (cand + suffix) if sub else data_dir / (cand + suffix)
                if p.is_file():
                    return p
    return None


def _missing(name: str, data_dir: Path, wanted: str) -> DatasetError:
    return DatasetError(
        f"dataset {name!r}: {wanted} not found under data-dir={str(data_dir)!r} "
        f"(looked in {', '.join(repr(s or '.') for s in _SUBDIRS[name])}); fix: "
        f"{_HINT[name]}, or set data-dir to the folder that holds them")


def _load_npz_xy(name: str, data_dir: Path, split: str) -> tuple[NDArray, NDArray] | None:
    p = _find(data_dir, name, [f"{name}-{split}.npz"])
    if p is None:
        return None
    with np.load(p) as d:
        return d["x"], d["y"]


def _load_idx_xy(name: str, data_dir: Path, split: str, prefix: str = "") -> \
        tuple[NDArray, NDArray] | None:
    tag = {"train": "train", "test": "t10k" if not prefix else "test"}[split]
    img = _find(data_dir, name, [f"{prefix}{tag}-images-idx3-ubyte",
                                 f"{prefix}{tag}-images.idx3-ubyte"])
    lab = _find(data_dir, name, [f"{prefix}{tag}-labels-idx1-ubyte",
                                 f"{prefix}{tag}-labels.idx1-ubyte"])
    if img is None or lab is None:
        return None
    return read_idx(img), read_idx(lab)


def _load_arr0(name: str, data_dir: Path, split: str) -> tuple[NDArray, NDArray] | None:
    img = _find(data_dir, name, [f"{name}-{split}-imgs.npz"])
    lab = _find(data_dir, name, [f"{name}-{split}-labels.npz"])
    if img is None or lab is None:
        return None
    with np.load(img) as a, np.load(lab) as b:
        return a["arr_0"], b["arr_0"]


def _digits(split: str) -> tuple[NDArray, NDArray]:
    from sklearn.datasets import load_digits

    d = load_digits()
    x = np.rint(d.images * (255.0 / 16.0)).astype(np.uint8)
    y = d.target.astype(np.int64)
    idx = np.arange(len(y))
    if split == "train":
        keep = idx % 5 != 0
    elif split == "test":
        keep = idx % 5 == 0
    else:
        keep = np.ones(len(y), dtype=bool)
    return x[keep], y[keep]


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, data_dir: str, split: str) -> tuple[NDArray, NDArray]:
    if name == "digits":
        return _digits(split)
    root = Path(data_dir).expanduser()
    if split == "all":
        xa, ya = _load_cached(name, data_dir, "train")
        xb, yb = _load_cached(name, data_dir, "test")
        return np.concatenate([xa, xb]), np.concatenate([ya, yb])
    out: tuple[NDArray, NDArray] | None
    if name in ("mnist", "fashion-mnist"):
        out = _load_npz_xy(name, root, split) or _load_idx_xy(name, root, split)
        wanted = f"{name}-{split}.npz (or the official IDX files)"
    elif name == "emnist-digits":
        out = _load_idx_xy(name, root, split, prefix="emnist-digits-")
        if out is not None:
            out = (np.ascontiguousarray(out[0].transpose(0, 2, 1)), out[1])
        wanted = f"emnist-digits-{split}-images-idx3-ubyte.gz and -labels-idx1-ubyte.gz"
    else:
        out = _load_arr0(name, root, split)
        wanted = f"{name}-{split}-imgs.npz and {name}-{split}-labels.npz"
    if out is None:
        raise _missing(name, root, wanted)
    x, y = out
    if x.ndim != 3 or x.shape[0] != y.shape[0]:
        raise DatasetError(f"dataset {name!r} ({split}): images {x.shape} and labels {y.shape} "
                           "do not match; expected (N, H, W) and (N,)")
    x = np.ascontiguousarray(x, dtype=np.uint8)
    y = np.asarray(y, dtype=np.int64).reshape(-1)
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


def load_image_dataset(name: str, data_dir: str, split: str = "train"
                       ) -> tuple[NDArray[np.uint8], NDArray[np.int64]]:
    """Load an image dataset as ``(x uint8 (N, H, W), y int64 (N,))``.

    Parameters
    ----------
    name : {"mnist", "fashion-mnist", "emnist-digits", "kmnist", "k49", "digits"}
    data_dir : str
        Folder holding the released files (see the module docstring); ignored for ``digits``.
    split : {"train", "test", "all"}

    Returns
    -------
    x, y : read-only arrays, cached per process (copy before modifying).

    Raises
    ------
    DatasetError
        Unknown name/split, or files missing (the message says which files and where to get them).
    """
    if name not in IMAGE_DATASETS:
        raise DatasetError(f"unknown image dataset {name!r}; allowed: {', '.join(IMAGE_DATASETS)}")
    if split not in SPLITS:
        raise DatasetError(f"unknown split {split!r} for {name!r}; allowed: {', '.join(SPLITS)}")
    return _load_cached(name, str(data_dir), split)


def keep_frequent_classes(x: NDArray, y: NDArray, min_count: int, reference_y: NDArray | None = None
                          ) -> tuple[NDArray, NDArray, NDArray[np.int64]]:
    """Keep only the classes with at least ``min_count`` samples, relabelled 0..C'-1.

    Kuzushiji-49 in paper 000 keeps the 31 classes with ≥ 6000 *training* samples: pass the
    training labels as ``reference_y`` when filtering the test split.

    Returns
    -------
    x, y : the kept samples with labels relabelled in increasing order of the original label.
    kept : the original labels that were kept.
    """
    ref = y if reference_y is None else reference_y
    labels, counts = np.unique(ref, return_counts=True)
    kept = labels[counts >= min_count].astype(np.int64)
    mask = np.isin(y, kept)
    remap = np.full(int(max(labels.max(), y.max())) + 1, -1, dtype=np.int64)
    remap[kept] = np.arange(kept.size)
    return x[mask], remap[y[mask]], kept


def flatten_unit(x: NDArray[np.uint8]) -> NDArray[np.float32]:
    """Scale pixels to [0, 1] and flatten each image: ``(N, H, W) -> (N, H*W)`` float32."""
    return (np.asarray(x, dtype=np.float32) / 255.0).reshape(len(x), -1)
