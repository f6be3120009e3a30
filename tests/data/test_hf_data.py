"""Hugging Face ``datasets`` and flwr-datasets partitioners, offline: a local dataset written
by ``save_to_disk`` runs exact FCM through the run config (``dataset="hf"``, in-process and on
Flower's Simulation Engine) and through ``fedclust.simulate(dataset=…, partitioner=…)``; the
partitions are flwr-datasets' own; image columns feed FedCRef and EMD-CFL through simulate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

import fedclust
from fedclust.config import ConfigError
from fedclust.data.hf import arrays_from_hf, open_hf
from fedclust.data.partition import PartitionError, make_partition
from fedclust.data.tabular import Dataset, DatasetError, load_dataset

datasets = pytest.importorskip("datasets", reason="pip install 'fedclust[hf]'")
fp = pytest.importorskip("flwr_datasets.partitioner", reason="pip install 'fedclust[hf]'")
ROOT = Path(__file__).resolve().parents[2]
SPECIES = ["setosa", "versicolor", "virginica", "other"]


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    """A DatasetDict on disk: 2 numeric features, a text label, a text column."""
    rng = np.random.default_rng(0)
    centers = np.array([[0.0, 0.0], [6.0, 0.0], [0.0, 6.0], [6.0, 6.0]])
    folder = tmp_path_factory.mktemp("hf") / "blobs"
    splits = {}
    for name, n in (("train", 800), ("test", 100)):
        y = rng.integers(0, 4, n)
        x = centers[y] + rng.normal(0, 0.6, (n, 2))
        splits[name] = datasets.Dataset.from_dict({
            "length": x[:, 0], "width": x[:, 1], "species": [SPECIES[i] for i in y],
            "site": ["north"] * n})
    datasets.DatasetDict(splits).save_to_disk(str(folder))
    return folder


def hf_config(saved: Path, **extra) -> dict:
    return {"method": "exact-fcm", "dataset": "hf", "hf.path": str(saved),
            "hf.label-column": "species", "fcm.n-clusters": 4, "fcm.epsilon": 1e-6,
            "fcm.max-rounds": 100, "plots": False, **extra}


def flwr_dirichlet(saved: Path, clients: int, alpha: float, seed: int) -> list[int]:
    """Row counts of flwr-datasets' own DirichletPartitioner on the label column."""
    part = fp.DirichletPartitioner(clients, "species", alpha, min_partition_size=2, seed=seed)
    part.dataset = datasets.load_from_disk(str(saved))["train"]
    return [part.load_partition(i).num_rows for i in range(clients)]


def test_the_hf_loader_reads_a_saved_dataset_by_its_columns(saved):
    ds = load_dataset({"dataset": "hf", "hf.path": str(saved), "hf.split": "test",
                       "hf.label-column": "species"})
    raw = datasets.load_from_disk(str(saved))["test"]
    np.testing.assert_array_equal(ds.x, np.column_stack([raw["length"], raw["width"]]))
    assert ds.feature_names == ["length", "width"]      # the text column is not a feature
    np.testing.assert_array_equal(ds.y, np.unique(raw["species"], return_inverse=True)[1])


def test_exact_fcm_on_a_dirichlet_partition_of_a_saved_dataset_in_process(saved, tmp_path):
    from server_app.inprocess import run_server

    summary, _ = run_server({**hf_config(saved), "partition.kind": "dirichlet",
                             "partition.alpha": 0.3, "num-clients": 4, "seed": 5,
                             "output-dir": str(tmp_path / "run")})
    rows = [len((tmp_path / "run" / "clients" / str(i) / "assignments.csv").read_text()
                .splitlines()) - 1 for i in range(4)]
    assert rows == flwr_dirichlet(saved, 4, 0.3, 5)      # flwr-datasets made the partition
    assert sum(rows) == 800 and len(set(rows)) > 1
    assert summary["metrics"]["eval_coverage"]["rows"] == 800


@pytest.mark.slow
@pytest.mark.exclusive("ray")
def test_exact_fcm_on_a_saved_dataset_on_flowers_simulation_engine(saved, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "fedclust.cli", "sweep", "engine=flwr", "dataset=hf",
         "partition=dirichlet", "app.partition.alpha=0.3", f"app.hf.path={saved}",
         "app.hf.label-column=species", "app.num-clients=3", "app.seed=2",
         "app.fcm.n-clusters=4", "app.plots=false", f"hydra.run.dir={tmp_path / 'run'}"],
        capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["dataset"] == "hf" and summary["num_clients"] == 3
    rows = [len((tmp_path / "run" / "clients" / str(i) / "assignments.csv").read_text()
                .splitlines()) - 1 for i in range(3)]
    assert rows == flwr_dirichlet(saved, 3, 0.3, 2)
    assert summary["metrics"]["eval_ari"] > 0.5


def test_simulate_with_a_flwr_datasets_partitioner(saved, tmp_path):
    ds = datasets.load_from_disk(str(saved))["train"]
    part = fp.DirichletPartitioner(4, "species", 0.5, min_partition_size=5, seed=1)
    res = fedclust.simulate("exact-fcm", dataset=ds, partitioner=part, label_column="species",
                            n_clusters=4, output_dir=tmp_path / "sim", run_config={"plots": False})
    assert res.feature_names == ["length", "width"]
    pieces = [part.load_partition(i) for i in range(4)]
    assert [len(lab) for lab in res.labels] == [p.num_rows for p in pieces]
    # the same rows as arrays give the same run
    xs = [np.column_stack([p["length"], p["width"]]) for p in pieces]
    arrays = fedclust.simulate("exact-fcm", xs, n_clusters=4, output_dir=tmp_path / "np",
                               run_config={"plots": False})
    np.testing.assert_array_equal(res.centers, arrays.centers)
    truth = np.concatenate([np.asarray(p["species"]) for p in pieces])
    ari = adjusted_rand_score(truth, np.concatenate(res.labels))
    assert res.metrics["eval_ari"] == pytest.approx(ari, abs=1e-12)


def test_the_flwr_datasets_kinds_split_by_the_label(saved):
    y = np.repeat(np.arange(4), 50)
    ds = Dataset("toy", np.zeros((200, 1)), y)
    patho = make_partition("pathological", ds, 4, 0,
                           options={"partition.classes-per-client": 2})
    assert all(np.unique(y[p]).size <= 2 for p in patho)
    with pytest.raises(PartitionError, match=r"'partition.classes-per-client' = 5 is more than "
                                             r"the 4 classes"):
        make_partition("pathological", ds, 4, 0, options={"partition.classes-per-client": 5})
    shard = make_partition("shard", ds, 4, 0, options={"partition.shards-per-client": 2})
    assert sorted(np.concatenate(shard).tolist()) == list(range(200))
    size = make_partition("size", ds, 3, 0, options={"partition.sizes": "10,20,70"})
    assert [p.size for p in size] == [10, 20, 70]
    linear = make_partition("linear", ds, 4, 0)
    assert [p.size for p in linear] == [20, 40, 60, 80]
    with pytest.raises(PartitionError, match="one size per client"):
        make_partition("size", ds, 4, 0, options={"partition.sizes": "10,20"})
    # built-in datasets keep fedclust's own iid and dirichlet (the papers' numbers rest on them)
    from fedclust.data import partition

    assert [p.size for p in make_partition("iid", ds, 4, 0)] == [
        p.size for p in partition.iid(200, 4, 0)]


@pytest.mark.parametrize("cfg, message", [
    ({"hf.label-column": "kind"}, "'kind', which is not a column. Allowed: length, width"),
    ({"hf.feature-columns": "length,site"}, r"feature column\(s\) \['site'\] are not numeric"),
    ({"hf.split": "validation"}, "'validation' is not a split .* Allowed: test, train"),
    ({"hf.label-column": "", "evaluate": True}, "needs the ground truth"),
    ({"hf.path": "no-such-user/no-such-dataset"}, "no local folder, and the Hugging Face Hub"),
])
def test_bad_hf_settings_are_refused_in_one_line_before_any_work(saved, cfg, message,
                                                                 monkeypatch):
    from strategies.run import check_run_config

    # the Hub is out of reach here: answer at once instead of waiting on the network
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    with pytest.raises((DatasetError, ConfigError), match=message) as err:
        check_run_config({**hf_config(saved), "num-clients": 3, **cfg})
    assert "\n" not in str(err.value)


@pytest.fixture(scope="module")
def digit_images(tmp_path_factory):
    """8×8 digits as an Image column (PIL), saved and read back."""
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    idx = np.random.default_rng(0).permutation(len(digits.target))[:600]
    images = [Image.fromarray((digits.images[i] * 15).astype(np.uint8)) for i in idx]
    ds = datasets.Dataset.from_dict({"image": images, "label": digits.target[idx].tolist()},
                                    features=datasets.Features({
                                        "image": datasets.Image(),
                                        "label": datasets.ClassLabel(num_classes=10)}))
    folder = tmp_path_factory.mktemp("img") / "digits"
    ds.save_to_disk(str(folder))
    return open_hf(str(folder)), digits.images[idx] * 15, digits.target[idx]


def test_an_image_column_gives_its_pixels(digit_images):
    ds, pixels, labels = digit_images
    x, y, _ = arrays_from_hf(ds, "label", image_column="image")
    np.testing.assert_array_equal(x, pixels.reshape(len(pixels), -1))
    np.testing.assert_array_equal(y, labels)


@pytest.mark.slow
def test_image_columns_feed_fedcref_and_emdcfl_through_simulate(digit_images, tmp_path):
    ds, _, labels = digit_images
    res = fedclust.simulate(
        "fedcref", dataset=ds, partitioner=fp.IidPartitioner(3), image_column="image",
        label_column="label", output_dir=tmp_path / "fedcref", max_iterations=1, fl_rounds=1,
        ae_epochs=2, ae_patience=0, batch_size=16, fl_local_epochs=1, k_estimate_max=3,
        run_config={"plots": False})
    assert res.metrics["iterations"] == 1 and res.metrics["eval_nodes"] == 3
    assert sum(len(lab) for lab in res.labels) == 600
    res = fedclust.simulate(
        "emdcfl", dataset=ds, partitioner=fp.IidPartitioner(4), image_column="image",
        label_column="label", output_dir=tmp_path / "emdcfl", rounds=2, local_epochs=1,
        conv1=4, conv2=8, embed_dim=16, workers=1, run_config={"plots": False})
    assert 1 <= res.metrics["num_clusters"] <= 4
    assert all((res.run_dir / "clients" / str(i) / "model.pt").is_file() for i in range(4))
