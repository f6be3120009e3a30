"""A hostile or broken node, in every method, every phase, every field, eight ways.

Node :data:`~tests.hostile.BAD` of the in-process grid computes its honest reply with the real
ClientApp, then one field of it is replaced (``tests/hostile.py``): NaN, +inf, -inf, 1e300,
×1e6, negative, a wrong shape, or empty. Each case must end in one of two ways:

- **excluded**: the run completes; ``summary.json`` ``excluded_nodes`` names node BAD with the
  phase and the reason; a warning names it; no honest node is excluded; and the result is the
  honest nodes' — the same as a run in which node BAD never answers that message;
- **a clear stop** naming the node (the floor of honest contributions, SecAgg+ totals).

Never a traceback, never a silent "completed". The few corruptions a server cannot tell from
honest values (:data:`PLAUSIBLE`, each with the reason) are listed in docs/deployment.md's
threat model; for those the run must still complete without an error.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import numpy as np
import pytest

import client_apps.secagg_handlers as secagg_handlers
import fedclust.fcm.secagg as secagg
from client_apps.app import app as client_app
from fedclust.config import ConfigError
from server_app.app import run_method
from server_app.inprocess import InProcessGrid
from tests.hostile import BAD, KINDS, Hostile, corrupt_array, silent

IRIS = {"method": "exact-fcm", "dataset": "iris", "num-clients": 3, "seed": 0, "plots": False,
        "fcm.n-clusters": 3, "fcm.max-rounds": 6}
FED = {"method": "fedfcm", "dataset": "iris", "num-clients": 3, "seed": 0, "plots": False,
       "fedfcm.k-max": 3, "fedfcm.max-rounds": 3}
EMD = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 4, "emdcfl.rounds": 2,
       "emdcfl.local-epochs": 1, "emdcfl.samples": 40, "emdcfl.test-samples": 10,
       "emdcfl.conv1": 4, "emdcfl.conv2": 8, "emdcfl.embed-dim": 16, "emdcfl.workers": 1,
       "seed": 0, "plots": False}

# method id -> (run config, nodes, [(message type, record, key)])
METHODS = {
    "exact": (IRIS, 3, [("query.fcm_stats", "stats", "min"), ("query.fcm_stats", "stats", "max"),
                        ("query.fcm_stats", "metrics", "rows"),
                        ("query.fcm_sums", "sums", "U"), ("query.fcm_sums", "sums", "WS"),
                        ("query.fcm_sums", "metrics", "withheld"),
                        ("query.fcm_final", "objective", "J"),
                        ("query.fcm_final", "eval", "contingency"),
                        ("query.fcm_final", "eval", "codes")]),
    "standard": ({**IRIS, "scaling": "standard"}, 3, [("query.fcm_stats", "stats", "stats")]),
    "incremental": ({**IRIS, "fcm.incremental": True}, 3,
                    [("query.fcm_sums", "sums", "U"), ("query.fcm_sums", "sums", "WS")]),
    "fedfcm": (FED, 3, [("train.fedfcm_local", "local", "k2"),
                        ("train.fedfcm_local", "metrics", "local-iters"),
                        ("query.fedfcm_db", "db", "k2"), ("query.fedfcm_db", "local_index", "k2"),
                        ("query.fedfcm_db", "eval", "k2"), ("query.fedfcm_db", "eval", "codes"),
                        ("query.fcm_final", "objective", "J")]),
    "fedavg": ({**FED, "fedfcm.averaging": "fedavg"}, 3,
               [("train.fedfcm_local", "local", "k2.support")]),
    "emdcfl": (EMD, 4, [("train.emdcfl_local", "model", "0"),
                        ("train.emdcfl_local", "metrics", "num-examples"),
                        ("train.emdcfl_local", "metrics", "train-loss"),
                        ("train.emdcfl_local", "pub", "key"),
                        ("query.emdcfl_embed", "src", "*"), ("query.emdcfl_embed", "tgt", "*"),
                        ("query.emdcfl_embed", "reference", "*"),
                        ("evaluate.emdcfl_eval", "metrics", "test-acc"),
                        ("evaluate.emdcfl_eval", "metrics", "cluster"),
                        ("evaluate.emdcfl_eval", "metrics", "num-test")]),
    "ifca": ({**EMD, "emdcfl.algorithm": "ifca", "emdcfl.num-clusters": 2}, 4,
             [("train.emdcfl_ifca", "model", "0"), ("train.emdcfl_ifca", "metrics", "choice")]),
    "pacfl": ({**EMD, "emdcfl.algorithm": "pacfl"}, 4, [("query.emdcfl_pacfl", "subspace", "u")]),
    "oracle": ({**EMD, "emdcfl.algorithm": "oracle"}, 4,
               [("query.emdcfl_group", "metrics", "cluster")]),
}

# (method, field, kind) -> why the server cannot tell it from an honest value
_EVAL_LABELS = "label codes are the node's own word (evaluation figures only)"
_EMBED = "projected embeddings take any sign and scale (the cosine cost ignores the scale)"
PLAUSIBLE = {
    ("exact", "stats.min", "negative"): "a wider box than the node's data is still a box",
    ("exact", "eval.codes", "x1e6"): _EVAL_LABELS,
    ("exact", "eval.codes", "negative"): _EVAL_LABELS,
    ("fedfcm", "metrics.local-iters", "x1e6"): "an iteration count, logged only",
    ("fedfcm", "local_index.k2", "nan"): "NaN is the local index of a node with too few rows",
    ("fedfcm", "local_index.k2", "1e300"): "the local index describes the node alone",
    ("fedfcm", "local_index.k2", "x1e6"): "the local index describes the node alone",
    ("fedfcm", "eval.codes", "x1e6"): _EVAL_LABELS,
    ("fedfcm", "eval.codes", "negative"): _EVAL_LABELS,
    ("emdcfl", "metrics.num-examples", "x1e6"): "a train size stated from the first round on",
    ("emdcfl", "metrics.train-loss", "1e300"): "a loss, logged only",
    ("emdcfl", "metrics.train-loss", "x1e6"): "a loss, logged only",
    ("emdcfl", "src.*", "x1e6"): _EMBED, ("emdcfl", "src.*", "negative"): _EMBED,
    ("emdcfl", "tgt.*", "x1e6"): _EMBED, ("emdcfl", "tgt.*", "negative"): _EMBED,
    ("emdcfl", "metrics.cluster", "negative"): "-1 is an unknown ground truth",
    ("emdcfl", "metrics.num-test", "x1e6"): "a test-set size, for eval_coverage only",
}
# fields whose corruption is caught in a later phase than its own
LATER = {("exact", "metrics.rows", "x1e6"): ("round-", "final")}

MATRIX = [pytest.param(m, mt, rec, key, kind, id=f"{m}-{mt.split('.')[1]}-{rec}.{key}-{kind}")
          for m, (_, _, fields) in METHODS.items() for mt, rec, key in fields for kind in KINDS]


def _run(app, cfg: dict, n: int, out: Path, **grid) -> dict:
    cfg = {**cfg, "output-dir": str(out)}
    return run_method(InProcessGrid(app, n, cfg, **grid), cfg)


@cache
def _reference(method: str, message_type: str, tmp: str) -> tuple[dict, dict[str, np.ndarray]]:
    """The same run with node BAD silent on ``message_type``: what exclusion must equal."""
    cfg, n, _ = METHODS[method]
    out = Path(tmp) / f"ref-{method}-{message_type}"
    summary = _run(client_app, cfg, n, out, drop=silent(message_type))
    return summary, {p.stem: np.load(p) for p in out.glob("*.npy")}


def _same_result(summary: dict, out: Path, ref: tuple[dict, dict[str, np.ndarray]]) -> None:
    ref_summary, ref_arrays = ref
    for name in ("centers_unscaled", "centers", "clusters"):
        if name in ref_arrays:
            np.testing.assert_allclose(np.load(out / f"{name}.npy"), ref_arrays[name],
                                       atol=1e-9, err_msg=name)
    for key in ("objective", "objective_best_k", "best_k", "eval_ari", "clusters",
                "eval_acc_mean"):
        if key in ref_summary["metrics"]:
            assert summary["metrics"][key] == pytest.approx(ref_summary["metrics"][key],
                                                            abs=1e-9), key


@pytest.mark.parametrize(("method", "message_type", "record", "key", "kind"), MATRIX)
def test_hostile_node_is_excluded_or_plausible(tmp_path_factory, fedclust_log, method,
                                               message_type, record, key, kind):
    cfg, n, _ = METHODS[method]
    out = tmp_path_factory.mktemp("run")
    app = Hostile(message_type, record, key, kind)
    summary = _run(app, cfg, n, out)              # never raises: one hostile node of n
    assert app.hits >= 1, "the corrupted field is not in the node's reply"
    field = f"{record}.{key}"
    mine = [e for e in summary["excluded_nodes"] if e["node"] == BAD]
    assert all(e["node"] == BAD for e in summary["excluded_nodes"]), summary["excluded_nodes"]
    if not app.changed or (method, field, kind) in PLAUSIBLE:
        assert not mine, mine          # honest-looking values are accepted, not excluded
        return
    assert mine, f"node {BAD}'s corrupted {field} ({kind}) was accepted"
    phases = LATER.get((method, field, kind))
    if phases is None:
        phase = {"query.fcm_stats": "scaling", "query.fcm_final": "final",
                 "query.fedfcm_db": "fedfuzzdb", "query.emdcfl_pacfl": "pacfl",
                 "query.emdcfl_group": "oracle", "evaluate.emdcfl_eval": "evaluate",
                 "query.emdcfl_embed": "embed", "train.emdcfl_local": "train-",
                 "train.emdcfl_ifca": "ifca-"}.get(message_type, "round-")
        assert mine[0]["phase"].startswith(phase), mine[0]
        _same_result(summary, out, _reference(method, message_type,
                                               str(tmp_path_factory.getbasetemp())))
    else:
        assert {e["phase"].rstrip("0123456789") for e in mine} <= set(phases), mine
    assert any(f"node {BAD} dropped: rejected reply: {mine[0]['reason']}" in m
               for m in fedclust_log), fedclust_log[-3:]


# --- SecAgg+: the server sees the masked total only ------------------------------------------

SECURE = {**IRIS, "fcm.max-rounds": 3, "fcm.secure-aggregation": True}
# what a corrupted field of one client's secure vector leads to
SECURE_PLAUSIBLE = {("WS", "negative"): "ΣWS stays inside the box",
                    ("J", "negative"): "ΣJ stays within [0, ΣN·D²]"}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("field", ["U", "WS", "J"])
def test_secure_aggregation_checks_the_total(tmp_path, monkeypatch, field, kind):
    """A masked vector of the wrong size is refused (the node is excluded and SecAgg+ recovers
    as from a dropout); implausible totals stop the run, naming the round's contributors
    (which of them sent it, secure aggregation hides); the rest cannot be told apart."""
    current = {"node": None}

    def app(msg, context):
        current["node"] = context.node_id
        return client_app(msg, context)

    pack, pack_final = secagg_handlers.pack, secagg.pack_final

    def bad_pack(u, ws, *args, **kwargs):
        if current["node"] == BAD:
            u = corrupt_array(u, kind) if field == "U" else u
            ws = corrupt_array(ws, kind) if field == "WS" else ws
        return pack(u, ws, *args, **kwargs)

    def bad_final(j, table, *args, **kwargs):
        if current["node"] == BAD and field == "J":
            j = corrupt_array(np.array([j]), kind).ravel()
            j = j[0] if j.size == 1 else j
        return pack_final(j, table, *args, **kwargs)

    monkeypatch.setattr(secagg_handlers, "pack", bad_pack)
    monkeypatch.setattr(secagg, "pack_final", bad_final)
    if kind in ("shape", "empty"):
        summary = _run(app, SECURE, 3, tmp_path / "run")
        assert {e["node"] for e in summary["excluded_nodes"]} == {BAD}
        assert "masked vector holds" in summary["excluded_nodes"][0]["reason"]
        assert np.isfinite(summary["metrics"]["objective"])
    elif (field, kind) in SECURE_PLAUSIBLE:
        summary = _run(app, SECURE, 3, tmp_path / "run")
        assert summary["excluded_nodes"] == []
    else:
        with pytest.raises(RuntimeError) as err:
            _run(app, SECURE, 3, tmp_path / "run")
        msg = str(err.value)
        assert "SecAgg+" in msg and f"node {BAD}" in msg and "implausible" in msg, msg
        assert not (tmp_path / "run" / "summary.json").exists()
        assert (tmp_path / "run" / "interrupted.json").exists()


@pytest.mark.parametrize("how", ["empty", "replayed setup reply"])
@pytest.mark.parametrize("stage", ["setup", "share_keys", "collect_masked_vectors", "unmask"])
def test_a_malformed_secagg_stage_reply_drops_its_node_not_the_run(tmp_path, stage, how):
    """Probe: an empty reply, or the node's setup reply sent again in a later stage, reached
    Flower's workflow unchecked and stopped the run with a bare KeyError. The node is now
    excluded, naming the stage, and the others' secure sums go on."""
    from flwr.app import Message, RecordDict

    kept: dict[str, RecordDict] = {}

    def app(msg, context):
        rec = msg.content.config_records.get("secaggplus_configs")     # before the mod reads it
        now = rec["stage"] if rec is not None and "stage" in rec else None
        rep = client_app(msg, context)
        if context.node_id != BAD or now is None or rep.has_error():
            return rep
        if now == "setup":
            kept.setdefault("setup", rep.content)
        if now != stage or (how != "empty" and stage == "setup"):
            return rep
        content = RecordDict() if how == "empty" else kept["setup"]
        return Message(content, reply_to=msg)

    summary = _run(app, SECURE, 3, tmp_path / "run")
    excluded = summary["excluded_nodes"]
    if how != "empty" and stage == "setup":       # a setup reply in the setup stage is honest
        assert excluded == []
        return
    assert {e["node"] for e in excluded} == {BAD}, excluded
    assert "SecAgg+ stage" in excluded[0]["reason"] or "SecAgg+ reply" in excluded[0]["reason"]
    assert np.isfinite(summary["metrics"]["objective"])


# --- the probe's repros ----------------------------------------------------------------------

def _honest(tmp_path: Path, cfg: dict = IRIS) -> dict:
    return _run(client_app, cfg, 3, tmp_path / "honest")


@pytest.mark.parametrize("kind", ["1e300", "+inf", "-inf"])
def test_iris_with_one_node_sending_absurd_bounds_keeps_the_honest_answer(tmp_path,
                                                                          fedclust_log, kind):
    """Probe: node 0 replied 1e300 bounds and every honest node was dropped (ARI 0.0); ±inf
    bounds gave NaN centers and a stop that blamed the privacy guard."""
    app = Hostile("query.fcm_stats", "stats", "max", kind)
    summary = _run(app, IRIS, 3, tmp_path / "run")
    assert summary["excluded_nodes"][0]["node"] == BAD
    assert summary["excluded_nodes"][0]["phase"] == "scaling"
    assert {e["node"] for e in summary["excluded_nodes"]} == {BAD}
    ref = _run(client_app, IRIS, 3, tmp_path / "ref", drop=silent("query.fcm_stats"))
    assert summary["metrics"]["eval_ari"] == ref["metrics"]["eval_ari"] > 0.6
    assert np.all(np.isfinite(np.load(tmp_path / "run" / "centers.npy")))
    assert any(f"[scaling] node {BAD} dropped: rejected reply: 'stats.max'" in m
               for m in fedclust_log)
    history = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text()
               .splitlines()]
    assert history[0]["excluded_nodes"][0]["phase"] == "scaling"   # the first record has it


@pytest.mark.parametrize("guard", [True, False])
def test_every_node_sending_infinite_bounds_stops_without_blaming_the_guard(tmp_path, guard):
    app = Hostile("query.fcm_stats", "stats", "min", "+inf", nodes=frozenset({1000, 1001, 1002}))
    with pytest.raises(RuntimeError) as err:
        _run(app, {**IRIS, "fcm.privacy-guard": guard}, 3, tmp_path / "run")
    msg = str(err.value)
    assert "privacy guard" not in msg and "privacy-guard" not in msg, msg
    assert all(f"node {n}" in msg for n in (1000, 1001, 1002)) and "'stats.min'" in msg
    assert not (tmp_path / "run" / "centers.npy").exists()


def test_a_wrong_shape_objective_is_excluded_not_a_type_error(tmp_path, fedclust_log):
    honest = _honest(tmp_path)
    summary = _run(Hostile("query.fcm_final", "objective", "J", "shape"), IRIS, 3,
                   tmp_path / "run")
    assert summary["excluded_nodes"] == [
        {"node": BAD, "phase": "final",
         "reason": "'objective.J' has shape (1, 2), expected (1,)"}]
    assert 0 < summary["metrics"]["objective"] < honest["metrics"]["objective"]


@pytest.mark.parametrize("kind", ["nan", "1e300", "shape"])
def test_fedfcm_with_broken_db_statistics_excludes_the_node(tmp_path, kind):
    """Probe: raw ``ValueError: All-NaN slice`` / ``TypeError`` in strategies/fedfcm.py."""
    summary = _run(Hostile("query.fedfcm_db", "db", "k3", kind), FED, 3, tmp_path / "run")
    assert [(e["node"], e["phase"]) for e in summary["excluded_nodes"]] == [(BAD, "fedfuzzdb")]
    assert all(np.isfinite(v) for v in summary["metrics"]["fedfuzzdb"].values())
    assert str(BAD) not in summary["metrics"]["local_index"]


@pytest.mark.parametrize("kind", ["negative", "x1e6"])
@pytest.mark.parametrize("key", ["U", "WS"])
def test_negative_or_inflated_sums_are_excluded(tmp_path, key, kind):
    """Probe: accepted without a word. U_c sums memberships^m of the node's N rows (so Σ_c U_c
    lies in [N·C^(1−m), N]); WS_c / U_c is a mean of rows inside the federated box."""
    summary = _run(Hostile("query.fcm_sums", "sums", key, kind), IRIS, 3, tmp_path / "run")
    rounds = summary["metrics"]["rounds"]
    excluded = summary["excluded_nodes"]
    assert [e["phase"] for e in excluded] == [f"round-{r}" for r in range(1, rounds + 1)]
    assert all(e["node"] == BAD and e["reason"].startswith(f"'sums.{key}'") for e in excluded)
    history = [json.loads(x) for x in (tmp_path / "run" / "history.jsonl").read_text()
               .splitlines()]
    assert all(h["excluded_nodes"][0]["node"] == BAD and h["contributed"] == 2 for h in history)


# --- too few honest nodes: a failed run, never a degenerate "completed" ----------------------

@pytest.mark.parametrize(("method", "hostile"), [
    ("exact", Hostile("query.fcm_sums", "sums", "U", "nan")),
    ("fedfcm", Hostile("train.fedfcm_local", "local", "k2", "x1e6")),
    ("emdcfl", Hostile("train.emdcfl_local", "model", "0", "nan")),
])
def test_fewer_honest_contributions_than_min_clients_stops_the_run(tmp_path, method, hostile):
    cfg, n, _ = METHODS[method]
    with pytest.raises(RuntimeError) as err:
        _run(hostile, {**cfg, "min-clients": n}, n, tmp_path / "run")
    msg = str(err.value)
    assert f"node {BAD}" in msg and f"min-clients = {n}" in msg and "honest" in msg, msg
    assert not (tmp_path / "run" / "summary.json").exists()
    marker = json.loads((tmp_path / "run" / "interrupted.json").read_text())
    assert marker["error"] == "RuntimeError" and f"node {BAD}" in marker["message"]


def test_no_honest_node_left_stops_the_run(tmp_path):
    everyone = frozenset({1000, 1001, 1002})
    with pytest.raises(RuntimeError) as err:
        _run(Hostile("query.fcm_sums", "sums", "WS", "x1e6", nodes=everyone), IRIS, 3,
             tmp_path / "run")
    assert "kept 0 honest contribution(s)" in str(err.value)
    with pytest.raises(RuntimeError) as err:
        _run(Hostile("query.fedfcm_db", "db", "k2", "nan", nodes=everyone), FED, 3,
             tmp_path / "fed")
    assert "kept 0 honest contribution(s)" in str(err.value)


# --- degenerate settings the server sees once the counts arrive ------------------------------

TINY = {"dataset": "blobs", "blobs.n-samples": 12, "num-clients": 3, "seed": 0, "plots": False}


@pytest.mark.parametrize(("cfg", "key"), [
    ({**TINY, "method": "exact-fcm", "fcm.n-clusters": 13, "fcm.privacy-guard": False},
     "fcm.n-clusters"),
    ({**TINY, "method": "fedfcm", "fedfcm.k-max": 13, "fedfcm.privacy-guard": False},
     "fedfcm.k-max"),
    ({**TINY, "method": "exact-fcm", "fcm.n-clusters": 13, "fcm.privacy-guard": False,
      "fcm.secure-aggregation": True}, "fcm.n-clusters"),
], ids=["exact", "fedfcm", "secure"])
def test_more_clusters_than_pooled_rows_is_refused(tmp_path, cfg, key):
    """Probe: 10 clusters on 4 rows "converged" with objective 1e-154. With the guard on,
    every node that speaks holds more rows than clusters; with it off the server checks."""
    with pytest.raises(ConfigError) as err:
        _run(client_app, cfg, 3, tmp_path / "run")
    msg = str(err.value)
    assert f"'{key}' = 13" in msg and "12 row(s)" in msg and "at most 12" in msg, msg


# --- evaluation coverage ---------------------------------------------------------------------

@pytest.mark.parametrize("method", ["exact-fcm", "fedfcm"])
def test_partial_evaluation_says_what_it_covers(tmp_path, fedclust_log, method):
    """1 of 3 deployed nodes allows evaluation: the eval_* figures cover 1 node and its rows."""
    from tests.data.test_eval_labels import SITES, write_sites

    write_sites(tmp_path / "sites")
    nodes = [{"data-path": str(tmp_path / "sites" / name), "label-column": "diagnosis",
              "allow-evaluation": i == 0} for i, name in enumerate(sorted(SITES))]
    cfg = {"method": method, "dataset": "local", "num-clients": 3, "plots": False,
           **({"fcm.n-clusters": 3} if method == "exact-fcm" else {"fedfcm.k-max": 3})}
    summary = _run(client_app, cfg, 3, tmp_path / "run", node_configs=nodes)
    rows = sum(SITES[sorted(SITES)[0]].values())
    assert summary["metrics"]["eval_coverage"] == {"nodes": 1, "of_nodes": 3, "rows": rows}
    assert any("eval_* metrics cover 1 of 3 nodes" in m for m in fedclust_log)


def test_emdcfl_evaluation_coverage(tmp_path, fedclust_log):
    full = _run(client_app, EMD, 4, tmp_path / "full")
    assert full["metrics"]["eval_coverage"] == {"nodes": 4, "of_nodes": 4, "rows": 40}
    part = _run(client_app, EMD, 4, tmp_path / "part", drop=silent("evaluate.emdcfl_eval"))
    assert part["metrics"]["eval_coverage"] == {"nodes": 3, "of_nodes": 4, "rows": 30}
    assert any("eval_* metrics cover 3 of 4 nodes" in m for m in fedclust_log)


def test_a_node_that_misreports_the_engine_is_excluded_not_believed(tmp_path):
    """Probe: a node answering ``query.fedclust_node`` with num-partitions = 10**9 stopped the
    run with a ConfigError that blamed the user's num-clients. The connected nodes and the
    other answers outvote it; it is excluded, named, and the run goes on."""
    def app(msg, context):
        rep = client_app(msg, context)
        if context.node_id == BAD and msg.metadata.message_type == "query.fedclust_node":
            rep.content.metric_records["metrics"]["num-partitions"] = 10**9
        return rep

    summary = _run(app, IRIS, 3, tmp_path / "run")
    assert [(e["node"], e["phase"]) for e in summary["excluded_nodes"]] == [(BAD, "engine")]
    assert "num-partitions=1000000000" in summary["excluded_nodes"][0]["reason"]
    assert summary["metrics"]["n_clients"] == 3
