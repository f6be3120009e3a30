"""FedCRef end to end through the in-process Grid (real ServerApp main + ClientApp handlers) on a
tiny planted image dataset generated in the released .npz layout, plus one `flwr run` smoke."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fedclust.config import ConfigError, validate
from fedclust.fedcref import client as core
from fedclust.fedcref.keys import ClientSettings
from fedclust.fedcref.system import SystemSizeError
from tests.fake_grid import run_server

# The planted system's clusters hold 30 samples: the paper's eq. (2) forms communities there,
# the default ratio test (4-5 held-out samples per cluster) only a few; the tests of the
# message flow need communities, so they pin eq2 (the ratio test has its own runs below).
FAST = {"fedcref.assoc-rule": "eq2", "fedcref.refine": "paper", "fedcref.wire": "float32",
        "fedcref.fl-rounds": 3, "fedcref.fl-local-epochs": 6,
        "fedcref.batch-size": 16, "fedcref.ae-epochs": 20, "fedcref.ae-patience": 0,
        "fedcref.max-iterations": 2,
        "fedcref.k-max": 3, "fedcref.samples-per-cluster": 30, "plots": False}


def planted(root: Path, n_classes: int = 6, per_class: int = 200, seed: int = 0) -> Path:
    """8×8 'images': each class is a fixed random binary pattern plus Gaussian pixel noise,
    saved as data-dir/mnist/mnist-train.npz (keys x, y) like shared/data."""
    rng = np.random.default_rng(seed)
    protos = rng.random((n_classes, 8, 8)) < 0.35
    x = np.concatenate([np.clip(p * 200.0 + 20 + rng.normal(0, 30, (per_class, 8, 8)), 0, 255)
                        for p in protos]).astype(np.uint8)
    y = np.repeat(np.arange(n_classes), per_class).astype(np.uint8)
    (root / "mnist").mkdir(parents=True, exist_ok=True)
    np.savez_compressed(root / "mnist" / "mnist-train.npz", x=x, y=y)
    return root


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return planted(tmp_path_factory.mktemp("planted"))


def _cfg(root: Path, out: Path, **extra: object) -> dict:
    return {"method": "fedcref", "dataset": "mnist", "data-dir": str(root), "num-clients": 5,
            "seed": 1, "output-dir": str(out), "fedcref.dirtiness": 0.2, **FAST, **extra}


@pytest.fixture(scope="module")
def main_run(data_root: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("main_run")
    seen: list[list[str]] = []
    summary, grid = run_server(
        _cfg(data_root, out, plots=True),
        inspect=lambda m, r: seen.append(list(r.content.array_records) if not r.has_error()
                                         else ["ERROR"]), keep_sent=True)
    return summary, grid, seen, out


def test_recovers_planted_clusters(main_run) -> None:
    summary, _, seen, out = main_run
    m = summary["metrics"]
    assert m["eval_acc_start"] < 0.9
    assert m["eval_acc_end"] >= 0.95 and m["eval_acc_end"] > m["eval_acc_start"] + 0.1
    hist = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    first = hist[0]
    assert first["communities"] >= 3 and first["eval_wrong_associations_pct"] == 0.0
    assert first["communities"] <= first["eval_ideal_communities"]
    for key in ("isolated", "active_clients", "bytes_sent", "bytes_received", "seconds"):
        assert key in first
    # the paper's "isolated start": all clusters, before any association; then after it. 1
    assert m["isolated_start"] == first["clusters"] > first["isolated"] == m["isolated_first"]
    assert (out / "fedcref_figure4.png").stat().st_size > 0
    # bytes and seconds are running totals; *_iter are each iteration's share
    assert sum(h["bytes_sent_iter"] for h in hist) == hist[-1]["bytes_sent"] == m["bytes_sent"]
    assert sum(h["bytes_received_iter"] for h in hist) == hist[-1]["bytes_received"]
    assert all(h["bytes_sent_iter"] > 0 for h in hist)
    for phase, total in hist[-1]["seconds"].items():
        assert sum(h["seconds_iter"].get(phase, 0.0) for h in hist) == pytest.approx(total)
    # bytes per phase add up to all bytes, per iteration and over the run
    for h in hist:
        assert (sum(h["bytes_by_phase_iter"].values())
                == h["bytes_sent_iter"] + h["bytes_received_iter"])
    assert set(hist[0]["bytes_by_phase_iter"]) >= {"local_training", "cross_evaluation",
                                                   "community_training", "refinement"}
    by_phase = m["bytes_per_client_iter_by_phase"]
    assert all(v > 0 for v in by_phase.values())
    assert sum(by_phase.values()) == pytest.approx(m["bytes_per_client_iter"])
    assert first["unmodelled_clusters"] == 0


def test_small_clusters_are_left_out_of_every_cluster_count(data_root: Path,
                                                            tmp_path: Path) -> None:
    # S = 30 with dirtiness 0.2: some clusters hold fewer than 30 samples, get no model and are
    # no graph nodes; they must not count as isolated at the start either
    cfg = _cfg(data_root, tmp_path, **{"fedcref.max-iterations": 1,
                                       "fedcref.min-cluster-size": 31})
    summary, _ = run_server(cfg)
    m = summary["metrics"]
    first = json.loads((tmp_path / "history.jsonl").read_text().splitlines()[0])
    from fedclust.config import validate

    total = sum(c.k for c in core.build_system(validate(cfg))[0])
    assert 0 < first["unmodelled_clusters"] < total
    assert m["isolated_start"] == first["clusters"] == total - first["unmodelled_clusters"]
    assert first["isolated"] + sum(first["sizes"]) == first["clusters"]


def test_clients_send_only_models_bits_counts(main_run) -> None:
    # models, accept bits, counts and (evaluation path) per-cluster class histograms only
    _, _, seen, _ = main_run
    allowed = {"models", "clusters", "eval", "accept", "counts"}
    assert seen and all(set(names) <= allowed for names in seen)


@pytest.mark.parametrize("rule", ["ratio", "calibrated"])
def test_held_out_rules_send_only_bits_and_models(data_root: Path, tmp_path: Path,
                                                  rule: str) -> None:
    # assoc-rule=ratio / calibrated: the held-out samples, the per-sample errors and the
    # calibrated test's anchors stay on the client; replies hold models, the list of modelled
    # clusters, accept bits (0/1) and counts, and scalar metrics only
    replies: list = []
    summary, _ = run_server(_cfg(data_root, tmp_path, evaluate=False,
                                 **{"fedcref.assoc-rule": rule}),
                            inspect=lambda m, r: replies.append(r)
                            if "fedcref" in m.metadata.message_type else None)
    assert summary["metrics"]["iterations"] >= 1 and replies
    scalars = {"k", "key", "version", "n", "seconds", "agreement", "community-share"}
    for r in replies:
        assert not r.has_error()
        assert set(r.content.array_records) <= {"models", "clusters", "accept", "counts"}
        if "accept" in r.content.array_records:
            bits = r.content.array_records["accept"]["accept"].numpy()
            assert bits.dtype == np.uint8 and set(np.unique(bits)) <= {0, 1}
        for name, value in r.content.metric_records.get("metrics", {}).items():
            assert name in scalars or (name == "missing" and value == []), name


def test_the_default_recovers_planted_clusters(data_root: Path, tmp_path: Path) -> None:
    # the default (the confident test, the covered refinement, int8-delta weights) on
    # the planted system with 60 samples per cluster (9 held out): communities, no wrong one
    cfg = {k: v for k, v in _cfg(data_root, tmp_path).items()
           if k not in ("fedcref.assoc-rule", "fedcref.refine", "fedcref.wire")}
    cfg["fedcref.samples-per-cluster"] = 60
    checked = validate(cfg)
    assert (checked["fedcref.assoc-rule"], checked["fedcref.refine"],
            checked["fedcref.wire"]) == ("confident", "covered", "int8-delta")
    summary, _ = run_server(cfg)
    m = summary["metrics"]
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert hist[0]["communities"] >= 1
    assert all(h["eval_wrong_associations_pct"] == 0.0 for h in hist)
    assert not m["health"]["fallback"] and m["bytes_per_client_iter"] > 0
    # never below the clients' own models (this system's tiny autoencoders make Algorithm 2
    # with own models alone collapse two-cluster clients, whatever the federation does)
    local, _ = run_server({**cfg, "output-dir": str(tmp_path / "local"),
                           "fedcref.association": "none"})
    assert m["eval_acc_end"] >= local["metrics"]["eval_acc_end"] - 0.01


def test_the_default_abstains_and_says_so_when_clusters_are_small(data_root: Path,
                                                                   tmp_path: Path) -> None:
    # 12 samples per cluster hold 2 held-out samples: too few for any sign test at the
    # default level; no community forms, the run says it fell back to local models, and
    # ends where local-only ends
    base = {k: v for k, v in _cfg(data_root, tmp_path / "d").items()
            if k not in ("fedcref.assoc-rule", "fedcref.refine", "fedcref.wire")}
    base["fedcref.samples-per-cluster"] = 12
    summary, _ = run_server(base)
    m = summary["metrics"]
    assert m["communities"] == 0 and m["health"]["fallback"]
    assert any("local-only" in w for w in m["health"]["warnings"])
    local, _ = run_server({**base, "output-dir": str(tmp_path / "l"),
                           "fedcref.association": "none"})
    assert m["eval_acc_end"] >= local["metrics"]["eval_acc_end"] - 0.01


def test_received_models_are_never_resent(main_run) -> None:
    _, grid, _, _ = main_run
    per_node: dict[int, list[str]] = {}
    for msg in grid.sent:
        if msg.metadata.message_type == "query.fedcref_assoc" and \
                "models" in msg.content.array_records:
            keys = {n.rpartition("/")[0] for n in msg.content.array_records["models"]}
            per_node.setdefault(msg.metadata.dst_node_id, []).extend(keys)
    assert per_node
    for keys in per_node.values():
        assert len(keys) == len(set(keys))


def test_survives_a_dropped_client(data_root: Path, tmp_path: Path) -> None:
    def drop(nid: int, msg) -> bool:
        return nid == 1002 and msg.metadata.message_type in ("query.fedcref_assoc",
                                                             "train.fedcref_comm")
    n_clusters: dict[int, int] = {}

    def inspect(msg, rep) -> None:
        if msg.metadata.message_type == "train.fedcref_local" and rep.has_content():
            n_clusters[msg.metadata.dst_node_id] = (
                rep.content.array_records["clusters"]["clusters"].numpy().size)

    summary, _ = run_server(_cfg(data_root, tmp_path, **{"fedcref.max-iterations": 1}),
                            drop=drop, inspect=inspect)
    assert 1002 in summary["metrics"]["dropped_nodes"]
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert hist[0]["dropped_nodes"]["assoc"]["1002"].startswith("no reply")
    # the documented rule: a client missing from the association step leaves the graph
    assert hist[0]["clusters"] == sum(n_clusters.values()) - n_clusters[1002]
    assert summary["metrics"]["eval_acc_end"] > 0.8


@pytest.mark.parametrize("mode", ["perfect", "none"])
def test_baselines_run(data_root: Path, tmp_path: Path, mode: str) -> None:
    summary, _ = run_server(_cfg(data_root, tmp_path, **{"fedcref.association": mode,
                                                         "fedcref.max-iterations": 1}))
    m = summary["metrics"]
    if mode == "none":
        assert m["communities"] == 0
    else:
        assert m["communities"] >= 3 and m["eval_wrong_associations_pct"] == 0.0


def test_no_eval_statistics_when_evaluate_false(data_root: Path, tmp_path: Path) -> None:
    summary, grid = run_server(_cfg(data_root, tmp_path, evaluate=False,
                                    **{"fedcref.max-iterations": 1}))
    assert "eval_acc_end" not in summary["metrics"]


def test_bad_input_fails_before_any_work(data_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="dataset"):
        run_server({"method": "fedcref", "dataset": "iris", "output-dir": str(tmp_path)})
    with pytest.raises(SystemSizeError, match="needs"):
        run_server(_cfg(data_root, tmp_path, **{"num-clients": 40,
                                                "fedcref.samples-per-cluster": 100}))


def test_client_cache_reports_missing_models() -> None:
    st = core.ClientState(labels=np.array([0, 0, 1, 1]), k=2)
    st.own_errors = np.random.default_rng(0).random((2, 4)).astype(np.float32)
    s = ClientSettings.from_config(validate({
        "method": "fedcref", "dataset": "digits", "output-dir": "unused",
        "fedcref.theta": 0.2, "fedcref.alpha": 0.75, "fedcref.min-cluster-size": 1,
        "fedcref.assoc-best-per-client": True, "fedcref.assoc-rule": "eq2",
        "fedcref.epsilon": 0.2, "fedcref.ratio-quantile": 0.5, "fedcref.lambda": 0.9,
        "fedcref.beta": 0.02}))
    acc, missing, _ = core.associate(st, np.zeros((4, 3), np.float32), ["1:0:1"], {}, s)
    assert missing == ["1:0:1"]
    st.cache["1:0:1"] = st.own_errors[0]
    st.cache["9:9:9"] = st.own_errors[1]            # stale: no longer current, dropped
    acc, missing, _ = core.associate(st, np.zeros((4, 3), np.float32), ["1:0:1"], {}, s)
    assert missing == [] and acc.shape == (2, 1) and acc[0, 0] and "9:9:9" not in st.cache


def test_result_does_not_depend_on_node_ids(data_root: Path, tmp_path: Path) -> None:
    # Engines assign node ids freely (random in deployment): the same clients behind permuted
    # node ids must give the same run (client seeds and order come from the clients' data keys).
    cfg = _cfg(data_root, tmp_path / "a", **{"fedcref.max-iterations": 1, "num-clients": 4})
    ref, _ = run_server(cfg)
    perm = [{"partition-id": p, "num-partitions": 4} for p in (2, 0, 3, 1)]
    got, _ = run_server({**cfg, "output-dir": str(tmp_path / "b")}, node_configs=perm)
    for key in ("eval_acc_start", "eval_acc_end", "communities", "isolated_end",
                "eval_wrong_associations_pct"):
        assert got["metrics"][key] == pytest.approx(ref["metrics"][key], rel=1e-9), key


def test_project_default_dataset_means_digits() -> None:
    from fedclust.config import validate

    assert validate({"method": "fedcref"})["dataset"] == "digits"


def _iteration2(grid) -> tuple[set[int], dict[str, set[int]], list]:
    """Nodes inactive in iteration 2 and, per message type, the nodes iteration 2 reached."""
    it2 = [m for m in grid.sent if m.metadata.group_id in ("local-2", "assoc-2", "refine-2")
           or m.metadata.group_id.startswith("comm-2-")]
    inactive = {m.metadata.dst_node_id for m in it2
                if m.metadata.message_type == "train.fedcref_local"
                and not m.content.config_records["config"]["active"]}
    to: dict[str, set[int]] = {}
    for m in it2:
        to.setdefault(m.metadata.message_type, set()).add(m.metadata.dst_node_id)
    return inactive, to, it2


def test_unchanged_models_of_inactive_clients_are_not_relayed_again(main_run) -> None:
    _, grid, _, out = main_run
    hist = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    inactive, to, it2 = _iteration2(grid)
    assert inactive and len(inactive) == hist[0]["active_clients"] - hist[0]["active_after"]
    assert inactive <= to["query.fedcref_assoc"]      # inactive clients still associate
    for m in it2:
        if m.metadata.message_type == "query.fedcref_assoc" and \
                m.metadata.dst_node_id not in inactive:
            n_keys = len(m.content.config_records["config"]["keys"])
            sent = {n.rpartition("/")[0] for n in m.content.array_records["models"]} \
                if "models" in m.content.array_records else set()
            assert len(sent) < n_keys


def test_inactive_clients_train_communities_but_do_not_refine(data_root: Path,
                                                              tmp_path: Path) -> None:
    """§4.4: τ-stable clients stop retraining and refining but keep training their
    communities (perfect associations here, so that iteration 2 surely has communities)."""
    _, grid = run_server(_cfg(data_root, tmp_path, plots=False,
                              **{"fedcref.association": "perfect"}), keep_sent=True)
    inactive, to, _ = _iteration2(grid)
    assert inactive
    assert inactive & to["train.fedcref_comm"]
    assert not inactive & to.get("train.fedcref_refine", set())


@pytest.mark.parametrize(("phase", "kind", "reason"), [
    ("train.fedcref_local", "shape", "rejected reply: 'clusters' must list"),
    ("query.fedcref_assoc", "shape", "rejected reply: 'accept' has shape"),
    ("train.fedcref_comm", "nan", "rejected reply: 'models."),
    ("train.fedcref_comm", "shape", "rejected reply: 'models.W0' has shape"),
    ("train.fedcref_refine", "error", 'error reply: "simulated ClientApp crash"'),
])
def test_bad_reply_is_rejected_in_every_phase(data_root: Path, tmp_path: Path, phase: str,
                                              kind: str, reason: str) -> None:
    from server_app.app import run_method
    from tests.fake_grid import InProcessGrid
    from tests.safety.test_faults import BAD, _faulty_app

    cfg = _cfg(data_root, tmp_path, **{"fedcref.max-iterations": 1})
    summary = run_method(InProcessGrid(_faulty_app(kind, phase), 5, cfg), dict(cfg))
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    drops = {why for per in hist[0]["dropped_nodes"].values() for n, why in per.items()
             if n == str(BAD)}
    assert drops and all(why.startswith(reason) for why in drops), hist[0]["dropped_nodes"]
    assert BAD in summary["metrics"]["dropped_nodes"]
    assert summary["metrics"]["eval_acc_end"] > 0.5


def test_no_client_answering_stops_with_the_reasons(data_root: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="no client answered the local phase.*no reply"):
        run_server(_cfg(data_root, tmp_path, **{"fedcref.max-iterations": 1}),
                   drop=lambda nid, m: m.metadata.message_type == "train.fedcref_local")


def test_a_client_that_left_does_not_keep_the_run_going(data_root: Path, tmp_path: Path) -> None:
    """Node 1004 answers only the first local phase: once the others are stable the run stops
    with 'no active clients' instead of waiting for the one that left."""
    summary, _ = run_server(
        _cfg(data_root, tmp_path, **{"fedcref.max-iterations": 3}),
        drop=lambda nid, m: nid == 1004 and m.metadata.group_id != "local-1")
    m = summary["metrics"]
    assert m["stop_reason"] == "no active clients", m
    assert 1004 in m["dropped_nodes"]


def test_with_new_links_once_only_the_first_iteration_cross_evaluates(data_root: Path,
                                                                      tmp_path: Path) -> None:
    cfg = _cfg(data_root, tmp_path, **{"fedcref.new-links": "once", "fedcref.tau": 1.0,
                                       "fedcref.max-iterations": 3})
    _, grid = run_server(cfg, keep_sent=True)
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert len(hist) == 3 and hist[0]["communities"] >= 1
    assert len({h["edges"] for h in hist}) == 1          # the first links, kept
    # one cross-evaluation message per client, in the first iteration only
    assert len([m for m in grid.sent if m.metadata.message_type == "query.fedcref_assoc"]) \
        == cfg["num-clients"]


def test_with_new_links_partners_later_iterations_send_only_the_partners(data_root: Path,
                                                                         tmp_path: Path) -> None:
    cfg = _cfg(data_root, tmp_path, **{"fedcref.new-links": "partners", "fedcref.tau": 1.0,
                                       "fedcref.max-iterations": 2, "fedcref.stop-window": 9})
    _, grid = run_server(cfg, keep_sent=True)
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert len(hist) == 2 and hist[0]["communities"] >= 1
    assert hist[1]["edges"] <= hist[0]["edges"]
    keys = {t: {m.metadata.dst_node_id: list(m.content["config"].get("keys", []))
                for m in grid.sent if m.metadata.group_id == f"assoc-{t}"} for t in (1, 2)}
    assert len(keys[1]) == cfg["num-clients"]
    assert keys[2] and set(keys[2]) <= set(keys[1])
    # a client's partners are the clusters linked to its own in the first iteration: fewer
    # than every foreign cluster, and every one of them is linked to one of its clusters
    clients = {int(k.split(":")[0]) for ks in keys[1].values() for k in ks}
    assert all(len(keys[2][nid]) < len(keys[1][nid]) for nid in keys[2])
    assert all({int(k.split(":")[0]) for k in ks} < clients for ks in keys[2].values())
    by_phase = [h["bytes_by_phase_iter"]["cross_evaluation"] for h in hist]
    assert by_phase[1] < by_phase[0]


# -- int8-delta: the int8 weights in fewer bytes, and what happens when a base is missing -------

def _history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]


TRAJECTORY = ("communities", "isolated", "edges", "clusters", "sizes", "active_after",
              "mean_agreement", "eval_acc")


def _trajectory(hist: list[dict]) -> list[dict]:
    return [{k: h.get(k) for k in TRAJECTORY} for h in hist]


@pytest.fixture(scope="module")
def int8_runs(data_root: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same system with int8 and with int8-delta weights (the main run's settings)."""
    out = {}
    for fmt in ("int8", "int8-delta"):
        d = tmp_path_factory.mktemp(fmt)
        summary, grid = run_server(_cfg(data_root, d, **{"fedcref.wire": fmt}), keep_sent=True)
        out[fmt] = (summary["metrics"], _history(d), grid)
    return out


def _bases(msg, record: str = "models") -> list[int]:
    """The base kinds of the int8-delta models a message carries."""
    rec = msg.content.array_records[record]
    return [int(row[0]) for name in rec if name.endswith("base") for row in rec[name].numpy()]


def test_int8_delta_follows_the_int8_trajectory_in_fewer_bytes(int8_runs) -> None:
    from fedclust.fedcref import wire

    m8, h8, _ = int8_runs["int8"]
    md, hd, grid = int8_runs["int8-delta"]
    assert h8[0]["communities"] >= 3
    assert _trajectory(hd) == _trajectory(h8)
    b8, bd = m8["bytes_per_client_iter_by_phase"], md["bytes_per_client_iter_by_phase"]
    assert bd["cross_evaluation"] < 0.8 * b8["cross_evaluation"]
    assert bd["community_training"] < 0.6 * b8["community_training"]
    # fresh cluster models against their seeded initialisation; community models of the first
    # round against theirs, of later rounds and of the refinement against the last round's
    sent = {(m.metadata.message_type, m.metadata.group_id): m for m in grid.sent}
    assocs = [m for (t, _), m in sent.items() if t == "query.fedcref_assoc"
              and "models" in m.content.array_records]
    assert assocs and all(set(_bases(m)) == {wire.INIT} for m in assocs)
    assert set(_bases(sent[("train.fedcref_comm", "comm-1-1")])) == {wire.INIT}
    assert set(_bases(sent[("train.fedcref_comm", "comm-1-2")])) == {wire.HELD}
    refines = [m for (t, g), m in sent.items() if g == "refine-1"
               and "models" in m.content.array_records]
    # (refine=paper: a client also gets the communities it is not in, against their init)
    assert refines and all(set(_bases(m)) <= {wire.HELD, wire.INIT} for m in refines)
    assert any(wire.HELD in _bases(m) for m in refines)


def _wrapped(change):
    """The real ClientApp, with ``change(msg, context)`` applied to each message first."""
    from client_apps.app import app as client_app

    def app(msg, context):
        change(msg, context)
        return client_app(msg, context)

    return app


def _run_with(data_root: Path, out: Path, change, **extra):
    from server_app.app import run_method
    from server_app.inprocess import InProcessGrid

    cfg = _cfg(data_root, out, **{"fedcref.wire": "int8-delta", **extra})
    grid = InProcessGrid(_wrapped(change), cfg["num-clients"], cfg, keep_sent=True)
    summary = run_method(grid, dict(cfg))
    return summary, _history(out), grid


def test_models_a_node_cannot_rebuild_go_without_their_base_and_change_nothing(
        data_root: Path, tmp_path: Path, int8_runs) -> None:
    from flwr.app import Array

    from fedclust.fedcref import wire

    def change(msg, context) -> None:
        conf = msg.content.config_records.get("config")
        if context.node_id == 1000 and conf is not None and "init-check" in conf:
            conf["init-check"] = int(conf["init-check"]) ^ 1   # its torch draws other weights
        rec = msg.content.array_records.get("models")
        if context.node_id == 1002 and msg.metadata.group_id == "assoc-1" and rec:
            key = sorted(n.rpartition("/")[0] for n in rec if n.endswith("/base")
                         and rec[n].numpy()[0, 0] == wire.INIT)[0]
            digest = rec[f"{key}/digest"].numpy()
            rec[f"{key}/digest"] = Array(digest ^ 1)             # one base arrives wrong

    summary, hist, grid = _run_with(data_root, tmp_path, change)
    assert _trajectory(hist) == _trajectory(int8_runs["int8-delta"][1])
    assert not summary["metrics"]["dropped_nodes"] and not summary["excluded_nodes"]
    to_it = [msg for msg in grid.sent if msg.metadata.dst_node_id == 1000
             and "models" in msg.content.array_records]
    kinds = {(msg.metadata.message_type, k) for msg in to_it for k in _bases(msg)}
    assert ("query.fedcref_assoc", wire.NONE) in kinds
    assert not any(k == wire.INIT for _, k in kinds)
    assert ("train.fedcref_comm", wire.HELD) in kinds     # its own copies still serve
    resent = [msg for msg in grid.sent if msg.metadata.group_id == "assoc-1-resend"]
    assert [msg.metadata.dst_node_id for msg in resent] == [1002]
    assert set(_bases(resent[0])) == {wire.NONE}


def test_a_node_that_lost_its_copies_misses_one_round_and_rejoins(data_root: Path,
                                                                 tmp_path: Path) -> None:
    from client_apps.fedcref_handlers import HELD
    from fedclust.fedcref import wire

    def forget(msg, context) -> None:
        if context.node_id == 1001 and msg.metadata.group_id == "comm-1-2":
            del context.state[HELD]

    summary, hist, grid = _run_with(data_root, tmp_path, forget)
    m = summary["metrics"]
    assert 1001 in m["dropped_nodes"]
    assert "1001" in hist[0]["dropped_nodes"]["comm"]
    # it is sent the next round's models against their initialisation, and answers
    again = [msg for msg in grid.sent if msg.metadata.dst_node_id == 1001
             and msg.metadata.group_id == "comm-1-3"]
    assert again and wire.INIT in set(_bases(again[0]))
    assert hist[0]["communities"] >= 3 and m["eval_acc_end"] > 0.8
