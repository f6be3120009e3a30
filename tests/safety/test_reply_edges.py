"""Each exact-FCM reply bound, tried just outside and just inside its edge.

A mutation study loosened the bound ΣU ≤ N to C·N and the suite passed: the hostile-node
tests only inflate values by ×10⁶ or more. Here node BAD's honest reply is moved to a
relative 1e-4 beyond each edge of what honest statistics obey (it must be excluded in that
phase, named with the field) and 1e-4 inside it (it must be accepted): loosening a bound
fails the first, tightening it the second. Minmax scaling, so the federated box in the
scaled space is [0, 1]^F and its squared diagonal D² = F.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from client_apps.app import app as client_app
from server_app.app import run_method
from server_app.inprocess import InProcessGrid

BAD = 1000
C, F, M = 3, 4, 2.0
CFG = {"method": "exact-fcm", "dataset": "iris", "num-clients": 3, "seed": 0, "plots": False,
       "fcm.n-clusters": C, "fcm.m": M, "fcm.max-rounds": 2, "fcm.epsilon": 0.0,
       "scaling": "minmax"}
DELTA = 1e-4


def _scale_sums(rd, n: int, target: float) -> None:
    u, ws = rd["sums"]["U"].numpy(), rd["sums"]["WS"].numpy()
    k = target / u.sum()
    rd["sums"]["U"] = Array(np.ascontiguousarray(u * k))
    rd["sums"]["WS"] = Array(np.ascontiguousarray(ws * k))


def _set_ws(rd, n: int, ratio: float) -> None:
    u, ws = rd["sums"]["U"].numpy(), rd["sums"]["WS"].numpy().copy()
    ws[0, 0] = u[0] * ratio            # the weighted mean of cluster 0, feature 0
    rd["sums"]["WS"] = Array(np.ascontiguousarray(ws))


def _set_u0(rd, n: int, value: float) -> None:
    """Cluster 0's weight (and sums) moved to cluster 1, the total kept: U_0 = ``value``."""
    u, ws = rd["sums"]["U"].numpy().copy(), rd["sums"]["WS"].numpy().copy()
    u[1], ws[1] = u[1] + u[0] - value, ws[1] + ws[0]
    u[0], ws[0] = value, 0.0
    rd["sums"]["U"] = Array(np.ascontiguousarray(u))
    rd["sums"]["WS"] = Array(np.ascontiguousarray(ws))


def _set_j(rd, n: int, value: float) -> None:
    rd["objective"]["J"] = Array(np.array([value]))


def _add_count(rd, n: int, extra: float) -> None:
    t = rd["eval"]["contingency"].numpy().astype(np.float64).copy()
    t[0, 0] += extra
    rd["eval"]["contingency"] = Array(np.ascontiguousarray(t))


def _set_stat(rd, n: int, row: int, value) -> None:
    st = rd["stats"]["stats"].numpy().copy()       # count, min, max, mean, M2 (per feature)
    st[row, 0] = value(st[:, 0])
    rd["stats"]["stats"] = Array(np.ascontiguousarray(st))


def _span(st):
    return st[2] - st[1]


# (name, message, field, edit(rd, N) just outside, just inside)
EDGES = [
    ("standard: mean <= max", "query.fcm_stats", "stats.stats",
     lambda rd, n: _set_stat(rd, n, 3, lambda st: st[2] + DELTA * _span(st)),
     lambda rd, n: _set_stat(rd, n, 3, lambda st: st[2] - DELTA * _span(st))),
    ("standard: M2 <= N (max-min)^2/4", "query.fcm_stats", "stats.stats",
     lambda rd, n: _set_stat(rd, n, 4, lambda st: n * _span(st) ** 2 / 4 * (1 + DELTA)),
     lambda rd, n: _set_stat(rd, n, 4, lambda st: n * _span(st) ** 2 / 4 * (1 - DELTA))),
    ("sum U <= N", "query.fcm_sums", "sums.U",
     lambda rd, n: _scale_sums(rd, n, n * (1 + DELTA)),
     lambda rd, n: _scale_sums(rd, n, n * (1 - DELTA))),
    ("sum U >= N C^(1-m)", "query.fcm_sums", "sums.U",
     lambda rd, n: _scale_sums(rd, n, n * C ** (1 - M) * (1 - DELTA)),
     lambda rd, n: _scale_sums(rd, n, n * C ** (1 - M) * (1 + DELTA))),
    ("U_c >= 0", "query.fcm_sums", "sums.U",
     lambda rd, n: _set_u0(rd, n, -DELTA), lambda rd, n: _set_u0(rd, n, 0.0)),
    ("WS_c/U_c <= high", "query.fcm_sums", "sums.WS",
     lambda rd, n: _set_ws(rd, n, 1 + DELTA), lambda rd, n: _set_ws(rd, n, 1 - DELTA)),
    ("WS_c/U_c >= low", "query.fcm_sums", "sums.WS",
     lambda rd, n: _set_ws(rd, n, -DELTA), lambda rd, n: _set_ws(rd, n, DELTA)),
    ("J <= N D^2", "query.fcm_final", "objective.J",
     lambda rd, n: _set_j(rd, n, n * F * (1 + DELTA)),
     lambda rd, n: _set_j(rd, n, n * F * (1 - DELTA))),
    ("J >= 0", "query.fcm_final", "objective.J",
     lambda rd, n: _set_j(rd, n, -DELTA), lambda rd, n: _set_j(rd, n, 0.0)),
    ("table totals N", "query.fcm_final", "eval.contingency",
     lambda rd, n: _add_count(rd, n, 1.0), lambda rd, n: _add_count(rd, n, 0.0)),
]


def _app(message_type: str, edit):
    declared: dict[str, int] = {}

    def app(msg, context):
        rep = client_app(msg, context)
        if context.node_id != BAD or rep.has_error():
            return rep
        kind = msg.metadata.message_type
        if kind == "query.fcm_stats":
            declared["n"] = int(rep.content.metric_records["metrics"]["rows"])
        if kind == message_type:
            edit(rep.content, declared["n"])
        return rep

    return app


@pytest.mark.parametrize(("name", "message_type", "field", "outside", "inside"), EDGES,
                         ids=[e[0] for e in EDGES])
def test_each_bound_holds_at_its_edge(tmp_path, name, message_type, field, outside, inside):
    phase = {"query.fcm_final": "final", "query.fcm_stats": "scaling"}.get(message_type,
                                                                           "round-")
    base = {**CFG, "scaling": "standard"} if name.startswith("standard") else CFG
    cfg = {**base, "output-dir": str(tmp_path / "out")}
    summary = run_method(InProcessGrid(_app(message_type, outside), 3, cfg), cfg)
    mine = [e for e in summary["excluded_nodes"] if e["node"] == BAD]
    assert mine and all(e["phase"].startswith(phase) for e in mine), summary["excluded_nodes"]
    assert mine[0]["reason"].startswith(f"'{field}'"), mine[0]
    cfg = {**base, "output-dir": str(tmp_path / "in")}
    summary = run_method(InProcessGrid(_app(message_type, inside), 3, cfg), cfg)
    assert summary["excluded_nodes"] == [], summary["excluded_nodes"]
