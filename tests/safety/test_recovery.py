"""A recovery that fails stops the run; it never leaves a phase silently empty.

SecAgg+ is exact FCM's recovery from dropouts inside a secure round (the others' shares
reconstruct a dropped node's masks); when the round still sums nothing, fedclust runs it once
more without the nodes that failed first. When that second try fails too, or cannot be made,
the run stops with a fedclust error (``interrupted.json``, no ``summary.json``), never a
"completed" run whose round or final phase quietly summed nothing.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Error, Message, RecordDict

from client_apps.app import app as client_app
from server_app.app import run_method
from server_app.inprocess import InProcessGrid
from strategies.fcm.secure import SecureAggregationFailed

SECURE = {"method": "exact-fcm", "dataset": "iris", "num-clients": 3, "seed": 0,
          "plots": False, "fcm.n-clusters": 3, "fcm.max-rounds": 3,
          "fcm.secure-aggregation": True}
BAD, OTHER = 1000, 1001


def _stage(msg: Message) -> str | None:
    rec = msg.content.config_records.get("secaggplus_configs")
    return rec["stage"] if rec is not None and "stage" in rec else None


def _run(app, tmp_path, **extra):
    cfg = {**SECURE, **extra, "output-dir": str(tmp_path / "run")}
    return run_method(InProcessGrid(app, 3, cfg), cfg)


def _stopped(tmp_path, app) -> str:
    with pytest.raises(SecureAggregationFailed) as err:
        _run(app, tmp_path)
    assert not (tmp_path / "run" / "summary.json").exists()
    assert (tmp_path / "run" / "interrupted.json").exists()
    msg = str(err.value)
    assert "summed nothing" in msg and "Fix:" in msg, msg
    return msg


def test_a_second_try_that_fails_stops_the_run(tmp_path):
    """Round 2: node BAD fails its setup (the round halts), and in the second try without it
    node OTHER fails its setup too. Before, the round summed nothing, the centers stayed where
    they were, and the run went on to end "completed"."""
    setups = {BAD: 0}

    def app(msg: Message, context) -> Message:
        stage = _stage(msg)
        if stage == "setup" and context.node_id == BAD:
            setups[BAD] += 1
            if setups[BAD] == 2:                       # round 2 (round 1 has one setup)
                return Message(Error(code=0, reason="crashed"), reply_to=msg)
        if stage == "setup" and context.node_id == OTHER and setups[BAD] == 2 \
                and "retry" not in setups:
            setups["retry"] = 1
        if stage == "setup" and context.node_id == OTHER and setups.get("retry"):
            setups["retry"] += 1
            if setups["retry"] > 2:                    # OTHER's setup of the second try
                return Message(Error(code=0, reason="crashed"), reply_to=msg)
        return client_app(msg, context)

    msg = _stopped(tmp_path, app)
    assert "round-2" in msg and "second try" in msg and f"node {BAD}" in msg, msg


def test_stale_shares_that_break_the_workflow_stop_the_run_with_a_fedclust_error(tmp_path):
    """Node BAD answers round 2's unmask stage with its round-1 reply: Flower's workflow cannot
    combine the shares (a bare ValueError before) and no node failed first that could be left
    out of a second try."""
    kept: dict[str, RecordDict] = {}

    def app(msg: Message, context) -> Message:
        stage = _stage(msg)
        rep = client_app(msg, context)
        if context.node_id != BAD or stage != "unmask" or rep.has_error():
            return rep
        if "unmask" not in kept:
            kept["unmask"] = rep.content
            return rep
        return Message(kept["unmask"], reply_to=msg)

    msg = _stopped(tmp_path, app)
    assert "SecAgg+ workflow" in msg and "round-2" in msg, msg


def test_a_node_lost_at_setup_is_left_out_of_a_second_try_that_succeeds(tmp_path):
    """A node that fails in the setup stage of every secure round (before it shares its keys)
    left the others unable to unmask: every round summed nothing and the run stopped, blaming
    dropouts. The second try without it sums the others: the run equals one without it."""
    def app(msg: Message, context) -> Message:
        if context.node_id == BAD and _stage(msg) == "setup":
            return Message(Error(code=0, reason="crashed"), reply_to=msg)
        return client_app(msg, context)

    def without_bad(msg: Message, context) -> Message:     # in every phase but scaling
        if context.node_id == BAD and msg.metadata.message_type != "query.fcm_stats":
            return Message(Error(code=0, reason="crashed"), reply_to=msg)
        return client_app(msg, context)

    summary = _run(app, tmp_path)
    assert summary["metrics"]["dropped_nodes"] == [BAD]
    assert np.isfinite(summary["metrics"]["objective"])
    assert summary["metrics"]["rounds_with_contributions"] == summary["metrics"]["rounds"]
    centers = np.load(tmp_path / "run" / "centers.npy")
    plain = run_method(InProcessGrid(without_bad, 3, {
        **SECURE, "fcm.secure-aggregation": False, "output-dir": str(tmp_path / "plain")}),
        {**SECURE, "fcm.secure-aggregation": False, "output-dir": str(tmp_path / "plain")})
    assert plain["metrics"]["dropped_nodes"] == [BAD]
    np.testing.assert_allclose(centers, np.load(tmp_path / "plain" / "centers.npy"), atol=1e-9)
