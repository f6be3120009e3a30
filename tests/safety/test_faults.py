"""Bad replies are rejected with a logged reason and the round continues (in-process grid).

Three kinds of bad replies, each from one node of four, through the real ServerApp loop:
an error reply (what a crashed ClientApp or an unavailable node produces), a reply that never
arrives in time, and a reply of the wrong shape. The run must finish with the other clients,
``history.jsonl`` must name the node with the reason, and the reason must be logged.
A late reply from an earlier phase must never be mistaken for an answer to the current one.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Error, Message, MetricRecord, RecordDict

from client_apps.app import app as client_app
from server_app.app import run_method
from server_app.inprocess import InProcessGrid

BAD = 1002


def _faulty_app(kind: str, phase: str):
    """ClientApp wrapper: node BAD misbehaves on messages of type ``phase``."""

    def call(msg: Message, context) -> Message:
        if context.node_id == BAD and msg.metadata.message_type == phase:
            if kind == "error":
                return Message(Error(code=1, reason="simulated ClientApp crash"), reply_to=msg)
            if kind == "shape":
                rep = client_app(msg, context)
                for rec in rep.content.array_records.values():
                    for key in list(rec):
                        arr = rec[key].numpy()
                        rec[key] = Array(np.zeros(arr.shape + (2,)))
                return rep
            if kind == "nan":
                rep = client_app(msg, context)
                for rec in rep.content.array_records.values():
                    for key in list(rec):
                        rec[key] = Array(np.full(rec[key].numpy().shape, np.nan))
                return rep
        return client_app(msg, context)

    return call


class LateGrid(InProcessGrid):
    """Node BAD answers each ``phase`` message only one phase later (a late reply)."""

    def __init__(self, *args, phase: str, **kwargs):
        super().__init__(*args, **kwargs)
        self.phase = phase
        self.held: list[str] = []

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        ids = list(self.push_messages(messages))
        late = [mid for m, mid in zip(messages, ids, strict=True)
                if m.metadata.dst_node_id == BAD and m.metadata.message_type == self.phase]
        ready = [mid for mid in ids if mid not in late]
        # replies held back from the previous phase arrive now, mixed with this phase's
        out = self.pull_messages(ready + self.held)
        self.held = late
        return out


CASES = {
    ("exact-fcm", "error"): 'error reply: "simulated ClientApp crash"',
    ("exact-fcm", "shape"): "rejected reply: 'sums.U' has shape",
    ("exact-fcm", "nan"): "rejected reply: 'sums.U' has NaN values",
    ("fedfcm", "error"): 'error reply: "simulated ClientApp crash"',
    ("fedfcm", "shape"): "rejected reply: 'local.k2' has shape",
}
PHASE = {"exact-fcm": "query.fcm_sums", "fedfcm": "train.fedfcm_local"}
CFG = {"exact-fcm": {"method": "exact-fcm", "fcm.max-rounds": 3, "fcm.epsilon": 0.0},
       "fedfcm": {"method": "fedfcm", "fedfcm.k-min": 2, "fedfcm.k-max": 3,
                  "fedfcm.max-rounds": 2, "fedfcm.tol": 0.0}}


def _run(tmp_path, method, grid, **extra):
    cfg = {**CFG[method], "num-clients": 4, "seed": 1, "plots": False,
           "output-dir": str(tmp_path), **extra}
    summary = run_method(grid, cfg)
    history = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    return summary, history


@pytest.mark.parametrize(("method", "kind"), list(CASES))
def test_bad_reply_is_rejected_and_round_continues(tmp_path, fedclust_log, method, kind):
    cfg = {**CFG[method], "num-clients": 4, "seed": 1}
    grid = InProcessGrid(_faulty_app(kind, PHASE[method]), 4, cfg)
    summary, history = _run(tmp_path, method, grid)
    reason = CASES[(method, kind)]
    assert len(history) == CFG[method].get("fcm.max-rounds", CFG[method].get("fedfcm.max-rounds"))
    for h in history:
        assert str(BAD) in h["dropped_nodes"], h
        assert h["dropped_nodes"][str(BAD)].startswith(reason), h["dropped_nodes"]
        if method == "exact-fcm":
            assert h["contributed"] == 3
        else:
            assert h["replies"] == 3
    assert BAD in summary["metrics"]["dropped_nodes"]
    assert any(f"node {BAD} dropped: {reason}" in m for m in fedclust_log), fedclust_log[-5:]
    assert np.all(np.isfinite(np.load(tmp_path / "centers.npy")))


@pytest.mark.parametrize("method", ["exact-fcm", "fedfcm"])
def test_late_reply_is_dropped_and_not_reused_in_a_later_phase(tmp_path, fedclust_log, method):
    cfg = {**CFG[method], "num-clients": 4, "seed": 1}
    grid = LateGrid(client_app, 4, cfg, phase=PHASE[method])
    summary, history = _run(tmp_path / "late", method, grid)
    for h in history:
        assert h["dropped_nodes"].get(str(BAD), "").startswith("no reply within"), h
    # Reference: the same run where node BAD never answers in those phases gives the same
    # centers, i.e. the late replies were ignored, not mixed into later rounds.
    ref = InProcessGrid(client_app, 4, cfg, drop=lambda nid, m: nid == BAD and
                        m.metadata.message_type == PHASE[method])
    _run(tmp_path / "ref", method, ref)
    np.testing.assert_allclose(np.load(tmp_path / "late" / "centers.npy"),
                               np.load(tmp_path / "ref" / "centers.npy"), atol=1e-12)
    assert any(f"node {BAD} dropped: no reply" in m for m in fedclust_log)


def test_error_reply_with_superlink_sender_id_is_attributed_to_the_destination(tmp_path):
    """SuperLink-made error replies carry src_node_id 1: they must be mapped by reply_to."""

    class WrongSender(InProcessGrid):
        def pull_messages(self, message_ids):
            out = []
            for rep in super().pull_messages(message_ids):
                if rep.metadata.src_node_id == BAD:
                    err = Message(Error(code=3, reason="Node Unavailable"),
                                  reply_to=_request(self, rep))
                    err.metadata.__dict__["_src_node_id"] = 1
                    rep = err
                out.append(rep)
            return out

    cfg = {**CFG["exact-fcm"], "num-clients": 4, "seed": 1}
    grid = WrongSender(client_app, 4, cfg, keep_sent=True)
    summary, history = _run(tmp_path, "exact-fcm", grid)
    assert all(h["dropped_nodes"].get(str(BAD), "").startswith('error reply: "Node Unavailable')
               for h in history)
    assert "1" not in history[0]["dropped_nodes"]


def _request(grid: InProcessGrid, reply: Message) -> Message:
    for m in grid.sent:
        if m.metadata.message_id == reply.metadata.reply_to_message_id:
            return m
    raise AssertionError("request not found")


def test_unused_record_types_do_not_break_validation():
    """A reply with extra records is still accepted (forward compatible), not rejected."""
    from strategies.wire.fcm import Box, check_sums

    content = RecordDict({"sums": ArrayRecord({"U": Array(np.ones(2)),
                                               "WS": Array(np.full((2, 3), 0.5))}),
                          "metrics": MetricRecord({"withheld": 0}),
                          "extra": ArrayRecord({"z": Array(np.ones(1))})})
    check = check_sums(2, 3, Box(np.zeros(3), np.ones(3)), {7: 2}, 2.0, None)
    assert check(7, content) is None


def test_scaling_reply_with_another_feature_count_is_rejected(tmp_path, fedclust_log):
    """A node whose data has another number of columns (e.g. a wrong CSV in deployment)."""

    def call(msg: Message, context) -> Message:
        rep = client_app(msg, context)
        if context.node_id == BAD and msg.metadata.message_type == "query.fcm_stats":
            rec = rep.content.array_records["stats"]
            for key in list(rec):
                rec[key] = Array(np.ascontiguousarray(rec[key].numpy()[..., :-1]))
        return rep

    cfg = {**CFG["exact-fcm"], "num-clients": 4, "seed": 1, "blobs.n-features": 3}
    summary, history = _run(tmp_path, "exact-fcm", InProcessGrid(call, 4, cfg),
                            **{"blobs.n-features": 3})
    assert BAD in summary["metrics"]["dropped_nodes"]
    assert any(f"node {BAD} dropped: rejected reply: 2 features where the other clients have 3"
               in m for m in fedclust_log), fedclust_log[-3:]
    assert np.load(tmp_path / "centers.npy").shape[1] == 3


def test_check_each_rejects_a_reply_whose_check_raises():
    """Per-node checks after an exchange: a reply malformed beyond what the check expected
    (here a missing record) is rejected with the reason, never crashes the server loop."""
    from strategies.common import Exchange, check_each

    ex = Exchange(replies={1: RecordDict(), 2: RecordDict()})
    check_each(ex, lambda nid, c: c.array_records["accept"]["accept"] if nid == 1 else None, "p")
    assert list(ex.replies) == [2]
    assert ex.failed[1].startswith("rejected reply: check raised KeyError")


# --- the privacy guard withholding every client (exact FCM) ----------------------------------

GUARDED = {"method": "exact-fcm", "num-clients": 3, "seed": 0, "blobs.n-samples": 60,
           "fcm.n-clusters": 20, "fcm.max-rounds": 3, "fcm.epsilon": 0.0, "plots": False}
# 20 points per client, C = 20, F = 2: every client has N <= C(F+1)/F = 30 and withholds.


@pytest.mark.parametrize("secure", [False, True])
def test_everyone_withheld_stops_with_a_clear_error(tmp_path, secure):
    """Every client is under the guard: it stops the run in the scaling phase, before any
    round, since the guard depends only on N, C and F."""
    from server_app.inprocess import run_server

    with pytest.raises(RuntimeError) as err:
        run_server({**GUARDED, "output-dir": str(tmp_path), "fcm.secure-aggregation": secure})
    msg = str(err.value)
    assert "scaling phase" in msg and "N <= C(F+1)/F" in msg and "fcm.n-clusters" in msg
    assert "fcm.privacy-guard=false" in msg
    assert (tmp_path / "history.jsonl").read_text() == ""
    assert not (tmp_path / "centers.npy").exists()     # no result that is only the random init


@pytest.mark.parametrize("method", ["exact-fcm", "fedfcm"])
def test_guarded_clients_send_nothing_in_any_phase_and_still_get_their_results(tmp_path,
                                                                              method):
    """3 clients with 400 rows and 1 with 3 rows (3 <= C(F+1)/F = 6): the tiny client answers
    every phase with the guard's notice only — no bounds, sums, local centers, index sums,
    objective or label table — and the run uses the others. It still keeps its own results."""
    import numpy as np

    from server_app.inprocess import run_server
    from tests.data.test_practitioner import write_sites

    write_sites(tmp_path / "sites", sizes=(400, 400, 400, 3), width=2)
    replies = []
    extra = {"fedfcm.k-max": 4} if method == "fedfcm" else {"fcm.n-clusters": 4}
    summary, _ = run_server({"method": method, "dataset": "files",
                             "data-dir": str(tmp_path / "sites"), "plots": False,
                             "files.label-column": "diagnosis", **extra,
                             "output-dir": str(tmp_path / "run")},
                            inspect=lambda msg, rep: replies.append((msg, rep)))
    tiny = max(m.metadata.dst_node_id for m, _ in replies)      # node 1003 = site3.csv
    phases = set()
    for msg, rep in replies:
        if msg.metadata.dst_node_id == tiny and msg.metadata.message_type != "query.fedclust_node":
            phases.add(msg.metadata.message_type)
            assert not rep.has_error()
            assert list(rep.content.array_records) == [], msg.metadata.message_type
            assert dict(rep.content.metric_records["metrics"]) == {"withheld": 1}
    expected = ({"query.fcm_stats", "query.fcm_sums", "query.fcm_final"} if method == "exact-fcm"
                else {"query.fcm_stats", "train.fedfcm_local", "query.fedfcm_db",
                      "query.fcm_final"})
    assert phases == expected
    assert summary["metrics"]["scaling_withheld_clients"] == 1
    table = np.loadtxt(tmp_path / "run" / "clients" / "3" / "assignments.csv", delimiter=",",
                       skiprows=1, ndmin=2)
    assert table.shape[0] == 3


def test_rounds_with_contributions_is_recorded(tmp_path):
    from server_app.inprocess import run_server

    summary, _ = run_server({**GUARDED, "fcm.n-clusters": 3, "output-dir": str(tmp_path)})
    assert summary["metrics"]["rounds_with_contributions"] == 3


def test_sums_checked_all_at_once_pass_only_what_each_check_passes():
    """``sums_passing`` (a round's replies judged at once) takes a reply only where the
    per-reply ``check_sums`` finds nothing; every other reply meets that check itself."""
    from strategies.wire.fcm import Box, check_sums, sums_passing, sums_reply

    rng = np.random.default_rng(0)
    c, f, m = 3, 2, 2.0
    box = Box(np.zeros(f), np.ones(f))
    rows, replies = {}, {}
    for nid in range(200):
        n = int(rng.integers(1, 50))
        x = rng.random((n, f))
        u = rng.random((n, c))
        u /= u.sum(axis=1, keepdims=True)
        um = u ** m
        U, WS = um.sum(axis=0), um.T @ x
        kind = nid % 10
        if kind == 1:
            U = U.copy()
            U[0] = -1e-3                       # negative mass
        elif kind == 2:
            WS = WS.copy()
            WS[1, 0] = U[1] * 1.5              # a weighted mean outside the box
        elif kind == 3:
            WS = WS.copy()
            WS[0, 1] = np.nan
        elif kind == 4:
            U = U * 10 * n                     # more mass than N rows can hold
        elif kind == 5:
            U, WS = U[:2], WS[:2]              # another shape
        elif kind == 6:
            U = U.astype(np.float32)           # another dtype: the per-reply check decides
        rd = sums_reply(U, WS)
        if kind == 7:
            rd["metrics"] = MetricRecord({"withheld": 1})
        if kind != 8:                          # 8: declared no row count
            rows[nid] = n
        replies[nid] = rd
    check = check_sums(c, f, box, rows, m, None)
    passed = sums_passing(replies, c, f, box, rows, m)
    verdicts = {nid: check(nid, rd) for nid, rd in replies.items()}
    assert set(passed) <= {nid for nid, v in verdicts.items() if v is None}
    assert set(passed) == {nid for nid in replies if nid % 10 in (0, 9)}
    assert all(verdicts[nid] for nid in replies if nid % 10 in (1, 2, 3, 4, 5, 7, 8))
    for nid, (u, ws) in passed.items():
        np.testing.assert_array_equal(u, replies[nid]["sums"]["U"].numpy())
        np.testing.assert_array_equal(ws, replies[nid]["sums"]["WS"].numpy())
