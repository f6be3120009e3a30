"""The ARI oracle on every entry path: the federated ``eval_ari`` (and FedFCM's ARI of every K)
equals scikit-learn's ``adjusted_rand_score`` on the pooled true labels and the clusters the
clients received (``RunResult.labels``), whatever the labels' type and however skewed the
split — clients that lack whole classes included.

A per-client renumbering of the labels (a client holding classes {1, 2} sending them as
{0, 1}) adds unrelated classes row by row and breaks the equality; so does any path that codes
labels differently from the node's own coding (:func:`fedclust.data.local.label_codes`).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

import fedclust
from fedclust.data import scaling

CENTRES = np.array([[0.0, 0.0], [5.0, 0.0], [0.0, 5.0], [5.0, 5.0]])
NAMES = np.array(["healthy", "flu", "sick", "asthma"])


def blobs(n: int = 480, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Four overlapping groups (ARI well below 1: a wrong contingency table shows)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 4, n)
    return CENTRES[y] + rng.normal(0, 1.4, (n, 2)), y


def dirichlet_split(y: np.ndarray, clients: int, alpha: float, seed: int) -> list[np.ndarray]:
    """Row indices of a Dirichlet label skew (every client non-empty)."""
    rng = np.random.default_rng(seed)
    owner = np.empty(len(y), dtype=int)
    for c in np.unique(y):
        rows = rng.permutation(np.flatnonzero(y == c))
        share = rng.dirichlet(np.full(clients, alpha))
        owner[rows] = np.minimum(np.searchsorted(np.cumsum(share), rng.random(len(rows))),
                                 clients - 1)
    parts = [np.flatnonzero(owner == k) for k in range(clients)]
    assert all(len(p) for p in parts)
    return parts


def pooled(values) -> np.ndarray:
    return np.concatenate([np.asarray(v).reshape(-1) for v in values])


def assert_oracle(res, truth: list, key: str = "eval_ari") -> float:
    """``res.metrics[key]`` is scikit-learn's ARI of the pooled truth and the clients' labels."""
    expected = adjusted_rand_score(pooled(truth), pooled(res.labels))
    assert expected < 0.999, "the oracle needs imperfect clusters: a wrong table must show"
    assert res.metrics[key] == pytest.approx(expected, abs=1e-12)
    return expected


def lacks_a_class(truth: list, n_classes: int) -> bool:
    return any(len(set(np.asarray(t).tolist())) < n_classes for t in truth)


RUN = {"plots": False}


def test_arrays_with_integer_labels_under_dirichlet_skew(tmp_path):
    x, y = blobs()
    parts = dirichlet_split(y, 4, 0.3, seed=1)
    truth = [y[p] + 1 for p in parts]       # classes 1..4: no client renumbers them
    assert lacks_a_class(truth, 4)
    res = fedclust.simulate("exact-fcm", [x[p] for p in parts], truth, n_clusters=4,
                            output_dir=tmp_path / "run", run_config=RUN)
    assert_oracle(res, truth)


@pytest.mark.parametrize("kind", ["text", "category", "bool", "int-with-gaps"])
def test_dataframes_with_labels_of_any_type(tmp_path, kind):
    pd = pytest.importorskip("pandas")
    x, y = blobs(seed=2)
    if kind == "bool":
        y = (y >= 2).astype(int)     # two true groups
    parts = dirichlet_split(y, 3, 0.4, seed=3)
    frames, truth = [], []
    for p in parts:
        frame = pd.DataFrame(x[p], columns=["a", "b"])
        if kind == "text":
            frame["diagnosis"] = NAMES[y[p]]
        elif kind == "category":
            frame["diagnosis"] = pd.Categorical(NAMES[y[p]], categories=list(NAMES))
        elif kind == "bool":
            frame["diagnosis"] = y[p].astype(bool)
        else:
            frame["diagnosis"] = y[p] * 7 + 3          # 3, 10, 17, 24
        frames.append(frame)
        truth.append(frame["diagnosis"].astype(str).to_numpy())
    res = fedclust.simulate("exact-fcm", frames, label_column="diagnosis",
                            n_clusters=2 if kind == "bool" else 4,
                            output_dir=tmp_path / "run", run_config=RUN)
    assert_oracle(res, truth)


def test_text_label_lists_and_clients_without_whole_classes(tmp_path):
    x, y = blobs(seed=4)
    parts = [np.flatnonzero(np.isin(y, keep)) for keep in ([0, 1], [1, 2], [2, 3, 0])]
    truth = [list(NAMES[y[p]]) for p in parts]          # plain Python lists of str
    res = fedclust.simulate("exact-fcm", [x[p] for p in parts], truth, n_clusters=4,
                            output_dir=tmp_path / "run", run_config=RUN)
    assert lacks_a_class(truth, 4)
    assert_oracle(res, truth)


def _fedfcm_labels(res, clients: list[np.ndarray], k: int) -> list[np.ndarray]:
    """Each row's cluster at ``k``: the nearest of FedFCM's centers for that K (scaled)."""
    shift = res.arrays["scaling_shift"].numpy()
    scale = res.arrays["scaling_scale"].numpy()
    centers = res.arrays[f"centers_k{k}"].numpy()
    return [np.argmin(((scaling.apply(x, shift, scale)[:, None, :] - centers[None]) ** 2)
                      .sum(-1), axis=1) for x in clients]


def test_fedfcm_every_k_with_text_labels_under_skew(tmp_path):
    x, y = blobs(seed=5)
    parts = dirichlet_split(y, 3, 0.3, seed=6)
    clients = [x[p] for p in parts]
    truth = [NAMES[y[p]] for p in parts]
    res = fedclust.simulate("fedfcm", clients, truth, k_min=2, k_max=5,
                            output_dir=tmp_path / "run", run_config=RUN)
    per_k = res.metrics["eval_ari"]
    assert sorted(per_k) == ["2", "3", "4", "5"]
    for k, got in per_k.items():
        expected = adjusted_rand_score(pooled(truth), pooled(_fedfcm_labels(res, clients, int(k))))
        assert got == pytest.approx(expected, abs=1e-12), k
    assert_oracle(res, truth, "eval_ari_best_k")


# ------------------------------------------------------------------ Hugging Face / flwr-datasets

datasets = pytest.importorskip("datasets", reason="pip install 'fedclust[hf]'")
partitioner = pytest.importorskip("flwr_datasets.partitioner", reason="pip install 'fedclust[hf]'")


def hf_blobs(label: str = "int", seed: int = 7):
    x, y = blobs(seed=seed)
    labels = NAMES[y].tolist() if label == "text" else y.tolist()
    return datasets.Dataset.from_dict({"a": x[:, 0], "b": x[:, 1], "label": labels})


@pytest.mark.parametrize(("make", "label"), [
    (lambda: partitioner.DirichletPartitioner(num_partitions=4, partition_by="label",
                                              alpha=0.3, min_partition_size=5, seed=0), "int"),
    (lambda: partitioner.PathologicalPartitioner(num_partitions=4, partition_by="label",
                                                 num_classes_per_partition=2, seed=0), "int"),
    (lambda: partitioner.DirichletPartitioner(num_partitions=3, partition_by="label",
                                              alpha=0.5, min_partition_size=5, seed=1), "text"),
], ids=["dirichlet", "pathological", "dirichlet-text"])
def test_a_hf_dataset_split_by_a_partitioner(tmp_path, make, label):
    ds, part = hf_blobs(label), make()
    res = fedclust.simulate("exact-fcm", dataset=ds, partitioner=part, label_column="label",
                            n_clusters=4, output_dir=tmp_path / "run", run_config=RUN)
    truth = [part.load_partition(i)["label"] for i in range(part.num_partitions)]
    assert lacks_a_class(truth, 4)
    assert_oracle(res, truth)


def test_fedfcm_on_a_pathological_partition(tmp_path):
    ds = hf_blobs("int", seed=8)
    part = partitioner.PathologicalPartitioner(num_partitions=3, partition_by="label",
                                               num_classes_per_partition=2, seed=2)
    res = fedclust.simulate("fedfcm", dataset=ds, partitioner=part, label_column="label",
                            k_min=3, k_max=4, output_dir=tmp_path / "run", run_config=RUN)
    truth = [part.load_partition(i)["label"] for i in range(3)]
    clients = [np.column_stack([p["a"], p["b"]]) for p in map(part.load_partition, range(3))]
    for k, got in res.metrics["eval_ari"].items():
        expected = adjusted_rand_score(pooled(truth), pooled(_fedfcm_labels(res, clients, int(k))))
        assert got == pytest.approx(expected, abs=1e-12), k


def test_run_config_dataset_hf_under_dirichlet_skew(tmp_path):
    """``dataset="hf"`` through the ServerApp's own path: one coding of the whole dataset
    before fedclust partitions it, the oracle on the rows each client received."""
    from fedclust.data.partition import make_partition
    from fedclust.data.tabular import load_dataset
    from server_app.inprocess import run_server

    hf_blobs("text", seed=9).save_to_disk(str(tmp_path / "saved"))
    cfg = {"method": "exact-fcm", "dataset": "hf", "hf.path": str(tmp_path / "saved"),
           "hf.label-column": "label", "fcm.n-clusters": 4, "partition.kind": "dirichlet",
           "partition.alpha": 0.3, "num-clients": 4, "seed": 2, "plots": False,
           "output-dir": str(tmp_path / "run")}
    summary, _ = run_server(cfg, num_nodes=4)
    ds = load_dataset({**cfg, "evaluate": True})
    parts = make_partition("dirichlet", ds, 4, 2, 0.3, "", options={
        **cfg, "partition.classes-per-client": 2, "partition.shards-per-client": 2,
        "partition.sizes": ""})
    raw = np.array(datasets.load_from_disk(str(tmp_path / "saved"))["label"])
    pred = [np.loadtxt(tmp_path / "run" / "clients" / str(i) / "assignments.csv",
                       delimiter=",", skiprows=1)[:, 1] for i in range(4)]
    assert [len(p) for p in parts] == [len(p) for p in pred]
    expected = adjusted_rand_score(pooled([raw[p] for p in parts]), pooled(pred))
    assert expected < 0.999
    assert summary["metrics"]["eval_ari"] == pytest.approx(expected, abs=1e-12)
    assert summary["data"]["partition"] == {"kind": "dirichlet", "alpha": 0.3}
