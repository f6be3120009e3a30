"""Tabular clustering datasets: embedded ones and files in their distribution formats.

Every loader returns a :class:`Dataset` with ``x`` (float64, unscaled — scaling is federated,
see :mod:`fedclust.data.scaling`), ground-truth ``y`` (int64, evaluation only) and, where the
data have one, a natural grouping ``groups`` used by the ``column`` partitioner (bank: job).
"""

from __future__ import annotations

import csv
import gzip
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.data.base import Dataset, DatasetError  # their home; re-exported here

__all__ = ["Dataset", "DatasetError", "load_dataset"]


def _need(data_dir: str, *relative: str) -> Path:
    """First existing ``data_dir/relative`` path, or a DatasetError that says what is missing."""
    if not data_dir:
        raise DatasetError(
            f"this dataset is read from files but run config 'data-dir' is empty. "
            f"Allowed: a folder holding {' or '.join(relative)}. "
            f"Fix: --run-config 'data-dir=\"/path/to/data\"'.")
    root = Path(data_dir).expanduser()
    for rel in relative:
        if (root / rel).exists():
            return root / rel
    raise DatasetError(
        f"run config 'data-dir' = {data_dir!r} does not contain {' or '.join(relative)}. "
        f"Fix: point data-dir at the folder that holds the file(s) (see docs/datasets.md).")


# ---------------------------------------------------------------------------------------------
# Embedded

def _sklearn(name: str) -> Callable[[dict[str, Any]], Dataset]:
    def load(cfg: dict[str, Any]) -> Dataset:
        from sklearn import datasets

        bunch = getattr(datasets, f"load_{name}")()
        return Dataset(name, bunch.data, bunch.target, feature_names=list(
            getattr(bunch, "feature_names", [])))

    return load


def load_blobs(cfg: dict[str, Any]) -> Dataset:
    """Isotropic Gaussian blobs (scikit-learn ``make_blobs``), seeded by the run seed."""
    from sklearn.datasets import make_blobs

    x, y = make_blobs(n_samples=int(cfg["blobs.n-samples"]), centers=int(cfg["blobs.centers"]),
                      n_features=int(cfg["blobs.n-features"]), cluster_std=float(cfg["blobs.std"]),
                      random_state=int(cfg["seed"]))
    return Dataset("blobs", x, y)


# Paper 003 §3.2.1: five Gaussians; three clients with two big clusters each plus 40 points
# of the small central cluster.
MOTIVATIONAL_COMPONENTS = [  # (mean, std, total points)
    ((0.0, 0.0), 0.2, 500),
    ((0.0, 1.0), 0.2, 1000),
    ((1.0, 1.0), 0.2, 500),
    ((1.0, 0.0), 0.2, 1000),
    ((0.5, 0.5), 0.01, 120),
]
MOTIVATIONAL_RECIPE = [
    {0: 500, 1: 500, 4: 40},
    {1: 500, 3: 500, 4: 40},
    {2: 500, 3: 500, 4: 40},
]


def load_motivational(cfg: dict[str, Any]) -> Dataset:
    """The exact 5-Gaussian, 3-client non-IID example of paper 003 §3.2.1 (seeded)."""
    rng = np.random.default_rng(int(cfg["seed"]))
    xs, ys = [], []
    for label, (mean, std, n) in enumerate(MOTIVATIONAL_COMPONENTS):
        xs.append(rng.normal(loc=mean, scale=std, size=(n, 2)))
        ys.append(np.full(n, label))
    return Dataset("motivational", np.concatenate(xs), np.concatenate(ys),
                   recipe=[dict(r) for r in MOTIVATIONAL_RECIPE])


# ---------------------------------------------------------------------------------------------
# Files

def read_arff(path: Path) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Numeric ARFF with the class as the last attribute (rows with a missing class dropped)."""
    rows = []
    in_data = False
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line or line.startswith("%"):
                continue
            if in_data:
                rows.append(line.split(","))
            elif line.lower().startswith("@data"):
                in_data = True
    rows = [r for r in rows if r[-1].strip() not in ("", "?")]
    arr = np.array([[float(v) for v in r] for r in rows])
    return arr[:, :-1], arr[:, -1].astype(np.int64)


def load_xclara(cfg: dict[str, Any]) -> Dataset:
    x, y = read_arff(_need(cfg["data-dir"], "xclara.arff", "clustering/xclara.arff"))
    return Dataset("xclara", x, y, feature_names=["x", "y"])


def load_s_set1(cfg: dict[str, Any]) -> Dataset:
    root = cfg["data-dir"]
    try:
        data = _need(root, "s1.data.gz", "clustering/s1.data.gz", "s1.txt", "clustering/s1.txt")
        labels = _need(root, "s1.labels0.gz", "clustering/s1.labels0.gz", "s1-label.pa",
                       "clustering/s1-label.pa")
        x = np.loadtxt(data)
        y = np.loadtxt(_skip_pa_header(labels), dtype=np.int64)
        return Dataset("s-set1", x, y - y.min(), feature_names=["x", "y"])
    except DatasetError:
        x, y = read_arff(_need(root, "s-set1.arff", "clustering/s-set1.arff"))
        return Dataset("s-set1", x, y, feature_names=["x", "y"])


def _skip_pa_header(path: Path) -> list[str]:
    """Lines of a SIPU partition (.pa) file without its header (labels only)."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        lines = [ln.strip() for ln in fh]
    return [ln for ln in lines if ln and ln.lstrip("-").isdigit()]


def load_g2(cfg: dict[str, Any]) -> Dataset:
    """SIPU G2 set ``g2-D-sigma`` (2048 points, two Gaussians) with its ground truth."""
    d, s = int(cfg["g2.dim"]), int(cfg["g2.sigma"])
    stem = f"g2-{d}-{s}"
    path = _need(cfg["data-dir"], *[f"{pre}{stem}{ext}" for pre in ("", "g2/", "clustering/g2/")
                                     for ext in (".csv.gz", ".csv", ".txt")])
    delim = "," if ".csv" in path.name else None
    x = np.loadtxt(path, delimiter=delim, ndmin=2)
    gt = _need(cfg["data-dir"], "g2-gt.txt", "g2/g2-gt.txt", "clustering/g2/g2-gt.txt",
               f"{stem}-gt.pa", f"g2/{stem}-gt.pa")
    y = np.loadtxt(_skip_pa_header(gt), dtype=np.int64)
    if y.size != x.shape[0]:
        raise DatasetError(f"data-dir file {gt.name} has {y.size} labels but {path.name} has "
                           f"{x.shape[0]} points. Fix: download both files of {stem} again")
    return Dataset(stem, x, y - y.min())


def load_pendigits(cfg: dict[str, Any]) -> Dataset:
    """UCI pendigits: training + test files (10,992 × 16)."""
    parts = [np.loadtxt(_need(cfg["data-dir"], f"pendigits.{ext}", f"uci/pendigits.{ext}"),
                        delimiter=",") for ext in ("tra", "tes")]
    arr = np.concatenate(parts)
    return Dataset("pendigits", arr[:, :-1], arr[:, -1].astype(np.int64))


def load_waveform(cfg: dict[str, Any]) -> Dataset:
    """UCI waveform v1 (5,000 × 21, 3 classes)."""
    arr = np.loadtxt(_need(cfg["data-dir"], "waveform.data", "uci/waveform.data"), delimiter=",")
    return Dataset("waveform", arr[:, :-1], arr[:, -1].astype(np.int64))


EDUCATION = {"primary": 1.0, "secondary": 2.0, "tertiary": 3.0}


def load_bank(cfg: dict[str, Any]) -> Dataset:
    """UCI bank marketing with paper 003's preprocessing (§3.2.3).

    Features age, balance, education (primary 1 / secondary 2 / tertiary 3); rows with an
    ``unknown`` job or education dropped. Standardisation is left to the federated scaling step
    (``scaling=standard``). ``groups["job"]`` gives the one-client-per-job split; ``y`` (the
    job index) is only a placeholder ground truth — bank marketing has no cluster labels.
    """
    path = _need(cfg["data-dir"], "bank-full.csv", "uci/bank-full.csv")
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh, delimiter=";")
        rows = [r for r in reader if r["job"] != "unknown" and r["education"] in EDUCATION]
    jobs = sorted({r["job"] for r in rows})
    x = np.array([[float(r["age"]), float(r["balance"]), EDUCATION[r["education"]]]
                  for r in rows])
    job = np.array([jobs.index(r["job"]) for r in rows], dtype=np.int64)
    return Dataset("bank", x, job, groups={"job": job}, feature_names=["age", "balance",
                                                                       "education"])


DATASETS: dict[str, Callable[[dict[str, Any]], Dataset]] = {
    "iris": _sklearn("iris"),
    "wine": _sklearn("wine"),
    "digits": _sklearn("digits"),
    "blobs": load_blobs,
    "motivational": load_motivational,
    "xclara": load_xclara,
    "s-set1": load_s_set1,
    "g2": load_g2,
    "pendigits": load_pendigits,
    "waveform": load_waveform,
    "bank": load_bank,
}
FILE_DATASETS = ("xclara", "s-set1", "g2", "pendigits", "waveform", "bank")


#: What a node without data of its own is told (a user of ``dataset='local'``/``'files'``).
OWN_DATA_HELP = {
    "local": "run config 'dataset' = 'local' means every node reads its own file, named by its "
             "node config 'data-path', but this node has no data-path. Fix: start each "
             "SuperNode with --node-config 'data-path=\"/path/to/its/data.csv\"' (a csv, tsv, "
             "txt, npz or npy file, or a folder of images); in a simulation, use "
             "dataset='files' with data-dir = a folder holding one file per client",
    "files": "run config 'dataset' = 'files' gives each simulated client one file of data-dir, "
             "but this node is not a simulated client (it has no partition-id). Fix: on a "
             "deployed node use dataset='local' and node config 'data-path'",
}


def load_dataset(cfg: dict[str, Any]) -> Dataset:
    """Load ``cfg["dataset"]``; raise :class:`DatasetError` with a fix if it cannot be loaded."""
    name = cfg["dataset"]
    if name == "hf":     # Hugging Face datasets (fedclust[hf]): imported only when asked for
        from fedclust.data.hf import load_hf

        return load_hf(cfg)
    if name not in DATASETS:
        if name in ("local", "files"):
            raise DatasetError(OWN_DATA_HELP[name])
        raise DatasetError(f"run config 'dataset' = {name!r} is not a tabular dataset. Allowed: "
                           f"{', '.join(sorted(DATASETS))}, 'hf' (Hugging Face datasets: "
                           f"hf.path), or 'local' (each deployed node "
                           f"reads its own data-path) or 'files' (one file per simulated "
                           f"client in data-dir). Fix: --run-config 'dataset=\"blobs\"'.")
    return DATASETS[name](cfg)
