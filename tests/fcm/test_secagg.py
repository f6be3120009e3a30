"""Exact federated FCM with Flower's SecAgg+ (``fcm.secure-aggregation=true``).

- Every phase's replies carry exactly the listed records (no per-client sums, objective or
  evaluation table; the final objective and contingency table are SecAgg+ sums too).

- The limb encoding round-trips through Flower's own quantizer exactly enough.
- Secure and plain runs give the same centers (within the quantization error, which the limb
  encoding pushes below float64 round-off; we assert 1e-9).
- The server never sees a per-client sum: every reply under SecAgg+ carries no plain arrays,
  and the masked vectors a client uploads are not its quantized sums.
- A client that drops out during the protocol is named, and the round still sums the others.
- One real run on the Deployment Engine (3 SuperNodes on loopback).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.common.secure_aggregation.quantization import dequantize, quantize
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage

from fedclust.fcm.secagg import CLIP, QUANT, pack, scale_for, unpack
from tests.fake_grid import run_server

CFG = {"method": "exact-fcm", "num-clients": 4, "seed": 3, "fcm.max-rounds": 3,
       "fcm.epsilon": 0.0, "plots": False}


def test_limb_encoding_survives_flower_quantization():
    rng = np.random.default_rng(0)
    c, f, n = 4, 3, 5
    us = [rng.random(c) * 10 ** rng.integers(0, 6) for _ in range(n)]
    wss = [rng.standard_normal((c, f)) * 10 ** rng.integers(0, 6) for _ in range(n)]
    scale = scale_for(3.0)
    q = [quantize([pack(u, ws, scale)], CLIP, QUANT)[0].astype(np.int64) for u, ws in
         zip(us, wss, strict=True)]
    summed = dequantize([sum(q)], CLIP, QUANT)[0] - (n - 1) * CLIP
    u, ws = unpack(summed, c, f, scale)
    np.testing.assert_allclose(u, np.sum(us, axis=0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(ws, np.sum(wss, axis=0), rtol=1e-12, atol=1e-9)


def test_secure_centers_match_plain_and_server_sees_only_masked_vectors(tmp_path):
    plain, _ = run_server({**CFG, "output-dir": str(tmp_path / "plain")})
    replies = []
    secure, grid = run_server({**CFG, "output-dir": str(tmp_path / "secure"),
                               "fcm.secure-aggregation": True},
                              inspect=lambda ins, rep: replies.append((ins, rep)))
    np.testing.assert_allclose(np.load(tmp_path / "secure" / "centers.npy"),
                               np.load(tmp_path / "plain" / "centers.npy"), atol=1e-9, rtol=0)
    assert secure["metrics"]["objective"] == pytest.approx(plain["metrics"]["objective"],
                                                           rel=1e-9)
    types = {rep.metadata.message_type for _, rep in replies}
    assert "query.fcm_sums" not in types and "train" in types
    masked = []
    for ins, rep in replies:
        if rep.metadata.message_type != "train":
            continue
        assert rep.metadata.src_node_id == ins.metadata.dst_node_id
        # secaggplus_mod cleared the plain FitRes arrays; only the protocol record remains
        assert all(len(rec) == 0 for rec in rep.content.array_records.values())
        cfg = rep.content.config_records[RECORD_KEY_CONFIGS]
        if Key.MASKED_PARAMETERS in cfg:
            masked.append((ins.metadata.dst_node_id, cfg[Key.MASKED_PARAMETERS]))
    assert len(masked) == 4 * (3 + 1)    # 4 clients x (3 sum rounds + the final phase)
    # A masked upload is uniform-looking noise mod 2^32, not the client's quantized limbs:
    # its values spread over the whole modulus range.
    for _, blobs in masked:
        from flwr.common import bytes_to_ndarray

        vec = np.concatenate([bytes_to_ndarray(b).ravel() for b in blobs]).astype(np.float64)
        assert vec.max() > 2 ** 31 and np.unique(vec).size > vec.size // 2
    history = [json.loads(x) for x in (tmp_path / "secure" / "history.jsonl").read_text()
               .splitlines()]
    assert [h["contributed"] for h in history] == [4, 4, 4]


def test_secure_round_survives_a_dropout_and_names_it(tmp_path):
    """Node 1003 answers the SecAgg+ set-up of round 2 but not its masked-vector stage."""
    def drop(nid, msg):
        if msg.metadata.message_type != "train" or msg.metadata.group_id != "2":
            return False
        cfg = msg.content.config_records.get(RECORD_KEY_CONFIGS, {})
        return nid == 1003 and cfg.get(Key.STAGE) in (Stage.COLLECT_MASKED_VECTORS, Stage.UNMASK)

    summary, _ = run_server({**CFG, "num-clients": 5, "output-dir": str(tmp_path),
                             "fcm.secure-aggregation": True}, drop=drop)
    history = [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]
    assert history[0]["contributed"] == 5
    assert history[1]["contributed"] == 4 and "1003" in history[1]["dropped_nodes"]
    assert history[2]["contributed"] == 5
    assert 1003 in summary["metrics"]["dropped_nodes"]


# What a client's reply may carry in each phase of a secure run (evaluate=true, min-max scaling):
# record name -> (record type, exact keys). The SecAgg+ stage is recognised by its reply keys.
SECURE_REPLY_LAYOUTS = {
    "query.fedclust_node": [   # up to 3 nodes say what the engine gave them (num-partitions)
        {"metrics": ("MetricRecord", {"num-partitions"})}],
    "query.fcm_stats": [   # federated scaling (plain by design; see docs/deployment.md)
        {"stats": ("ArrayRecord", {"min", "max"}),
         "eval": ("ArrayRecord", {"codes"}),     # the node's label codes: evaluation path only
         "metrics": ("MetricRecord", set())}],
    "train": [             # SecAgg+ stages, for the FCM rounds and the final phase alike
        {"secaggplus_configs": ("ConfigRecord", {"pk1", "pk2"})},            # setup
        {"secaggplus_configs": ("ConfigRecord", {"ctxts", "dsts"})},         # share keys
        {"secaggplus_configs": ("ConfigRecord", {"masked_params"}),          # masked vector
         "fitres.parameters": ("ArrayRecord", set()),      # cleared by secaggplus_mod
         "fitres.num_examples": ("MetricRecord", {"num_examples"}),           # always 1
         "fitres.metrics": ("ConfigRecord", set()),
         "fitres.status": ("ConfigRecord", {"code", "message"})},
        {"secaggplus_configs": ("ConfigRecord", {"nids", "shares"})},        # unmask
    ],
}


def _layout(content) -> dict[str, tuple[str, set[str]]]:
    return {name: (type(rec).__name__, set(rec.keys())) for name, rec in content.items()}


def test_every_secure_phase_carries_only_the_listed_records(tmp_path):
    """No per-client U, WS, J or contingency table reaches the server in a secure run; the
    objective and the evaluation ARI still equal the plain run's (they are SecAgg+ sums)."""
    cfg = {**CFG, "num-clients": 3, "evaluate": True}
    plain, _ = run_server({**cfg, "output-dir": str(tmp_path / "plain")})
    replies = []
    secure, _ = run_server({**cfg, "output-dir": str(tmp_path / "secure"),
                            "fcm.secure-aggregation": True},
                           inspect=lambda ins, rep: replies.append(rep))
    assert replies
    counts: dict[str, int] = {}
    for rep in replies:
        kind = rep.metadata.message_type
        assert kind in SECURE_REPLY_LAYOUTS, f"a secure run must not use {kind!r}"
        layout = _layout(rep.content)
        assert layout in SECURE_REPLY_LAYOUTS[kind], f"{kind} reply carries {layout}"
        if "fitres.num_examples" in layout:
            assert rep.content["fitres.num_examples"]["num_examples"] == 1   # N not revealed
            assert rep.content["fitres.status"]["code"] == 0
        counts[kind] = counts.get(kind, 0) + 1
    assert counts == {"query.fedclust_node": 3, "query.fcm_stats": 3,
                      "train": 3 * 4 * (3 + 1)}   # 3 rounds + final
    assert secure["metrics"]["objective"] == pytest.approx(plain["metrics"]["objective"],
                                                           rel=1e-9)
    assert secure["metrics"]["eval_ari"] == plain["metrics"]["eval_ari"]
    assert not np.isnan(secure["metrics"]["eval_ari"])


def test_secure_final_sums_objective_and_tables_exactly():
    """The final-phase encoding: ΣJ and Σ contingency survive Flower's quantizer (counts exact)."""
    from fedclust.fcm.secagg import pack_final, unpack_final
    from strategies.fcm.secure import final_scales

    rng = np.random.default_rng(1)
    s_j, s_t = final_scales(5, 1.0)   # min-max scaled rows: max|x| <= 1
    js = rng.random(7) * 5 * 4000                   # J <= N F for min-max data
    tables = [rng.integers(0, 5000, size=(3, 4)) for _ in js]
    q = [quantize([pack_final(j, t, s_j, s_t)], CLIP, QUANT)[0].astype(np.int64)
         for j, t in zip(js, tables, strict=True)]
    summed = dequantize([sum(q)], CLIP, QUANT)[0] - (len(js) - 1) * CLIP
    j, table = unpack_final(summed, 3, 4, s_j, s_t)
    assert j == pytest.approx(js.sum(), rel=1e-12)
    assert table.tolist() == np.sum(tables, axis=0).tolist()


@pytest.mark.parametrize("scaling", ["standard", "none"])
def test_secure_sums_fit_any_scaling_without_clipping(tmp_path, scaling):
    """The public divisor follows the federated bounds, so values far outside [0, 1] (here a
    feature near 1e12 with scaling=none) are summed exactly as in the plain run."""
    from tests.data.test_practitioner import write_sites

    paths = write_sites(tmp_path / "sites", sizes=(40, 50, 60))
    for p in paths:   # make the first feature huge
        lines = p.read_text().splitlines()
        rows = [lines[0]] + [",".join([str(float(r.split(",")[0]) * 1e10)] + r.split(",")[1:])
                             for r in lines[1:]]
        p.write_text("\n".join(rows) + "\n")
    cfg = {"dataset": "files", "data-dir": str(tmp_path / "sites"), "fcm.n-clusters": 2,
           "files.label-column": "diagnosis", "scaling": scaling, "fcm.max-rounds": 4,
           "fcm.epsilon": 0.0, "plots": False, "seed": 1}
    plain, _ = run_server({**cfg, "output-dir": str(tmp_path / "plain")})
    secure, _ = run_server({**cfg, "output-dir": str(tmp_path / "secure"),
                            "fcm.secure-aggregation": True})
    a, b = (np.load(tmp_path / d / "centers.npy") for d in ("plain", "secure"))
    np.testing.assert_allclose(b, a, rtol=1e-9, atol=1e-9 * np.abs(a).max())
    assert secure["metrics"]["objective"] == pytest.approx(plain["metrics"]["objective"],
                                                           rel=1e-9)


def test_fewer_than_two_clients_per_secure_round_is_refused_before_any_round(tmp_path):
    from fedclust.config import ConfigError

    sent = []
    with pytest.raises(ConfigError, match="SecAgg\\+ needs at least 2"):
        run_server({**CFG, "fcm.secure-aggregation": True, "fcm.fraction": 0.25,
                    "output-dir": str(tmp_path / "run")},
                   inspect=lambda msg, rep: sent.append(msg.metadata.message_type))
    assert "train" not in sent and "query.fcm_sums" not in sent
