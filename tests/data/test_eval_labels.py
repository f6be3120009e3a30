"""The evaluation path on the nodes' own files: text labels mean the same on every node, and
label statistics leave a deployed node only with its permission.

Sites hold different label sets ("flu" only on one site, "sick" missing on another): the
federated ``eval_ari`` must equal the ARI of all rows' true labels against the cluster labels
each site received — per-node label numbering would add unrelated labels row by row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from tests.fake_grid import run_server

SITES = {   # site -> (rows per label), three well separated groups in 2-D
    "a.csv": {"healthy": 30, "sick": 25},
    "b.csv": {"flu": 20, "healthy": 35},
    "c.csv": {"sick": 30, "flu": 15},
}
CENTRES = {"healthy": (0.0, 0.0), "sick": (6.0, 0.0), "flu": (0.0, 6.0)}


def write_sites(folder: Path, seed: int = 0) -> dict[str, list[str]]:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    labels = {}
    for name, counts in SITES.items():
        rows, labs = [], []
        for lab, n in counts.items():
            rows.append(rng.normal(CENTRES[lab], 1.2, (n, 2)))
            labs += [lab] * n
        x = np.vstack(rows)
        text = ["x0,x1,diagnosis"] + [f"{a:.6f},{b:.6f},{lab}" for (a, b), lab in zip(x, labs)]
        (folder / name).write_text("\n".join(text) + "\n")
        labels[name] = labs
    return labels


def central_ari(out: Path, labels: dict[str, list[str]]) -> float:
    truth, pred = [], []
    for i, name in enumerate(sorted(labels)):
        table = np.loadtxt(out / "clients" / str(i) / "assignments.csv", delimiter=",",
                           skiprows=1)
        truth += labels[name]
        pred += table[:, 1].astype(int).tolist()
    return adjusted_rand_score(truth, pred)


@pytest.mark.parametrize(("method", "extra", "key"), [
    ("exact-fcm", {"fcm.n-clusters": 3}, "eval_ari"),
    ("exact-fcm", {"fcm.n-clusters": 3, "fcm.secure-aggregation": True, "fcm.max-rounds": 4},
     "eval_ari"),
    ("fedfcm", {"fedfcm.k-max": 3, "fedfcm.max-rounds": 4}, "eval_ari_best_k"),
], ids=["exact", "secure", "fedfcm"])
def test_text_labels_add_up_by_name_across_sites(tmp_path, method, extra, key):
    labels = write_sites(tmp_path / "sites")
    out = tmp_path / "run"
    summary, _ = run_server({"method": method, "dataset": "files",
                             "data-dir": str(tmp_path / "sites"),
                             "files.label-column": "diagnosis", "plots": False, "seed": 1,
                             "output-dir": str(out), **extra})
    expected = central_ari(out, labels)
    got = summary["metrics"][key]
    assert expected < 0.999        # the sites' clusters are not perfect: a wrong table shows
    assert got == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("allow", [None, False, True])
def test_a_deployed_node_sends_label_statistics_only_with_its_permission(tmp_path, allow):
    labels = write_sites(tmp_path / "sites")
    out = tmp_path / "run"
    extra = {} if allow is None else {"allow-evaluation": allow}
    nodes = [{"data-path": str(tmp_path / "sites" / name), "label-column": "diagnosis", **extra}
             for name in sorted(labels)]
    replies = []

    def keep(msg, rep):
        if msg.metadata.message_type == "query.fcm_final":
            replies.append(rep)

    summary, _ = run_server({"method": "exact-fcm", "dataset": "local", "fcm.n-clusters": 3,
                             "plots": False, "seed": 1, "output-dir": str(out)},
                            num_nodes=len(nodes), node_configs=nodes, inspect=keep)
    assert len(replies) == len(nodes)
    sent_eval = [r for r in replies if "eval" in r.content.array_records]
    if allow:
        assert len(sent_eval) == len(nodes)
        assert summary["metrics"]["eval_ari"] > 0.5
    else:
        assert sent_eval == []
        ari = summary["metrics"]["eval_ari"]
        assert ari is None or np.isnan(ari)     # NaN is written as null
