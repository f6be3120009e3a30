"""EMD-CFL server loop end to end through the in-process grid, privacy, baselines, bad input."""

import json

import numpy as np
import pytest

from fedclust.config import ConfigError, validate
from tests.fake_grid import run_server

# Two planted groups on the deployment data path (node config ``data-path``): clients 0, 1 hold
# sklearn digits, clients 2, 3 the same kind of digits colour-inverted (8x8; no downloads).
TINY = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 4,
        "emdcfl.rounds": 2, "emdcfl.local-epochs": 6, "emdcfl.conv1": 8, "emdcfl.conv2": 16,
        "emdcfl.embed-dim": 32, "emdcfl.lr": 0.02, "emdcfl.batch-size": 16,
        "emdcfl.workers": 1, "seed": 0,
        # within-group W gaps measured |.| < 0.013, between-group 0.047-0.22 (4 runs)
        "emdcfl.epsilon": 0.03}


def planted_nodes(tmp_path):
    from fedclust.data.images import load_image_dataset

    x_all, y = load_image_dataset("digits", "", split="all")
    rng = np.random.default_rng(0)
    configs = []
    for client in range(4):
        group = client // 2
        idx = rng.permutation(len(y))[:400]
        tr, va, te = idx[:250], idx[250:350], idx[350:]
        x = 255 - x_all if group else x_all
        path = tmp_path / f"client{client}.npz"
        np.savez(path, x_train=x[tr], y_train=y[tr], x_val=x[va], y_val=y[va], x_test=x[te],
                 y_test=y[te], cluster=group)
        # the owner lets its node send evaluation statistics (evaluate=true runs below)
        configs.append({"data-path": str(path), "allow-evaluation": True})
    return configs


def _numbers(value) -> list[int | float]:
    """Scalars of a ConfigRecord/MetricRecord value (lists flattened)."""
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _numbers(v)]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return [value]
    return []


def _int_views(secret: bytes) -> set[int]:
    """Integers a secret could be sent as: whole, and every 4/8-byte word, both byte orders."""
    out = set()
    for order in ("big", "little"):
        out.add(int.from_bytes(secret, order))
        for width in (4, 8):
            for i in range(0, len(secret) - width + 1, width):
                word = int.from_bytes(secret[i:i + width], order)
                out |= {word, word - (1 << 8 * width) if word >> (8 * width - 1) else word}
    return out


def test_end_to_end_separates_two_planted_groups_and_never_leaks_the_pair_seed(tmp_path):
    seen: list[bytes] = []
    numbers: list[int | float] = []

    def inspect(instruction, reply):
        for msg in (instruction, reply):
            if msg.has_content():
                for rec in msg.content.values():
                    for v in rec.values():
                        if hasattr(v, "data"):
                            seen.append(bytes(v.data))
                        elif isinstance(v, (bytes, str)):
                            seen.append(v if isinstance(v, bytes) else v.encode())
                        else:                        # ints, floats, lists of Config/Metric
                            numbers.extend(_numbers(v))

    summary, grid = run_server({**TINY, "emdcfl.full-matrix": True,
                                "output-dir": str(tmp_path / "out")}, inspect=inspect,
                               node_configs=planted_nodes(tmp_path))
    tmp_path = tmp_path / "out"
    m = summary["metrics"]
    assert m["eval_ari"] == 1.0 and m["num_clusters"] == 2, m
    assert m["eval_acc_mean"] > 0.8
    assert m["bytes_sent"] > 0 and m["emd_s"] > 0 and 0 < m["emd_share_of_run"] < 1
    emd = np.load(tmp_path / "emd_matrix.npy")
    assert emd.shape == (4, 4) and np.isfinite(emd).all()
    assert (tmp_path / "emd_heatmap.png").stat().st_size > 1000
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert len(hist) == 2 and hist[0]["reclustered"]

    # Privacy: rebuild every pair's secret and seed from the clients' private keys and check
    # that no message to or from the server contains either (nor the private keys).
    from fedclust.emdcfl.privacy import pair_seed, shared_secret

    keys = {nid: ctx.state.config_records["emdcfl_keys"] for nid, ctx in grid.contexts.items()}
    blob = b"\x00".join(seen)
    nodes = sorted(keys)
    secrets = []
    for i, a in enumerate(nodes):
        assert bytes(keys[a]["private"]) not in blob
        assert bytes(keys[a]["public"]) in blob              # public keys are relayed
        for b in nodes[i + 1:]:
            s = shared_secret(bytes(keys[a]["private"]), bytes(keys[b]["public"]))
            assert s == shared_secret(bytes(keys[b]["private"]), bytes(keys[a]["public"]))
            secrets += [s, pair_seed(s, a, b)]
    for s in secrets:
        assert s not in blob and s[:16] not in blob and s[16:] not in blob
    # ... nor as numbers in ConfigRecord/MetricRecord values (ints, floats, lists)
    assert numbers, "no scalar values inspected"
    ints = {int(x) for x in numbers if float(x).is_integer()}
    for s in secrets:
        assert not ints & _int_views(s)

    # The pair projection R never reaches the server: not its float32 bytes (row- or
    # column-major), not one row or column, not as metric values.
    from fedclust.emdcfl.privacy import PairContext

    values = {float(x) for x in numbers}
    for i, a in enumerate(nodes):
        for b in nodes[i + 1:]:
            r = PairContext(bytes(keys[a]["private"]), a, b, bytes(keys[b]["public"]),
                            TINY["emdcfl.embed-dim"], 0.9).R
            assert r.shape == (32, 28)
            for part in (r, r.T.copy(), r[0], r[:, 0].copy(), r.astype(np.float64)):
                assert part.tobytes() not in blob
            assert not values & {float(x) for x in r[0]}


@pytest.mark.parametrize("override, key", [
    ({"emdcfl.epsilon": -0.1}, "emdcfl.epsilon"),
    ({"emdcfl.proj-ratio": 0.0}, "emdcfl.proj-ratio"),
    ({"emdcfl.proj-ratio": 1.2}, "emdcfl.proj-ratio"),
    ({"emdcfl.clients-per-round": 5}, "emdcfl.clients-per-round"),
    ({"dataset": "xclara"}, "dataset"),
    ({"emdcfl.algorithm": "oracle", "evaluate": False}, "emdcfl.algorithm"),
    ({"emdcfl.metric": "manhattan"}, "emdcfl.metric"),
    ({"emdcfl.clients-per-group": 2}, "emdcfl.clients-per-group"),     # 2 x 4 groups != 4
    ({"emdcfl.recluster": "sometimes"}, "emdcfl.recluster"),
    ({"emdcfl.backdoor-colours": "neon"}, "emdcfl.backdoor-colours"),
])
def test_bad_input_is_rejected_before_any_work(override, key, tmp_path):
    cfg = {**TINY, **override, "output-dir": str(tmp_path / "x")}
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    text = str(err.value)
    assert f"'{key}'" in text and "Allowed" in text and "Fix" in text
    with pytest.raises(ConfigError):
        run_server(cfg)
    assert not (tmp_path / "x").exists()


def test_clients_per_group_must_match_num_clients_times_groups():
    ok = validate({**TINY, "emdcfl.clients-per-group": 1})             # 1 x 4 rotations = 4
    assert ok["emdcfl.clients-per-group"] == 1
    validate({**TINY, "num-clients": 40, "emdcfl.clients-per-group": 10})
    validate({**TINY, "dataset": "backdoor-mnist", "num-clients": 30,
              "emdcfl.clients-per-group": 10})
    with pytest.raises(ConfigError, match="num-clients=30"):
        validate({**TINY, "dataset": "backdoor-mnist", "num-clients": 40,
                  "emdcfl.clients-per-group": 10})


@pytest.mark.parametrize("mode", ["on-join", "every-round"])
def test_recluster_modes_under_partial_participation(mode, tmp_path):
    cfg = {**TINY, "emdcfl.clients-per-round": 2, "emdcfl.rounds": 4, "emdcfl.samples": 60,
           "emdcfl.local-epochs": 1, "emdcfl.recluster": mode, "output-dir": str(tmp_path)}
    run_server(cfg)
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    from fedclust.emdcfl.cluster import Participation

    part, grew = Participation(list(range(4)), 2, TINY["seed"]), []
    for _ in range(4):            # the server samples positions with the same seed
        grew.append(part.sample()[1])
    assert grew[0] and not all(grew)        # the seed gives rounds without a new client
    assert [bool(h.get("reclustered")) for h in hist] == (
        grew if mode == "on-join" else [True] * 4)
    assert all(h["emd_s"] > 0 for h in hist if h.get("reclustered"))


def test_every_round_reclustering_keeps_the_models_of_unchanged_clusters(tmp_path):
    cfg = {**TINY, "emdcfl.recluster": "every-round", "output-dir": str(tmp_path / "out")}
    m = run_server(cfg, node_configs=planted_nodes(tmp_path))[0]["metrics"]
    hist = [json.loads(line)
            for line in (tmp_path / "out" / "history.jsonl").read_text().splitlines()]
    assert m["eval_ari"] == 1.0 and m["num_clusters"] == 2
    assert [h["reclustered"] for h in hist] == [True, True]
    assert hist[0]["kept_clusters"] == 0            # four singletons merged into two pairs
    assert hist[1]["kept_clusters"] == 2            # the same two pairs again: models kept


def test_partial_participation_keeps_unseen_clients_singletons(tmp_path):
    cfg = {**TINY, "emdcfl.clients-per-round": 2, "emdcfl.rounds": 2, "emdcfl.samples": 60,
           "emdcfl.local-epochs": 1, "output-dir": str(tmp_path)}
    summary, _ = run_server(cfg)
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert [h["participants"] for h in hist] == [2, 2]
    assert hist[0]["reclustered"]
    assert hist[0]["num_clusters"] >= 3               # 2 clustered + 2 unseen singletons
    assert summary["metrics"]["num_clusters"] >= 1


@pytest.mark.parametrize("algorithm", ["oracle", "fedavg", "local", "ifca", "cfl"])
def test_baselines_run_on_the_same_data_and_model(algorithm, tmp_path):
    cfg = {**TINY, "emdcfl.algorithm": algorithm, "emdcfl.local-epochs": 1,
           "emdcfl.rotation": "two", "emdcfl.samples": 60, "output-dir": str(tmp_path)}
    m = run_server(cfg)[0]["metrics"]
    assert 0.0 <= m["eval_acc_worst"] <= m["eval_acc_mean"] <= 1.0
    expected = {"oracle": 2, "fedavg": 1, "local": 4}
    if algorithm in expected:
        assert m["num_clusters"] == expected[algorithm]
    if algorithm == "oracle":
        assert m["eval_ari"] == 1.0
    if algorithm == "ifca":
        assert m["num_clusters"] <= 2                 # k = 2 ground-truth groups


def test_round0_epochs_train_round_zero_only(tmp_path, monkeypatch):
    from fedclust.emdcfl import model

    seen: list[int] = []
    real = model.train_local

    def spy(spec, weights, x, y, epochs, *args, **kwargs):
        seen.append(epochs)
        return real(spec, weights, x, y, epochs, *args, **kwargs)

    monkeypatch.setattr(model, "train_local", spy)
    cfg = {**TINY, "emdcfl.local-epochs": 1, "emdcfl.round0-epochs": 3, "emdcfl.rounds": 2,
           "emdcfl.rotation": "two", "emdcfl.samples": 60, "output-dir": str(tmp_path)}
    run_server(cfg)
    assert seen == [3] * 4 + [1] * 4                    # 4 clients, round 0 then round 1


def test_end_to_end_with_sinkhorn_separates_two_planted_groups(tmp_path):
    cfg = {**TINY, "emdcfl.solver": "sinkhorn", "emdcfl.sinkhorn-reg": 0.01,
           "emdcfl.full-matrix": True, "output-dir": str(tmp_path / "out")}
    m = run_server(cfg, node_configs=planted_nodes(tmp_path))[0]["metrics"]
    excess = np.load(tmp_path / "out" / "emd_excess.npy")
    assert m["eval_ari"] == 1.0 and m["num_clusters"] == 2, (m, excess)
    assert np.isfinite(excess).all() and m["emd_s"] > 0


def _fixed_keypairs(monkeypatch):
    """Each run's i-th key pair is the same (the nodes' keys are random otherwise)."""
    from itertools import count

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    from fedclust.emdcfl import privacy

    calls = count()

    def fixed() -> tuple[bytes, bytes]:
        private = bytes([next(calls) + 1]) * 32
        public = X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        return private, public

    monkeypatch.setattr(privacy, "generate_keypair", fixed)


def test_peer_batches_give_the_same_distances_in_smaller_messages(tmp_path, caplog,
                                                                  monkeypatch):
    """emdcfl.embed-batch=1: one peer model per message (4 exchanges); each pair's
    projection and subsample come from the pair seed, so with the same keys the EMD matrix
    equals that of one message with every peer. Messages above WARN_MESSAGE_MIB log the fix."""
    import logging

    from strategies import emdcfl as server

    runs = {}
    # 0.037 MiB per tiny model: 4 in one message (0.15 MiB) exceed the lowered limit, 2 do not
    monkeypatch.setattr(server, "WARN_MESSAGE_MIB", 0.1)
    logger = logging.getLogger("fedclust")
    logger.addHandler(caplog.handler)                       # it may not propagate to root
    try:
        for batch in (0, 1):
            _fixed_keypairs(monkeypatch)
            out = tmp_path / f"b{batch}"
            cfg = {**TINY, "emdcfl.rounds": 1, "emdcfl.local-epochs": 1,
                   "emdcfl.embed-batch": batch, "output-dir": str(out)}
            caplog.clear()
            m = run_server(cfg, node_configs=planted_nodes(tmp_path))[0]["metrics"]
            warned = [r.getMessage() for r in caplog.records
                      if "embedding messages" in r.getMessage()]
            hist = json.loads((out / "history.jsonl").read_text().splitlines()[0])
            runs[batch] = (np.load(out / "emd_matrix.npy"), m, hist, warned)
    finally:
        logger.removeHandler(caplog.handler)
    (w0, m0, h0, warned0), (w1, m1, h1, warned1) = runs[0], runs[1]
    np.testing.assert_allclose(w1, w0, rtol=1e-12)
    assert (h0["embed_messages"], h1["embed_messages"]) == (1, 4)
    # 4 models in one message (every member), against own + 1 peer
    assert h1["embed_message_mib"] == pytest.approx(h0["embed_message_mib"] * 2 / 4)
    assert warned0 and "emdcfl.embed-batch=" in warned0[0] and not warned1
    assert m1["clusters"] == m0["clusters"]


def _layout(rd) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Record name -> (kind, sorted keys) of a RecordDict."""
    out = {}
    for kind, records in (("arrays", rd.array_records), ("metrics", rd.metric_records),
                          ("config", rd.config_records)):
        for name, rec in records.items():
            out[name] = (kind, tuple(sorted(rec)))
    return out


def test_each_phase_carries_exactly_what_the_docs_say(tmp_path):
    """What leaves a client, per phase. The embedding phase sends, per peer, the projected
    train cloud (own model), the projected validation cloud under the peer's model and one
    scalar reference W(train, val) under its own model; never its own-model validation
    embeddings (the paper's privacy model: scalar references only)."""
    replies: dict[str, list] = {}
    asked: dict[str, list] = {}

    def inspect(instruction, reply):
        kind = instruction.metadata.message_type
        asked.setdefault(kind, []).append(_layout(instruction.content))
        if reply.has_content():
            replies.setdefault(kind, []).append((instruction.metadata.dst_node_id, reply.content))

    cfg = {**TINY, "emdcfl.rounds": 1, "emdcfl.local-epochs": 1, "emdcfl.max-samples": 64,
           "output-dir": str(tmp_path / "out")}
    run_server(cfg, inspect=inspect, node_configs=planted_nodes(tmp_path))
    # (query.fedclust_node: the engine's node question, the same for every method)
    assert set(replies) - {"query.fedclust_node"} == {"train.emdcfl_local", "query.emdcfl_embed",
                                                      "evaluate.emdcfl_eval"}
    layers = asked["train.emdcfl_local"][0]["model"][1]         # the model the server sent
    assert layers == tuple(sorted(str(i) for i in range(len(layers))))
    for _, rd in replies["train.emdcfl_local"]:
        assert _layout(rd) == {"model": ("arrays", layers), "pub": ("arrays", ("key",)),
                               "metrics": ("metrics", ("num-examples", "train-loss"))}
    nodes = sorted(n for n, _ in replies["query.emdcfl_embed"])
    proj = int(0.9 * TINY["emdcfl.embed-dim"])
    for nid, rd in replies["query.emdcfl_embed"]:
        peers = tuple(sorted(str(n) for n in nodes if n != nid))
        assert _layout(rd) == {"src": ("arrays", peers), "tgt": ("arrays", peers),
                               "reference": ("metrics", peers),
                               "metrics": ("metrics", ("num-pairs",))}
        for record in ("src", "tgt"):
            for arr in rd.array_records[record].values():
                assert arr.numpy().shape == (64, proj) and arr.numpy().dtype == np.float32
        for value in rd.metric_records["reference"].values():
            assert isinstance(value, float) and 0 <= value <= 2
    for _, rd in replies["evaluate.emdcfl_eval"]:
        assert _layout(rd) == {"metrics": ("metrics", ("cluster", "num-test", "set",
                                                       "test-acc", "test-loss"))}
    # what the server sends for the embedding phase: models and the peers' public keys
    for layout in asked["query.emdcfl_embed"]:
        assert layout.pop("peers") == ("arrays", ("ids", "pub"))
        other = {name: kind for name, (kind, _) in layout.items()
                 if not (name.startswith("m:") and kind == "arrays")}
        assert set(other.values()) <= {"config"}, other      # (the run config it carries)


def test_a_deployed_node_sends_evaluation_only_when_its_owner_allows_it(tmp_path):
    """evaluate=true asks for evaluation; a deployed node (own data-path) sends its test
    accuracy and ground-truth group only with node config allow-evaluation=true. Nodes 0 and 2
    do not allow it: their final replies carry num-test only, the others' the evaluation, and
    the eval_* metrics rest on the two that allowed it (eval_coverage says so)."""
    sent: dict[int, set[str]] = {}

    def inspect(instruction, reply):
        if instruction.metadata.message_type == "evaluate.emdcfl_eval" and reply.has_content():
            sent[instruction.metadata.dst_node_id] = set(reply.content["metrics"])

    nodes = planted_nodes(tmp_path)
    for i in (0, 2):
        nodes[i] = {"data-path": nodes[i]["data-path"]}          # allow-evaluation: default
    summary, _ = run_server({**TINY, "emdcfl.rounds": 1, "emdcfl.local-epochs": 1,
                             "output-dir": str(tmp_path / "out")}, inspect=inspect,
                            node_configs=nodes)
    m = summary["metrics"]
    assert sorted(sent) == [1000, 1001, 1002, 1003]
    assert sent[1000] == sent[1002] == {"num-test"}
    assert {"test-acc", "cluster"} <= sent[1001] and {"test-acc", "cluster"} <= sent[1003]
    assert m["eval_coverage"] == {"nodes": 2, "of_nodes": 4, "rows": 100}
    assert m["eval_truth"] == [-1, 0, -1, 1]
    acc = m["eval_acc_per_client"]          # NaN (null in summary.json): not evaluated
    assert all(a is None or a != a for a in (acc[0], acc[2])) and 0 <= acc[1] <= 1
    assert m["dropped_nodes"] == [] and "excluded_nodes" not in m


def test_oracle_needs_the_nodes_permission_for_their_ground_truth(tmp_path):
    """The Oracle baseline reads each node's ground-truth group: a deployed node without
    allow-evaluation=true refuses (an error reply, no group) and becomes a singleton."""
    nodes = planted_nodes(tmp_path)
    nodes[0] = {"data-path": nodes[0]["data-path"]}
    summary, _ = run_server({**TINY, "emdcfl.algorithm": "oracle", "emdcfl.rounds": 1,
                             "emdcfl.local-epochs": 1, "output-dir": str(tmp_path / "out")},
                            node_configs=nodes)
    assert summary["metrics"]["clusters"] == [2, 0, 1, 1]         # node 0: a singleton


def test_an_accuracy_from_no_test_rows_is_refused():
    """Probe: a final reply with num-test = 0 and test-acc = 1.0 was accepted (and averaged)."""
    from flwr.app import MetricRecord, RecordDict

    from strategies.wire.emdcfl import check_final

    def reply(**metrics):
        return RecordDict({"metrics": MetricRecord(metrics)})

    check = check_final(evaluate=True)
    assert check(reply(**{"num-test": 0, "test-acc": 1.0, "cluster": 0})) == (
        "evaluation metrics ['cluster', 'test-acc'] from no test rows (num-test = 0)")
    assert check(reply(**{"num-test": 5, "test-acc": 1.0, "cluster": 0})) is None
    assert check(reply(**{"num-test": 0})) is None       # no evaluation sent: nothing to check
