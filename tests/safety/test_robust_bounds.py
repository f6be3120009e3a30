"""Every reply value is bounded by what the other nodes' values imply, not only by a cap.

Probe: a node that widened its scaling bounds by ±1e140 passed the 1e150 cap; the honest data
were squeezed into a point and the run "converged" with ARI 0.0 and objective 7e-153. Each
node is now judged by the others (leave one out): bounds more than 1000 typical spans beyond
theirs, a row count or train size more than six orders of magnitude above their median, an
EMD-CFL model update more than three above theirs — all still inside every fixed cap — exclude
the node. A lie that cannot be told from honest data (a moderately wider box, a plausible
count) stays listed in docs/deployment.md's threat model.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array

from client_apps.app import app as client_app
from server_app.app import run_method
from server_app.inprocess import InProcessGrid
from strategies.wire.replies import above_others, beyond_others

BAD = 1000
IRIS = {"method": "exact-fcm", "dataset": "iris", "num-clients": 3, "seed": 0, "plots": False,
        "fcm.n-clusters": 3, "fcm.max-rounds": 6}
EMD = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 4, "emdcfl.rounds": 2,
       "emdcfl.local-epochs": 1, "emdcfl.samples": 40, "emdcfl.test-samples": 10,
       "emdcfl.conv1": 4, "emdcfl.conv2": 8, "emdcfl.embed-dim": 16, "emdcfl.workers": 1,
       "seed": 0, "plots": False}


def _tampered(message_type: str, change):
    def app(msg, context):
        rep = client_app(msg, context)
        if context.node_id == BAD and msg.metadata.message_type == message_type \
                and not rep.has_error():
            change(rep.content, msg.content)
        return rep
    return app


def _set(rd, record, key, fn):
    rd.array_records[record][key] = Array(np.ascontiguousarray(fn(rd.array_records[record][key]
                                                                  .numpy())))


def _run(app, cfg, n, out, **grid):
    cfg = {**cfg, "output-dir": str(out)}
    return run_method(InProcessGrid(app, n, cfg, **grid), cfg)


@pytest.mark.parametrize("scaling", ["minmax", "standard"])
def test_bounds_widened_far_inside_the_cap_exclude_their_node(tmp_path, scaling):
    def widen(rd, _):
        if scaling == "minmax":
            _set(rd, "stats", "min", lambda a: a - 1e140)
            _set(rd, "stats", "max", lambda a: a + 1e140)
        else:
            def st(a):
                a = a.copy()
                a[1] -= 1e140
                a[2] += 1e140
                return a
            _set(rd, "stats", "stats", st)

    cfg = {**IRIS, "scaling": scaling}
    summary = _run(_tampered("query.fcm_stats", widen), cfg, 3, tmp_path / "run")
    assert [(e["node"], e["phase"]) for e in summary["excluded_nodes"]] == [(BAD, "scaling")]
    assert "typical spans beyond" in summary["excluded_nodes"][0]["reason"]
    ref = _run(client_app, cfg, 3, tmp_path / "ref",
               drop=lambda nid, msg: nid == BAD and msg.metadata.message_type == "query.fcm_stats")
    assert summary["metrics"]["eval_ari"] == ref["metrics"]["eval_ari"] > 0.5


def test_a_row_count_far_above_the_others_is_refused_in_the_scaling_phase(tmp_path):
    def inflate(rd, _):
        rd.metric_records["metrics"]["rows"] = rd.metric_records["metrics"]["rows"] * 10**7

    summary = _run(_tampered("query.fcm_stats", inflate), IRIS, 3, tmp_path / "run")
    assert [(e["node"], e["phase"]) for e in summary["excluded_nodes"]] == [(BAD, "scaling")]
    assert "orders of magnitude above" in summary["excluded_nodes"][0]["reason"]


def test_an_emdcfl_model_scaled_inside_the_growth_cap_is_refused(tmp_path):
    """The per-node cap allows a model up to 1000 times the one the node was sent; scaled 500
    times, its FedAvg share swamps the others'."""
    def scale(rd, sent):
        for key in list(rd.array_records["model"]):
            _set(rd, "model", key, lambda a: a * 500)

    summary = _run(_tampered("train.emdcfl_local", scale), EMD, 4, tmp_path / "run")
    phases = {e["phase"] for e in summary["excluded_nodes"] if e["node"] == BAD}
    assert phases and all(p.startswith("train-") for p in phases), summary["excluded_nodes"]
    assert {e["node"] for e in summary["excluded_nodes"]} == {BAD}
    assert all("orders of magnitude above" in e["reason"] for e in summary["excluded_nodes"])


def test_honest_spread_is_not_refused():
    """A site with larger values, a rare binary category, an outlier row a few hundred spans
    out, sites of very different sizes: judged honest."""
    low = {1: np.array([0.0, 0, 0]), 2: np.array([0.0, 0, 0]), 3: np.array([100.0, 0, -300])}
    high = {1: np.array([1.0, 0, 1]), 2: np.array([1.0, 0, 1]), 3: np.array([101.0, 1, 1])}
    assert beyond_others(low, high, "stats") == {}
    assert above_others({1: 10.0, 2: 50_000.0, 3: 3.0, 4: 200_000.0}, "rows") == {}


def test_with_two_nodes_only_the_liar_is_refused():
    low = {1: np.array([4.3, 2.0]), 2: np.array([4.3 - 1e140, 2.0])}
    high = {1: np.array([7.9, 4.4]), 2: np.array([7.9, 4.4])}
    assert list(beyond_others(low, high, "stats")) == [2]
    assert list(above_others({1: 50.0, 2: 5e8}, "rows")) == [2]


def test_leave_one_out_statistics_are_each_nodes_loop_over_the_others():
    """``leave_one_out`` (one sort per column) gives, value for value, the median, max and min
    of the other rows that a loop over every row computes (ties and even counts included)."""
    from strategies.wire.replies import leave_one_out

    rng = np.random.default_rng(1)
    for n in (2, 3, 4, 7, 50, 51):
        a = rng.integers(0, 5, (n, 3)).astype(float) + rng.choice([0.0, 0.25], (n, 3))
        for stat in ("median", "max", "min"):
            want = np.array([getattr(np, stat)(np.delete(a, i, axis=0), axis=0)
                             for i in range(n)])
            np.testing.assert_array_equal(leave_one_out(a, stat), want)
        v = rng.normal(size=n)
        np.testing.assert_array_equal(leave_one_out(v, "median"),
                                      [np.median(np.delete(v, i)) for i in range(n)])


def test_bounds_judged_by_the_others_flag_what_the_loop_over_nodes_flags():
    """``beyond_others`` and ``dominated_features`` over many nodes, some lying: the same nodes
    and reasons as judging each node by a loop over the others."""
    from fedclust.data.scaling import ColumnStats
    from fedclust.fcm.phases import dominated_features
    from strategies.wire.replies import beyond_others

    def loop_beyond(lo, hi, factor=1e3):
        out = {}
        for i in range(len(lo)):
            o = np.arange(len(lo)) != i
            m_lo, m_hi = np.median(lo[o], axis=0), np.median(hi[o], axis=0)
            mid = (lo[o] + hi[o]) / 2
            unit = np.maximum.reduce([np.median(hi[o] - lo[o], axis=0), m_hi - m_lo,
                                      mid.max(axis=0) - mid.min(axis=0),
                                      1e-9 * np.maximum(np.abs(m_lo), np.abs(m_hi))])
            over = np.maximum((m_lo - lo[i]) / unit, (hi[i] - m_hi) / unit)
            if over.max() > factor:
                out[i] = int(np.argmax(over))
        return out

    rng = np.random.default_rng(2)
    lo = rng.normal(size=(60, 3))
    hi = lo + rng.random((60, 3)) * 3
    lo[7, 1], hi[12, 2], hi[30, 0] = -1e6, 5e5, 1e9
    got = beyond_others(dict(enumerate(lo)), dict(enumerate(hi)), "stats")
    assert sorted(got) == sorted(loop_beyond(lo, hi)) == [7, 12, 30]
    for i, j in loop_beyond(lo, hi).items():
        assert f"of feature {j} reaches" in got[i]
    stats = [ColumnStats(0, lo[i], hi[i], np.zeros(3), np.zeros(3)) for i in range(60)]
    found = dominated_features(list(range(60)), stats)
    want = []
    for i in range(60):
        o = np.arange(60) != i
        ratio = (hi.max(axis=0) - lo.min(axis=0)) / (hi[o].max(axis=0) - lo[o].min(axis=0))
        want += [(int(j), i, float(ratio[j])) for j in np.flatnonzero(ratio > 100.0)]
    assert found == want and {c for _, c, _ in found} == {7, 12, 30}
