"""Flower Datasets and Hugging Face data as first-class inputs, offline: a
``FederatedDataset`` (client ``i`` is ``load_partition(i)``), a ``DatasetDict`` with
``split=``, a list of ``Dataset`` (one per client), and Parquet files in ``dataset="files"`` and
on a deployed node. Each run records what it clustered in ``summary.json``'s ``data``: the
dataset, the partitioner's class and parameters, the Hugging Face fingerprint."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

import fedclust
from fedclust.config import ConfigError, validate
from fedclust.results import data_record, recorded_config

datasets = pytest.importorskip("datasets", reason="pip install 'fedclust[hf]'")
fp = pytest.importorskip("flwr_datasets.partitioner", reason="pip install 'fedclust[hf]'")
flwr_datasets = pytest.importorskip("flwr_datasets")
pd = pytest.importorskip("pandas")

NAMES = np.array(["healthy", "flu", "sick"])
RUN = {"plots": False}


def table(n: int = 300, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = np.array([[0.0, 0.0], [4.0, 0.0], [0.0, 4.0]])[y] + rng.normal(0, 1.3, (n, 2))
    return pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "diagnosis": NAMES[y]})


def summary(res) -> dict:
    return json.loads((res.run_dir / "summary.json").read_text())


def pooled_ari(truth, res) -> float:
    return adjusted_rand_score(np.concatenate([np.asarray(t) for t in truth]),
                               np.concatenate(res.labels))


def test_a_federated_dataset_gives_client_i_its_partition_i(tmp_path):
    table(seed=1).to_csv(tmp_path / "all.csv", index=False)
    part = fp.DirichletPartitioner(num_partitions=3, partition_by="diagnosis", alpha=0.4,
                                   min_partition_size=5, seed=3)
    fds = flwr_datasets.FederatedDataset(dataset="csv", data_files=str(tmp_path / "all.csv"),
                                         partitioners={"train": part},
                                         cache_dir=str(tmp_path / "cache"))
    res = fedclust.simulate("exact-fcm", dataset=fds, label_column="diagnosis", n_clusters=3,
                            output_dir=tmp_path / "run", run_config=RUN)
    parts = [fds.load_partition(i) for i in range(3)]
    assert [len(lab) for lab in res.labels] == [p.num_rows for p in parts]
    assert res.metrics["eval_ari"] == pytest.approx(
        pooled_ari([p["diagnosis"] for p in parts], res), abs=1e-12)
    data = summary(res)["data"]
    assert summary(res)["dataset"] == data["dataset"] == "hf:csv"
    assert data["source"] == "flwr_datasets.FederatedDataset"
    assert data["partitioner"]["class"] == "flwr_datasets.partitioner.DirichletPartitioner"
    assert data["partitioner"]["params"]["num_partitions"] == 3
    assert data["partitioner"]["params"]["seed"] == 3
    assert data["partitioner"]["params"]["partition_by"] == "diagnosis"
    assert data["hf"]["fingerprint"] == part.dataset._fingerprint
    assert data["hf"]["split"] == "train" and data["hf"]["rows"] == 300
    assert "partition.kind" not in summary(res)["config"]   # not fedclust's partition


def test_a_dataset_dict_with_split_and_its_refusals(tmp_path):
    table(seed=2).to_csv(tmp_path / "train.csv", index=False)
    table(60, seed=3).to_csv(tmp_path / "test.csv", index=False)
    dd = datasets.load_dataset("csv", data_files={"train": str(tmp_path / "train.csv"),
                                                  "test": str(tmp_path / "test.csv")},
                               cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match=r"splits \['test', 'train'\]: say which"):
        fedclust.simulate("exact-fcm", dataset=dd, partitioner=fp.IidPartitioner(2),
                          label_column="diagnosis")
    with pytest.raises(ConfigError, match="split='valid' is not a split"):
        fedclust.simulate("exact-fcm", dataset=dd, split="valid",
                          partitioner=fp.IidPartitioner(2), label_column="diagnosis")
    with pytest.raises(ConfigError, match="DatasetDict without partitioner="):
        fedclust.simulate("exact-fcm", dataset=dd, split="train", label_column="diagnosis")
    part = fp.IidPartitioner(num_partitions=3)
    res = fedclust.simulate("exact-fcm", dataset=dd, split="test", partitioner=part,
                            label_column="diagnosis", n_clusters=3,
                            output_dir=tmp_path / "run", run_config=RUN)
    assert sum(len(lab) for lab in res.labels) == 60
    truth = [part.load_partition(i)["diagnosis"] for i in range(3)]
    assert res.metrics["eval_ari"] == pytest.approx(pooled_ari(truth, res), abs=1e-12)
    data = summary(res)["data"]
    assert data["hf"]["split"] == "test" and data["hf"]["fingerprint"] == dd["test"]._fingerprint
    assert data["partitioner"] == {"class": "flwr_datasets.partitioner.IidPartitioner",
                                   "params": {"num_partitions": 3}}


def test_a_list_of_datasets_one_per_client(tmp_path):
    frames = [table(100, seed=s) for s in (4, 5, 6)]
    frames[1] = frames[1][frames[1]["diagnosis"] != "sick"]      # a client without a class
    clients = [datasets.Dataset.from_pandas(f, preserve_index=False) for f in frames]
    res = fedclust.simulate("exact-fcm", clients, label_column="diagnosis", n_clusters=3,
                            output_dir=tmp_path / "run", run_config=RUN)
    assert res.feature_names == ["a", "b"]
    assert res.metrics["eval_ari"] == pytest.approx(
        pooled_ari([f["diagnosis"] for f in frames], res), abs=1e-12)
    data = summary(res)["data"]
    assert [d["fingerprint"] for d in data["datasets"]] == [c._fingerprint for c in clients]
    assert data["rows"] == [len(f) for f in frames]


def test_a_federated_dataset_takes_no_second_partitioner(tmp_path):
    table().to_csv(tmp_path / "all.csv", index=False)
    fds = flwr_datasets.FederatedDataset(dataset="csv", data_files=str(tmp_path / "all.csv"),
                                         partitioners={"train": 2},
                                         cache_dir=str(tmp_path / "cache"))
    with pytest.raises(ConfigError, match="partitioner= does not apply"):
        fedclust.simulate("exact-fcm", dataset=fds, partitioner=fp.IidPartitioner(2))


# ------------------------------------------------------------------ Parquet

def write_parquet_sites(folder) -> list[pd.DataFrame]:
    folder.mkdir()
    frames = [table(120, seed=s) for s in (7, 8, 9)]
    frames[2] = frames[2][frames[2]["diagnosis"] != "flu"]
    for i, f in enumerate(frames):
        f = f.assign(diagnosis=f["diagnosis"].astype("category"))
        f.to_parquet(folder / f"site{i}.parquet", index=False)
    return frames


def central_ari(folders, frames) -> float:
    pred = [np.loadtxt(folder / "assignments.csv", delimiter=",", skiprows=1)[:, 1]
            for folder in folders]
    return adjusted_rand_score(np.concatenate([f["diagnosis"] for f in frames]),
                               np.concatenate(pred))


def test_parquet_site_files_in_dataset_files(tmp_path):
    from server_app.inprocess import run_server

    frames = write_parquet_sites(tmp_path / "sites")
    out = tmp_path / "run"
    result, _ = run_server({"method": "exact-fcm", "dataset": "files",
                            "data-dir": str(tmp_path / "sites"),
                            "files.label-column": "diagnosis", "fcm.n-clusters": 3,
                            "output-dir": str(out), "plots": False})
    folders = [out / "clients" / str(i) for i in range(3)]
    assert result["metrics"]["eval_ari"] == pytest.approx(central_ari(folders, frames),
                                                          abs=1e-12)
    assert result["data"]["dataset"] == "files"


def test_parquet_on_a_deployed_node(tmp_path):
    from tests.fake_grid import run_server

    frames = write_parquet_sites(tmp_path / "sites")
    nodes = [{"data-path": str(tmp_path / "sites" / f"site{i}.parquet"),
              "label-column": "diagnosis", "allow-evaluation": True} for i in range(3)]
    out = tmp_path / "run"
    result, _ = run_server({"method": "exact-fcm", "dataset": "local", "fcm.n-clusters": 3,
                            "output-dir": str(out), "plots": False},
                           num_nodes=3, node_configs=nodes)
    # a deployed node keeps its owner's results next to its data
    folders = [next((tmp_path / "sites" / "fedclust-results" / f"site{i}.parquet").iterdir())
               for i in range(3)]
    assert result["metrics"]["eval_ari"] == pytest.approx(central_ari(folders, frames),
                                                          abs=1e-12)


# ------------------------------------------------------------------ what a run config records

@pytest.mark.parametrize(("cfg", "dataset"), [
    ({"method": "emdcfl"}, "rotdigits"),            # the project default, as each method reads it
    ({"method": "fedcref"}, "digits"),
    ({"method": "exact-fcm"}, "blobs"),
])
def test_the_record_names_the_dataset_the_method_ran_on(cfg, dataset):
    assert data_record(validate(cfg))["dataset"] == dataset


def test_the_record_keeps_only_the_partition_keys_that_apply():
    cfg = validate({"method": "exact-fcm", "partition.kind": "dirichlet",
                    "partition.alpha": 0.3})
    assert data_record(cfg)["partition"] == {"kind": "dirichlet", "alpha": 0.3}
    local = validate({"method": "exact-fcm", "dataset": "local"})
    assert data_record(local)["dataset"] == "local"
    assert not any(k.startswith("partition.") for k in recorded_config(local))
