"""FedCRef results for each data owner: every simulated client keeps ``assignments.csv``,
``models.npz``, ``predict.json`` and ``result.json`` under ``<run dir>/clients/<i>/`` (nothing of
it is sent), and ``fedclust predict`` on a client's owner folder gives its own rows back the
labels it received; on the server's run folder it gives community ids."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclust.config import validate
from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref import client as core
from fedclust.fedcref.predict import COMMUNITY_MODELS, MODELS, assign, load_models
from fedclust.predict import PredictError, predict
from server_app.inprocess import run_server

N_CLIENTS = 4
# digits, small and fast; a loose eq. (2) so that communities form, and a strict τ so that at
# the end one client is still active (refined in the last iteration) and three are not
CFG = {"method": "fedcref", "dataset": "digits", "fedcref.split": "all",
       "fedcref.assoc-rule": "eq2",
       "num-clients": N_CLIENTS, "seed": 0, "fedcref.fl-rounds": 3,
       "fedcref.fl-local-epochs": 6, "fedcref.batch-size": 16, "fedcref.ae-epochs": 20,
       "fedcref.ae-patience": 0, "fedcref.max-iterations": 3, "fedcref.k-max": 3,
       "fedcref.samples-per-cluster": 30, "fedcref.dirtiness": 0.2, "fedcref.theta": 0.5,
       "fedcref.alpha": 0.5, "fedcref.tau": 0.97, "plots": False}


def client_rows(cfg: dict, i: int) -> np.ndarray:
    """The rows simulated client ``i`` holds (the generator its handlers use)."""
    return core.client_data(validate(cfg), i)[0]


def read_assignments(folder: Path) -> np.ndarray:
    with (folder / "assignments.csv").open() as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["row", "cluster"]
    return np.array(rows[1:], dtype=np.int64).reshape(-1, 2)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("fedcref_owner")
    replies: list[set[str]] = []
    cfg = {**CFG, "output-dir": str(out)}
    summary, grid = run_server(
        cfg, num_nodes=N_CLIENTS, keep_sent=True,
        inspect=lambda m, r: replies.append(set(r.content.keys()) if r.has_content() else set()))
    hist = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    xs = [client_rows(cfg, i) for i in range(N_CLIENTS)]
    return summary, grid, out, hist, xs, replies


def test_each_client_keeps_its_assignments_models_and_result(run) -> None:
    summary, _, out, _, xs, _ = run
    for i, x in enumerate(xs):
        folder = out / "clients" / str(i)
        table = read_assignments(folder)
        assert len(table) == len(x)                       # one line per row, input order
        assert np.array_equal(table[:, 0], np.arange(len(x)))
        labels = table[:, 1]
        result = json.loads((folder / "result.json").read_text())
        assert result["method"] == "fedcref" and result["rows"] == len(x)
        assert set(result["clusters"]) == {str(q) for q in range(result["k"])}
        assert labels.min() >= 0 and labels.max() < result["k"]
        counts = np.bincount(labels, minlength=result["k"])
        for q, c in result["clusters"].items():
            assert c["rows"] == counts[int(q)]
            assert c["status"] in ("community", "isolated", "unmodelled")
            assert (c["community"] is not None) == (c["status"] == "community")
            assert c["isolated"] == (c["status"] == "isolated")
        # the labels are the final models applied to the client's rows
        params, model_labels, gate, allow = load_models(folder / MODELS)
        assert np.array_equal(assign(params, model_labels, x, 1, gate, allow), labels)
        assert sorted(m["cluster"] for m in result["models"]) == sorted(model_labels.tolist())
        assert {c["model"] for c in result["clusters"].values() if c["rows"]} \
            == set(range(len(model_labels)))
        client_summary = json.loads((folder / "predict.json").read_text())
        assert client_summary["method"] == "fedcref" and client_summary["scope"] == "client"
        assert result["iteration"] == summary["metrics"]["iterations"]


def test_predict_on_the_owner_folder_reproduces_the_labels(run, tmp_path: Path) -> None:
    _, _, out, _, xs, _ = run
    for i, x in enumerate(xs):
        folder = out / "clients" / str(i)
        labels = read_assignments(folder)[:, 1]
        threads = torch.get_num_threads()
        torch.set_num_threads(2)     # predict computes with the clients' count, then restores
        try:
            pred = predict(folder, x)
            assert torch.get_num_threads() == 2
        finally:
            torch.set_num_threads(threads)
        assert pred.header == ["row", "cluster"] and np.array_equal(pred.labels, labels)
        # the site's own file (8-bit pixels, as a node reads its data-path) through the CLI
        site = tmp_path / f"site{i}.npz"
        np.savez(site, x=np.round(x * 255).astype(np.uint8))
        from fedclust.predict import main

        assert main([str(folder), str(site), "--out", str(tmp_path / f"p{i}.csv")]) == 0
        assert (tmp_path / f"p{i}.csv").read_text() == (folder / "assignments.csv").read_text()


def test_wrong_width_is_refused(run) -> None:
    _, _, out, _, xs, _ = run
    with pytest.raises(PredictError, match="63 features"):
        predict(out / "clients" / "0", xs[0][:, :-1])
    with pytest.raises(PredictError, match="features"):
        predict(out, np.zeros((3, 10)))


def test_result_json_names_the_final_communities(run) -> None:
    summary, _, out, hist, _, _ = run
    last = hist[-1]
    assert last["communities"] >= 2
    members = np.zeros(last["communities"], dtype=np.int64)
    isolated = 0
    labels_iterations = set()
    server_params, server_ids, _, _ = load_models(out / COMMUNITY_MODELS)
    assert np.array_equal(server_ids, np.arange(last["communities"]))
    for i in range(N_CLIENTS):
        folder = out / "clients" / str(i)
        result = json.loads((folder / "result.json").read_text())
        for c in result["clusters"].values():
            if c["community"] is not None:
                members[c["community"]] += 1
            isolated += c["isolated"]
        labels_iterations.add(result["labels_iteration"])
        if result["labels_iteration"] == last["iteration"]:
            # refined in the last iteration: its community models are the server's final ones
            params, *_ = load_models(folder / MODELS)
            for j, m in enumerate(result["models"]):
                if m["source"] == "community":
                    for mine, final in zip(params, server_params, strict=True):
                        assert np.array_equal(mine[j].numpy(), final[m["community"]].numpy())
    # the same graph as the server's last iteration
    assert members.tolist() == last["sizes"] and isolated == last["isolated"]
    # both kinds of client are covered: refined in the last iteration, stable before it
    assert last["iteration"] in labels_iterations and min(labels_iterations) < last["iteration"]


def test_server_run_dir_predicts_community_ids(run) -> None:
    summary, _, out, _, xs, _ = run
    g = summary["metrics"]["communities"]
    for x in xs:
        pred = predict(out, x)
        assert len(pred.table) == len(x) and set(pred.labels.tolist()) <= set(range(g))
    # nothing row-level in the summary metrics
    n_rows = {len(x) for x in xs} | {sum(len(x) for x in xs)}
    for value in summary["metrics"].values():
        assert not (isinstance(value, list) and len(value) in n_rows)


def test_owner_results_ride_on_existing_messages(run) -> None:
    """No new message type: the run folder travels in the local, community and refinement
    messages; replies hold models, bits, counts and metrics only."""
    _, grid, out, _, _, replies = run
    types = {m.metadata.message_type for m in grid.sent if "fedcref" in m.metadata.message_type}
    assert types == {"train.fedcref_local", "query.fedcref_assoc", "train.fedcref_comm",
                     "train.fedcref_refine"}
    for m in grid.sent:
        if m.metadata.message_type in types - {"query.fedcref_assoc"}:
            assert m.content.config_records["result"]["run-dir"] == str(out)
    allowed = {"models", "clusters", "eval", "accept", "counts", "confirmed", "metrics"}
    assert replies and all(names <= allowed for names in replies)


def test_local_only_run_has_no_community_models(tmp_path: Path) -> None:
    cfg = {**CFG, "output-dir": str(tmp_path), "fedcref.association": "none",
           "fedcref.max-iterations": 1}
    summary, _ = run_server(cfg, num_nodes=N_CLIENTS)
    assert not (tmp_path / COMMUNITY_MODELS).exists()
    x = client_rows(cfg, 0)
    with pytest.raises(PredictError, match="without any community"):
        predict(tmp_path, x)
    result = json.loads((tmp_path / "clients" / "0" / "result.json").read_text())
    assert all(c["community"] is None for c in result["clusters"].values())
    assert all(m["source"] == "own" for m in result["models"])
    assert np.array_equal(predict(tmp_path / "clients" / "0", x).labels,
                          read_assignments(tmp_path / "clients" / "0")[:, 1])


@pytest.mark.parametrize("seed", range(5))
def test_refinement_labels_are_the_argmin_of_the_selected_models(seed: int) -> None:
    """Algorithm 2's greedy labels equal the argmin over the models it selected (what the
    owner's models.npz and predict rely on), here with random models and data."""
    rng = np.random.default_rng(seed)
    k, n, d = 4, 200, 12
    x = rng.random((n, d)).astype(np.float32)
    sizes = ae.layer_sizes(d, [6, 3])
    st = core.ClientState(labels=rng.integers(0, k, n), k=k,
                          models=ae.init_params(3, sizes, seed, "torch"),
                          model_clusters=np.array([0, 2, 3]))
    st.own_errors = core.own_error_matrix(st, x)
    community = ae.init_params(3, sizes, seed + 100, "torch")
    core.refine(st, x, community)
    assert len(st.used_clusters) == ae.n_models(st.used_models) <= k
    assert st.used_mismatch == 0
    assert np.array_equal(assign(st.used_models, st.used_clusters, x), st.labels)
