"""EMD-CFL: every data owner keeps its cluster's model and its test accuracy; ``fedclust
predict`` applies a cluster model from the server's run folder or from an owner's own folder.

Runs through the real ServerApp loop and ClientApp handlers on the in-process grid, on the
embedded ``rotdigits`` (no files), with a tiny CNN so that the whole module stays fast.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclust.config import validate
from fedclust.predict import PredictError, load_summary, main, predict
from server_app.inprocess import run_server

N = 4
BASE = {"method": "emdcfl", "dataset": "rotdigits", "emdcfl.rotation": "two",
        "num-clients": N, "emdcfl.samples": 150, "emdcfl.test-samples": 30,
        "emdcfl.rounds": 2, "emdcfl.local-epochs": 5, "emdcfl.batch-size": 16,
        "emdcfl.lr": 0.05, "emdcfl.conv1": 4, "emdcfl.conv2": 8, "emdcfl.embed-dim": 16,
        "emdcfl.workers": 1, "seed": 0, "plots": False}
# emdcfl itself; oracle gives 2 clusters ({-3, 3} and {177, 183}); local one per client; the
# other baselines share the final message; evaluate=false still hands every owner its model
RUNS = {"emdcfl": {}, "oracle": {"emdcfl.algorithm": "oracle"},
        "local": {"emdcfl.algorithm": "local"}, "ifca": {"emdcfl.algorithm": "ifca"},
        "cfl": {"emdcfl.algorithm": "cfl"},
        "no-eval": {"evaluate": False, "emdcfl.algorithm": "fedavg"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """name → (run dir, summary, grid, full config, replies to the final message)."""
    out = {}
    for name, extra in RUNS.items():
        cfg = {**BASE, **extra, "output-dir": str(tmp_path_factory.mktemp(name))}
        finals = []

        def inspect(ins, rep, finals=finals):
            if ins.metadata.message_type == "evaluate.emdcfl_eval":
                finals.append((ins, rep))

        summary, grid = run_server(cfg, num_nodes=N, inspect=inspect)
        out[name] = (Path(cfg["output-dir"]), summary, grid, validate(cfg), finals)
    return out


def _test_rows(grid, cfg, i):
    """Client ``i``'s test images and labels, as its handler loads them."""
    from client_apps.emdcfl_handlers import client_data

    data = client_data(grid.contexts[1000 + i], cfg)
    return data.x_test.reshape(len(data.x_test), -1).astype(np.float64), data.y_test


def _state(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=True)


@pytest.mark.parametrize("name", list(RUNS))
def test_every_client_keeps_its_cluster_model_and_result(runs, name):
    run_dir, summary, _, cfg, finals = runs[name]
    clusters = summary["metrics"]["clusters"]          # by client (node ids sorted)
    index = json.loads((run_dir / "models" / "clusters.json").read_text())
    assert sorted(map(int, index["clusters"])) == sorted(set(clusters))
    assert index["spec"] == {"in_channels": 1, "size": 8, "c1": 4, "c2": 8, "embed_dim": 16,
                             "num_classes": 10}
    if name == "oracle":
        assert len(set(clusters)) == 2
        assert summary["metrics"]["eval_acc_worst"] > 0.5     # trained: predictions mean something
    if name == "local":
        assert len(set(clusters)) == N
    for i in range(N):
        folder = run_dir / "clients" / str(i)
        result = json.loads((folder / "result.json").read_text())
        assert result["method"] == "emdcfl"
        assert result["algorithm"] == cfg["emdcfl.algorithm"]
        assert result["cluster"] == clusters[i]
        assert result["num_clusters"] == len(set(clusters))
        assert 0.0 <= result["test_accuracy"] <= 1.0 and result["num_test"] == 30
        assert 1000 + i in index["clusters"][str(clusters[i])]["clients"]
        mine = _state(folder / "model.pt")
        server = _state(run_dir / "models" / f"cluster_{clusters[i]}.pt")
        assert list(mine) == list(server) and len(mine) == 8
        assert all(torch.equal(mine[k], server[k]) for k in mine)
        owner = load_summary(folder)
        assert owner["method"] == "emdcfl" and owner["scope"] == "client"
        assert owner["cluster"] == clusters[i]
    # one final message per client, nothing else added: the replies are the usual metrics
    assert len(finals) == N
    keys = {"num-test"} | ({"test-loss", "test-acc", "cluster", "set"} if cfg["evaluate"]
                           else set())
    for ins, rep in finals:
        assert set(rep.content.metric_records["metrics"]) == keys
        assert not rep.content.array_records and not rep.content.config_records
        assert set(ins.content.config_records["result"]) == {"run-dir", "cluster",
                                                             "num-clusters"}


@pytest.mark.parametrize("name", ["emdcfl", "oracle", "local"])
def test_recorded_accuracy_is_model_pt_on_the_clients_test_rows(runs, name):
    run_dir, summary, grid, cfg, _ = runs[name]
    for i in range(N):
        x, y = _test_rows(grid, cfg, i)
        folder = run_dir / "clients" / str(i)
        result = json.loads((folder / "result.json").read_text())
        labels = predict(folder, x).labels
        assert float(np.mean(labels == y)) == result["test_accuracy"]
        assert result["test_accuracy"] == summary["metrics"]["eval_acc_per_client"][i]


@pytest.mark.parametrize("name", ["emdcfl", "oracle", "local"])
def test_predict_from_the_run_dir_equals_the_owners_folder(runs, name, tmp_path):
    run_dir, summary, grid, cfg, _ = runs[name]
    for i in range(N):
        c = summary["metrics"]["clusters"][i]
        x, _ = _test_rows(grid, cfg, i)
        server = predict(run_dir, x, cluster=c)
        owner = predict(run_dir / "clients" / str(i), x)
        assert server.header == owner.header == ["row", "label"]
        assert np.array_equal(server.table, owner.table)
        assert np.array_equal(owner.table[:, 0], np.arange(len(x)))
        assert server.meta["cluster"] == owner.meta["cluster"] == c
        # pixels in [0, 1] (an image folder) predict the same
        assert np.array_equal(predict(run_dir / "clients" / str(i), x / 255.0).table,
                              owner.table)
    if name == "oracle":      # the two clusters' models are different models
        x, _ = _test_rows(grid, cfg, 0)
        assert not np.array_equal(predict(run_dir, x, cluster=0).labels,
                                  predict(run_dir, x, cluster=1).labels)
    # the CLI on an .npz of the owner's rows writes row,label
    x, _ = _test_rows(grid, cfg, 0)
    np.savez(tmp_path / "rows.npz", x=x.reshape(-1, 8, 8))
    assert main([str(run_dir / "clients" / "0"), str(tmp_path / "rows.npz"),
                 "--out", str(tmp_path / "pred.csv")]) == 0
    lines = (tmp_path / "pred.csv").read_text().splitlines()
    assert lines[0] == "row,label" and len(lines) == len(x) + 1
    owner = predict(run_dir / "clients" / "0", x)
    assert [int(v.split(",")[1]) for v in lines[1:]] == owner.labels.tolist()


def test_wrong_width_missing_or_unknown_cluster_are_predict_errors(runs):
    run_dir, summary, grid, cfg, _ = runs["oracle"]          # two clusters
    x, _ = _test_rows(grid, cfg, 0)
    with pytest.raises(PredictError, match=r"63 features.*64"):
        predict(run_dir, x[:, :63], cluster=0)
    with pytest.raises(PredictError, match=r"63 features.*64"):
        predict(run_dir / "clients" / "0", x[:, :63])
    with pytest.raises(PredictError, match=r"2 clusters \[0, 1\].*cluster="):
        predict(run_dir, x)
    with pytest.raises(PredictError, match=r"not a cluster.*\[0, 1\]"):
        predict(run_dir, x, cluster=7)
    own = summary["metrics"]["clusters"][0]
    with pytest.raises(PredictError, match=f"own cluster {own}"):
        predict(run_dir / "clients" / "0", x, cluster=1 - own)
    with pytest.raises(PredictError, match="only the option 'cluster'"):
        predict(run_dir, x, cluster=0, colour=1)
    # a run with a single cluster needs no option
    one_dir, one, *_ = runs["no-eval"]
    assert one["metrics"]["num_clusters"] == 1
    assert np.array_equal(predict(one_dir, x).table, predict(one_dir, x, cluster=0).table)
