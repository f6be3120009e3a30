"""Supervised clustered-FL datasets of paper 001: Rotated (Fashion-)MNIST and Backdoor MNIST.

Every client holds labelled images from one of several *sets* (a rotation, or a colouring).
Client ``i`` belongs to set ``i % S`` (interleaved, so no helper may assume contiguous blocks).
Each set gets its own shuffle of the full image pool (images repeat across sets, as in the
authors' notebooks); the ``j``-th client of a set takes the ``j``-th slice of ``samples``
images of that shuffle, and 10 % of them (``val_fraction``) become its validation set; the rest
is its train set (halved for Backdoor sets 0 and 2, after the validation split:
:func:`split_sizes`). The test split is drawn the same way from the official test images and
transformed like the set.

Rotation groups (degrees, one per set) and their **ground-truth clusters** (evaluation only):

=========  ========================  ==========================================================
group      rotations of the 4 sets   ground-truth clusters
=========  ========================  ==========================================================
``max``    0, 90, 180, 270           4 (every rotation is its own distribution)
``min``    −3, −1, 1, 3              1 (the paper's Table 10 "Min": EMD-CFL's ARI 1.00 and
                                     IFCA(k=2)'s ARI 0.00 only agree with a single cluster)
``two``    −3, 3, 177, 183           2 ({−3, 3} and {177, 183})
``no``     0, 0, 0, 0                1
=========  ========================  ==========================================================

Rotations by a multiple of 90° use exact ``np.rot90``; other angles use nearest-neighbour
interpolation (``scipy.ndimage.rotate`` with ``order=0``, same output size, zero fill), the
default of the authors' ``TF.rotate``.

Backdoor MNIST (3 sets, 3 channels; paper App. C.4 / authors' ``colormnist.ipynb``):
set 0 uniform green, set 1 green whose shade follows the digit (the backdoor feature), set 2
uniform purple; train sizes ×0.5 / ×1 / ×0.5. Two palettes (``emdcfl.backdoor-colours``):

- ``authors`` (the notebook): green ``(0.26, 0.63, 0.4)``, shades ``summer(y/39)`` (the first
  10 of a 40-colour summer map: red 0 … 0.23, a narrow band), purple ``(149, 52, 235)/255``;
- ``wide`` (this project's earlier choice, a deviation): green ``summer(0.5)``, shades
  ``summer(y/9)`` (red 0 … 1, green to yellow), purple ``(0.5, 0, 0.5)``.

``x_test_bd`` re-colours the test digits of the green sets with the shade of label ``9 − y``
(the manipulated backdoor feature, as the authors' notebook); a backdoored target model loses
accuracy on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numpy.typing import NDArray

ROTATIONS: dict[str, tuple[float, ...]] = {
    "max": (0.0, 90.0, 180.0, 270.0),
    "min": (-3.0, -1.0, 1.0, 3.0),
    "two": (-3.0, 3.0, 177.0, 183.0),
    "no": (0.0, 0.0, 0.0, 0.0),
}
GROUND_TRUTH: dict[str, tuple[int, ...]] = {
    "max": (0, 1, 2, 3), "min": (0, 0, 0, 0), "two": (0, 0, 1, 1), "no": (0, 0, 0, 0),
    "backdoor": (0, 1, 2),
}
BASE_IMAGES = {"rotmnist": "mnist", "rotfmnist": "fashion-mnist", "rotdigits": "digits",
               "backdoor-mnist": "mnist"}
DATASETS: tuple[str, ...] = tuple(BASE_IMAGES)
BACKDOOR_TRAIN_FACTOR = (0.5, 1.0, 0.5)


@dataclass
class ClientSplit:
    """One client's data. ``set_id``/``cluster`` are ground truth (evaluation path only)."""

    x_train: NDArray
    y_train: NDArray[np.int64]
    x_val: NDArray
    y_val: NDArray[np.int64]
    x_test: NDArray
    y_test: NDArray[np.int64]
    set_id: int
    cluster: int
    x_test_bd: NDArray | None = None


def num_sets(dataset: str) -> int:
    return 3 if dataset == "backdoor-mnist" else 4


def ground_truth(dataset: str, rotation: str, num_clients: int) -> NDArray[np.int64]:
    """Ground-truth cluster of every client (evaluation/oracle only)."""
    table = GROUND_TRUTH["backdoor" if dataset == "backdoor-mnist" else rotation]
    s = num_sets(dataset)
    return np.array([table[i % s] for i in range(num_clients)], dtype=np.int64)


def rotate(images: NDArray, angle: float) -> NDArray:
    """Rotate a batch ``(N, H, W[, C])`` counter-clockwise by ``angle`` degrees.

    Exact array rotation for multiples of 90°, nearest-neighbour interpolation otherwise.
    """
    images = np.asarray(images)
    quarter = angle / 90.0
    if float(quarter).is_integer():
        return np.ascontiguousarray(np.rot90(images, k=int(quarter) % 4, axes=(1, 2)))
    from scipy.ndimage import rotate as nd_rotate

    out = nd_rotate(images.astype(np.float32), angle, axes=(2, 1), reshape=False, order=0,
                    mode="constant", cval=0.0)
    return np.clip(np.rint(out), 0, 255).astype(images.dtype)


def summer(v: NDArray) -> NDArray[np.float32]:
    """Matplotlib's ``summer`` colormap: ``v ↦ (v, 0.5 + v/2, 0.4)``, ``v`` in [0, 1]."""
    v = np.asarray(v, dtype=np.float32)
    return np.stack([v, 0.5 + 0.5 * v, np.full_like(v, 0.4)], axis=-1)


PURPLE = np.array([0.5, 0.0, 0.5], dtype=np.float32)
PALETTES = ("wide", "authors")
AUTHORS_GREEN = np.array([0.26, 0.63, 0.4], dtype=np.float32)
AUTHORS_PURPLE = np.array([149, 52, 235], dtype=np.float32) / 255.0


def colourise(images: NDArray, colours: NDArray) -> NDArray[np.uint8]:
    """Grey ``(N, H, W)`` × per-image RGB colour ``(N, 3)`` → ``(N, H, W, 3)`` uint8."""
    out = images[..., None].astype(np.float32) * colours[:, None, None, :]
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def backdoor_colours(set_id: int, labels: NDArray, palette: str = "wide"
                     ) -> NDArray[np.float32]:
    """RGB colour ``(n, 3)`` of each image of Backdoor set ``set_id`` (see the module doc).

    Raises
    ------
    ValueError
        Unknown ``palette``.
    """
    if palette not in PALETTES:
        raise ValueError(f"unknown backdoor palette {palette!r}; one of {PALETTES}")
    n, authors = len(labels), palette == "authors"
    if set_id == 0:
        green = AUTHORS_GREEN[None] if authors else summer(np.array([0.5]))
        return np.repeat(green, n, axis=0)
    if set_id == 1:
        return summer(np.asarray(labels) / (39.0 if authors else 9.0))
    return np.repeat((AUTHORS_PURPLE if authors else PURPLE)[None], n, axis=0)


@lru_cache(maxsize=4)
def _base(name: str, data_dir: str, split: str) -> tuple[NDArray, NDArray]:
    from fedclust.data.images import load_image_dataset

    x, y = load_image_dataset(name, data_dir, split=split)
    return x, y.astype(np.int64)


def check_files(dataset: str, data_dir: str) -> None:
    """Load the base images of ``dataset`` (train and test) as every simulated client will.

    Raises
    ------
    ValueError
        Unknown dataset.
    fedclust.data.images.DatasetError
        A base file is missing under ``data_dir`` (the message names the file and the fix).
    """
    if dataset not in BASE_IMAGES:
        raise ValueError(f"unknown EMD-CFL dataset {dataset!r}; one of {DATASETS}")
    for split in ("train", "test"):
        _base(BASE_IMAGES[dataset], data_dir, split)


def _slice(pool_size: int, set_id: int, index: int, n: int, seed: int, tag: int
           ) -> NDArray[np.int64]:
    """Indices of the ``index``-th slice of ``n`` in set ``set_id``'s own shuffle (wraps)."""
    order = np.random.default_rng([seed, set_id, tag]).permutation(pool_size)
    return order[(index * n + np.arange(n)) % pool_size]


def client_split(dataset: str, rotation: str, client: int, num_clients: int, samples: int,
                 test_samples: int, val_fraction: float, seed: int, data_dir: str = "",
                 palette: str = "wide") -> ClientSplit:
    """Client ``client``'s train/val/test data (see the module docstring).

    Parameters
    ----------
    dataset : {"rotmnist", "rotfmnist", "rotdigits", "backdoor-mnist"}
    rotation : {"max", "min", "two", "no"}
        Rotation group (ignored for backdoor-mnist).
    samples, test_samples : int
        Images per client before the validation split, and test images per client.
    val_fraction : float
        Share of ``samples`` kept for validation (at least one image).
    seed : int
        Run seed; the same seed gives the same federation.
    palette : {"wide", "authors"}
        Backdoor MNIST colours (``emdcfl.backdoor-colours``; ignored for the rotated sets).
    """
    if dataset not in BASE_IMAGES:
        raise ValueError(f"unknown EMD-CFL dataset {dataset!r}; one of {DATASETS}")
    s = num_sets(dataset)
    set_id, index = client % s, client // s
    x_pool, y_pool = _base(BASE_IMAGES[dataset], data_dir, "train")
    x_tpool, y_tpool = _base(BASE_IMAGES[dataset], data_dir, "test")
    n_train, n_val = split_sizes(dataset, set_id, samples, val_fraction)
    idx = _slice(len(x_pool), set_id, index, samples, seed, 0)
    tidx = _slice(len(x_tpool), set_id, index, test_samples, seed, 1)
    x, y, xt, yt = x_pool[idx], y_pool[idx], x_tpool[tidx], y_tpool[tidx]
    x_bd = None
    if dataset == "backdoor-mnist":
        if set_id < 2:          # green sets: shade the digits like label 9 − y (the notebook)
            x_bd = colourise(xt, backdoor_colours(1, 9 - yt, palette))
        else:
            x_bd = colourise(xt, backdoor_colours(2, yt, palette))
        x = colourise(x, backdoor_colours(set_id, y, palette))
        xt = colourise(xt, backdoor_colours(set_id, yt, palette))
    else:
        angle = ROTATIONS[rotation][set_id]
        x, xt = rotate(x, angle), rotate(xt, angle)
    perm = np.random.default_rng([seed, client, 2]).permutation(len(x))
    val, tr = perm[:n_val], perm[n_val:n_val + n_train]
    gt = ground_truth(dataset, rotation, num_clients)[client]
    return ClientSplit(x[tr], y[tr], x[val], y[val], xt, yt, set_id, int(gt), x_bd)


def split_sizes(dataset: str, set_id: int, samples: int, val_fraction: float
                ) -> tuple[int, int]:
    """(train, validation) images of a client of set ``set_id``.

    Validation is split off the client's ``samples`` images first (``round(val_fraction ·
    samples)``, at least 1), so every client has the same validation size; only then are the
    Backdoor MNIST train sets of sets 0 and 2 halved (the authors' ``colormnist.ipynb``: 542
    validation images for every client). Equal validation sizes keep the reference distance an
    unbiased noise floor (docs/emdcfl.md, "Known limits").
    """
    n_val = max(1, int(round(val_fraction * samples)))
    n_train = samples - n_val
    if dataset == "backdoor-mnist":
        n_train = max(1, int(round(n_train * BACKDOOR_TRAIN_FACTOR[set_id])))
    return n_train, n_val


def image_shape(dataset: str) -> tuple[int, int]:
    """(channels, side) of the images of ``dataset``."""
    return (3 if dataset == "backdoor-mnist" else 1, 8 if dataset == "rotdigits" else 28)


#: the arrays of an EMD-CFL node's ``.npz`` (its ``data-path``, or a site file of
#: ``dataset="files"``): each image split and its labels; ``cluster`` (the true group, for the
#: evaluation path) is optional
FILE_SPLITS = {"x_train": "y_train", "x_val": "y_val", "x_test": "y_test"}


def read_node_file(path: str, image_shape: tuple[int, ...], n_classes: int
                   ) -> dict[str, np.ndarray]:
    """An EMD-CFL node's ``.npz`` through the node data door
    (:func:`fedclust.data.local.load_image_arrays`): the :data:`FILE_SPLITS` arrays, images of
    ``image_shape`` with pixel values 0..255, labels ``0..n_classes-1``, size limits, data-free
    errors. What a node reads and what ``fedclust check`` reads of ``dataset="files"``."""
    from fedclust.data.local import load_image_arrays

    return load_image_arrays(path, FILE_SPLITS, [image_shape], n_classes, optional=("cluster",))


def file_image_shape(channels: int, side: int) -> tuple[int, ...]:
    """The shape of one image in a node's file: ``(side, side)`` grey, else with channels
    last."""
    return (side, side) if channels == 1 else (side, side, channels)
