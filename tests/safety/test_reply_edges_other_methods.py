"""Reply bounds of FedFCM, EMD-CFL and FedCRef, tried just outside and at (or just inside)
their edge, as tests/test_reply_edges.py does for exact FCM.

The hostile-node tests corrupt a field by NaN, infinities, ×10⁶, a sign, a shape or an empty
array: a bound loosened by one row, by a factor 2 or by dropping its lower side lets all of
them through. Here node BAD's honest reply is moved just beyond one edge (it must be excluded
in that phase, named with the field) and, where the honest reply does not already sit on the
edge, just inside it (it must be accepted).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array

from client_apps.app import app as client_app
from server_app.app import run_method
from server_app.inprocess import InProcessGrid
from tests.fedcref.test_fedcref_e2e import FAST, planted

BAD = 1000
FEDFCM = {"method": "fedfcm", "dataset": "iris", "num-clients": 3, "seed": 0, "plots": False,
          "fedfcm.k-min": 2, "fedfcm.k-max": 2, "fedfcm.max-rounds": 2,
          "fedfcm.averaging": "fedavg"}
# 20 train samples per client, at most 16 projected ones per cloud: a node's honest clouds hold
# exactly emdcfl.max-samples rows, on the edge
MAX_SAMPLES = 16
EMDCFL = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 4, "seed": 3,
          "plots": False, "emdcfl.samples": 20, "emdcfl.test-samples": 10, "emdcfl.rounds": 2,
          "emdcfl.local-epochs": 1, "emdcfl.conv1": 4, "emdcfl.conv2": 4,
          "emdcfl.embed-dim": 8, "emdcfl.max-samples": MAX_SAMPLES, "emdcfl.workers": 1}


def _app(message_type: str, edit, calls: list[int] | None = None):
    """The real ClientApp; node BAD's replies of ``message_type`` pass through ``edit(content,
    i)`` (``i``: how many such replies it sent before)."""
    seen = [0]

    def app(msg, context):
        rep = client_app(msg, context)
        if (context.node_id == BAD and not rep.has_error()
                and msg.metadata.message_type == message_type):
            edit(rep.content, seen[0])
            seen[0] += 1
            if calls is not None:
                calls.append(seen[0])
        return rep

    return app


def _run(cfg: dict, out: Path, app, n: int) -> dict:
    cfg = {**cfg, "output-dir": str(out)}
    return run_method(InProcessGrid(app, n, cfg), cfg)


def _excluded(summary: dict, phase: str, field: str) -> None:
    mine = [e for e in summary["excluded_nodes"] if e["node"] == BAD]
    assert mine and mine[0]["phase"].startswith(phase), summary["excluded_nodes"]
    assert mine[0]["reason"].startswith(f"'{field}"), mine[0]


# ---------------------------------------------------------------- FedFCM: Σ support = N


def _scale_support(factor: float):
    def edit(rd, i):
        for key in list(rd["local"]):
            if key.endswith(".support"):
                s = rd["local"][key].numpy()
                rd["local"][key] = Array(np.ascontiguousarray(s * factor))
    return edit


@pytest.mark.parametrize("factor", [1 - 1e-4, 1 + 1e-4])
def test_fedfcm_support_must_sum_to_the_rows_on_both_sides(tmp_path, factor):
    """The memberships of N rows sum to N: a support total 1e-4 below or above is excluded
    (a bound that kept only one side, or only Σ ≥ 0, lets the other through)."""
    summary = _run(FEDFCM, tmp_path / "out", _app("train.fedfcm_local", _scale_support(factor)),
                   3)
    _excluded(summary, "round-", "local.k2.support")


def test_fedfcm_support_within_rounding_is_accepted(tmp_path):
    summary = _run(FEDFCM, tmp_path / "out",
                   _app("train.fedfcm_local", _scale_support(1 - 1e-9)), 3)
    assert summary["excluded_nodes"] == []


# ----------------------------------------------------- EMD-CFL: projected clouds, num-examples


def _add_row(rd, i):
    for record in ("src", "tgt"):
        for key in list(rd[record]):
            a = rd[record][key].numpy()
            rd[record][key] = Array(np.ascontiguousarray(np.vstack([a, a[-1:]])))


def test_emdcfl_a_cloud_one_row_over_max_samples_is_excluded(tmp_path):
    calls: list[int] = []
    summary = _run(EMDCFL, tmp_path / "out", _app("query.emdcfl_embed", _add_row, calls), 4)
    assert calls, "node BAD sent no embedding reply"
    _excluded(summary, "embed", "src.")
    # the honest clouds sit on the edge (exactly max-samples rows) and are accepted
    honest = _run(EMDCFL, tmp_path / "honest", _app("query.emdcfl_embed", _check_full), 4)
    assert honest["excluded_nodes"] == []


def _check_full(rd, i):
    assert {rd["src"][k].numpy().shape[0] for k in rd["src"]} == {MAX_SAMPLES}


@pytest.mark.parametrize("change", [1, -1])
def test_emdcfl_num_examples_may_not_change_after_the_first_round(tmp_path, change):
    """A node's train split is fixed: ``num-examples`` one above (or below) what it declared
    in round 1 is excluded in round 2 (its weight in FedAvg would grow)."""

    def edit(rd, i):
        if i == 1:
            met = rd.metric_records["metrics"]
            met["num-examples"] = int(met["num-examples"]) + change

    summary = _run(EMDCFL, tmp_path / "out", _app("train.emdcfl_local", edit), 4)
    mine = [e for e in summary["excluded_nodes"] if e["node"] == BAD]
    assert mine and "num-examples" in mine[0]["reason"], summary["excluded_nodes"]
    assert "declared" in mine[0]["reason"], mine[0]


# ----------------------------------------------------------- FedCRef: evaluation counts ≤ rows


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return planted(tmp_path_factory.mktemp("planted"))


def test_fedcref_evaluation_counts_one_row_over_the_nodes_are_excluded(root, tmp_path):
    cfg = {"method": "fedcref", "dataset": "mnist", "data-dir": str(root), "num-clients": 5,
           "seed": 1, "fedcref.dirtiness": 0.2, **FAST, "fedcref.max-iterations": 1,
           "fedcref.fl-rounds": 2}
    totals: list[tuple[int, int]] = []

    def edit(rd, i):
        if "eval" not in rd.array_records:
            return
        h = rd["eval"]["hist"].numpy().copy()
        totals.append((int(h.sum()), int(rd.metric_records["metrics"]["n"])))
        h[0, 0] += 1
        rd["eval"]["hist"] = Array(np.ascontiguousarray(h))

    summary = _run(cfg, tmp_path / "out", _app("train.fedcref_local", edit), 5)
    # the honest histogram counts every row: one more is one more than the node holds
    assert totals and all(t == n for t, n in totals), totals
    _excluded(summary, "local-", "eval.hist")
