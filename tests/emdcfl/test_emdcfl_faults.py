"""EMD-CFL: bad replies, empty phases, missing data, partial participation, config rules.

A malformed reply in the train or the embedding phase, from one node of four, through the real
ServerApp loop and the in-process grid: it is rejected with a logged reason, the node is named
in ``history.jsonl`` ``dropped_nodes`` and the run finishes with the other clients.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Error, Message, MetricRecord, RecordDict

from client_apps.app import app as client_app
from fedclust.config import ConfigError, validate
from server_app.app import run_method
from server_app.inprocess import InProcessGrid
from tests.emdcfl.test_emdcfl_server import TINY, planted_nodes

BAD = 1002          # planted group 1 (with 1003)


def _malformed(phase: str, mutate):
    """ClientApp wrapper: node BAD's replies to ``phase`` messages are passed through ``mutate``."""

    def call(msg: Message, context) -> Message:
        rep = client_app(msg, context)
        if context.node_id == BAD and msg.metadata.message_type == phase:
            mutate(rep.content)
        return rep

    return call


def _widen_one_array(content: RecordDict) -> None:
    """The first array of every ArrayRecord gets an extra axis (a wrong-shape reply)."""
    for rec in content.array_records.values():
        key = next(iter(rec))
        rec[key] = Array(np.zeros(rec[key].numpy().shape + (2,), np.float32))


def _run(tmp_path, app, cfg_extra=None):
    cfg = {**TINY, "emdcfl.local-epochs": 2, "plots": False,
           "output-dir": str(tmp_path / "run"), **(cfg_extra or {})}
    grid = InProcessGrid(app, 4, cfg, node_configs=planted_nodes(tmp_path))
    summary = run_method(grid, cfg)
    history = [json.loads(x)
               for x in (tmp_path / "run" / "history.jsonl").read_text().splitlines()]
    return summary, history


@pytest.mark.parametrize(("phase", "reason"), [
    ("train.emdcfl_local", "train: rejected reply: 'model.0' has shape"),
    ("query.emdcfl_embed", "embed: rejected reply: 'src."),
])
def test_malformed_reply_is_rejected_and_the_run_finishes(tmp_path, fedclust_log, phase, reason):
    summary, history = _run(tmp_path, _malformed(phase, _widen_one_array))
    drops = history[0]["dropped_nodes"]
    assert list(drops) == [str(BAD)] and drops[str(BAD)].startswith(reason), drops
    assert any(f"node {BAD} dropped: {reason.split(': ', 1)[1]}" in m for m in fedclust_log)
    m = summary["metrics"]
    assert m["dropped_nodes"] == [BAD]
    assert len(history) == TINY["emdcfl.rounds"] and np.isfinite(m["eval_acc_mean"])
    clusters = dict(zip([1000, 1001, 1002, 1003], m["clusters"], strict=True))
    assert clusters[1000] == clusters[1001] != clusters[1003]      # the others still cluster
    assert clusters[BAD] not in (clusters[1000], clusters[1003])   # dropped: a singleton


def test_bad_metric_value_in_train_reply_is_rejected(tmp_path):
    def nan_loss(content: RecordDict) -> None:
        content.metric_records["metrics"]["train-loss"] = float("nan")

    _, history = _run(tmp_path, _malformed("train.emdcfl_local", nan_loss))
    assert history[0]["dropped_nodes"][str(BAD)].startswith(
        "train: rejected reply: 'metrics.train-loss' = nan is not finite")


def test_a_phase_without_any_client_stops_with_the_phase_and_every_reason(tmp_path):
    def crash(msg: Message, context) -> Message:
        if msg.metadata.message_type == "query.emdcfl_embed":
            return Message(Error(code=1, reason="simulated crash"), reply_to=msg)
        return client_app(msg, context)

    with pytest.raises(RuntimeError, match=r"phase 'embed-0': no client left") as err:
        _run(tmp_path, crash)
    assert all(f'node {n}: error reply: "simulated crash"' in str(err.value)
               for n in (1000, 1001, 1002, 1003))


def test_missing_data_files_fail_before_any_message(tmp_path):
    sent: list[Message] = []
    cfg = {"method": "emdcfl", "dataset": "rotmnist", "num-clients": 4,
           "data-dir": str(tmp_path / "nowhere"), "output-dir": str(tmp_path / "out")}
    grid = InProcessGrid(client_app, 4, cfg, inspect=lambda m, r: sent.append(m))
    with pytest.raises(Exception, match=r"mnist-train\.npz .*not found under data-dir"):
        run_method(grid, cfg)
    assert sent == []


def test_late_joiner_lands_in_its_true_group(tmp_path):
    """Partial participation: node 1002 first takes part in round 1 (seed 1, 3 of 4 per round)
    and is clustered with 1003, its planted group; 1000 and 1001 stay together."""
    summary, history = _run(tmp_path, client_app,
                            {"seed": 1, "emdcfl.clients-per-round": 3, "emdcfl.rounds": 2})
    assert [h["participants"] for h in history] == [3, 3]
    assert history[0]["reclustered"] and history[1].get("reclustered")
    assert len(set(history[0]["clusters"])) == 3          # 1002 unseen: a singleton
    m = summary["metrics"]
    assert m["clusters"][2] == m["clusters"][3] != m["clusters"][0] == m["clusters"][1]
    assert m["eval_ari"] == 1.0


# ----------------------------------------------------------------------------------------------
# reply checks (unit level)

def _train_content(shapes, *, dtype=np.float32, loss=0.5, n=10, pub=32):
    rec = ArrayRecord({str(i): Array(np.zeros(s, dtype)) for i, s in enumerate(shapes)})
    return RecordDict({"model": rec,
                       "pub": ArrayRecord({"key": Array(np.zeros(pub, np.uint8))}),
                       "metrics": MetricRecord({"num-examples": n, "train-loss": loss})})


def test_train_reply_check_covers_shapes_dtypes_metrics_and_the_public_key():
    from strategies.wire.emdcfl import check_train as train_reply

    shapes = [(2, 3), (3,)]
    check = train_reply(shapes, keygen=True)
    assert check(_train_content(shapes)) is None
    assert "shape" in check(_train_content([(2, 4), (3,)]))
    assert "arrays" in check(_train_content([(2, 3)]))
    assert "dtype float64" in check(_train_content(shapes, dtype=np.float64))
    assert "num-examples" in check(_train_content(shapes, n=0))
    assert "train-loss" in check(_train_content(shapes, loss=float("inf")))
    assert "pub.key" in check(_train_content(shapes, pub=31))
    assert train_reply(shapes, keygen=False)(_train_content(shapes, pub=31)) is None


def test_embed_reply_check_covers_peers_projection_width_and_sample_cap():
    from strategies.wire.emdcfl import check_embed as embed_reply

    def content(peers, width=5, rows=4, ref=0.1, records=("src", "tgt")):
        arrs = {str(p): Array(np.ones((rows, width), np.float32)) for p in peers}
        rd = RecordDict({r: ArrayRecord(dict(arrs)) for r in records})
        rd["reference"] = MetricRecord({str(p): ref for p in peers})
        return rd

    check = embed_reply([1, 2, 3], proj_dim=5, max_samples=8)
    assert check(content([2, 3])) is None
    # no own-model validation cloud ('ref', the former channel) and no other array record
    assert "expected exactly ['src', 'tgt']" in check(content([2, 3],
                                                              records=("src", "ref", "tgt")))
    assert "not a finite distance" in check(content([2, 3], ref=float("nan")))
    assert "not a finite distance" in check(content([2, 3], ref=-0.5))
    missing = content([2, 3])
    del missing["reference"]
    assert "missing metric record 'reference'" in check(missing)
    assert "every member but the sender" in check(content([2]))
    assert "every member but the sender" in check(content([2, 9]))
    assert "expected (1…8, 5)" in check(content([2, 3], width=4))
    assert "expected (1…8, 5)" in check(content([2, 3], rows=9))
    batched = embed_reply([1, 2, 3], proj_dim=5, max_samples=8, all_but_sender=False)
    assert batched(content([2])) is None                 # a batch: the exact set is checked
    assert "some of the members" in batched(content([2, 9]))    # by the caller (_peer_problem)
    assert "some of the members" in batched(content([]))


# ----------------------------------------------------------------------------------------------
# config rules

@pytest.mark.parametrize("override, key", [
    ({"emdcfl.algorithm": "fedavg", "emdcfl.clients-per-round": 2},
     "emdcfl.clients-per-round"),
    ({"emdcfl.algorithm": "ifca", "evaluate": False}, "emdcfl.num-clusters"),
])
def test_baseline_rules_fail_before_any_work(override, key):
    with pytest.raises(ConfigError) as err:
        validate({**TINY, **override})
    assert f"'{key}'" in str(err.value) and "Fix" in str(err.value)


def test_baselines_accept_full_participation_and_ifca_with_an_explicit_k():
    validate({**TINY, "emdcfl.algorithm": "cfl", "emdcfl.clients-per-round": 4})
    validate({**TINY, "emdcfl.algorithm": "ifca", "evaluate": False, "emdcfl.num-clusters": 2})


def test_uneven_groups_are_a_warning_with_the_fix():
    from fedclust.emdcfl.keys import uneven_groups

    assert uneven_groups(validate({**TINY, "num-clients": 8})) is None
    text = uneven_groups(validate({"method": "emdcfl", "num-clients": 5}))
    assert "num-clients=5" in text and "num-clients=4 or 8" in text
    bd = uneven_groups(validate({**TINY, "dataset": "backdoor-mnist", "num-clients": 10}))
    assert "3 data groups" in bd and "num-clients=9 or 12" in bd
