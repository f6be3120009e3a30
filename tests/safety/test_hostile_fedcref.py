"""One hostile or broken FedCRef node: every reply field of every phase corrupted in eight ways
(tests/hostile.py); each case is excluded with a warning that names the node and the run goes
on with the others, or the value is one a server cannot tell from an honest one (listed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server_app.app import run_method
from server_app.inprocess import InProcessGrid
from tests.fedcref.test_fedcref_e2e import FAST, planted
from tests.hostile import BAD, KINDS, Hostile

FIELDS = [
    ("train.fedcref_local", "metrics", "k"), ("train.fedcref_local", "metrics", "n"),
    ("train.fedcref_local", "metrics", "key"), ("train.fedcref_local", "metrics", "version"),
    ("train.fedcref_local", "clusters", "clusters"), ("train.fedcref_local", "models", "W0"),
    ("train.fedcref_local", "models", "b2"), ("train.fedcref_local", "eval", "hist"),
    ("query.fedcref_assoc", "accept", "accept"),
    ("train.fedcref_comm", "models", "W1"), ("train.fedcref_comm", "counts", "counts"),
    ("train.fedcref_refine", "metrics", "agreement"), ("train.fedcref_refine", "eval", "hist"),
]
# values a server cannot tell from honest ones, with the reason
PLAUSIBLE = {
    ("metrics.n", "x1e6"): "a node may hold a million times more rows; only what it sends "
                           "about them is bounded by the count it declares",
    ("metrics.version", "x1e6"): "a model version is any number that changes on retraining",
}
PHASE = {"train.fedcref_local": "local-", "query.fedcref_assoc": "assoc-",
         "train.fedcref_comm": "comm-", "train.fedcref_refine": "refine-"}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return planted(tmp_path_factory.mktemp("planted"))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("message_type", "record", "key"), FIELDS,
                         ids=[f"{m.split('.')[1]}-{r}.{k}" for m, r, k in FIELDS])
def test_hostile_fedcref_node_is_excluded_or_plausible(root: Path, tmp_path: Path, fedclust_log,
                                                       message_type, record, key, kind):
    cfg = {"method": "fedcref", "dataset": "mnist", "data-dir": str(root), "num-clients": 5,
           "seed": 1, "fedcref.dirtiness": 0.2, **FAST, "fedcref.max-iterations": 1,
           "fedcref.fl-rounds": 2, "output-dir": str(tmp_path)}
    app = Hostile(message_type, record, key, kind)
    summary = run_method(InProcessGrid(app, 5, cfg), dict(cfg))      # never raises
    assert app.hits >= 1, "the corrupted field is not in the node's reply"
    mine = [e for e in summary["excluded_nodes"] if e["node"] == BAD]
    assert all(e["node"] == BAD for e in summary["excluded_nodes"]), summary["excluded_nodes"]
    if not app.changed or (f"{record}.{key}", kind) in PLAUSIBLE:
        assert not mine, mine
        return
    assert mine, f"node {BAD}'s corrupted {record}.{key} ({kind}) was accepted"
    assert mine[0]["phase"].startswith(PHASE[message_type]), mine[0]
    assert mine[0].get("client", "").startswith("client") or message_type.endswith("local")
    assert any(f"node {BAD}" in m and "rejected reply" in m for m in fedclust_log)
    assert summary["metrics"]["iterations"] == 1


# int8-delta (the default wire format): the compressed streams, their lengths, the bases they
# name and the bases' digests, in both directions that carry them, and the node's answer to
# the initialisation check
DELTA_FIELDS = [
    ("train.fedcref_local", "models", "z"), ("train.fedcref_local", "models", "zn"),
    ("train.fedcref_local", "models", "base"), ("train.fedcref_local", "models", "digest"),
    ("train.fedcref_local", "metrics", "init-ok"),
    ("train.fedcref_comm", "models", "z"), ("train.fedcref_comm", "models", "base"),
]
# the kinds that reach different checks of these arrays (the other kinds, and damaged
# layouts, are the unit tests' of fedclust.fedcref.wire)
DELTA_KINDS = ("nan", "x1e6", "negative", "empty")
DELTA_PLAUSIBLE = {
    ("metrics.init-ok", "empty"): "a node that does not say it rebuilds the initialisations "
                                  "is sent its models without them (more bytes, same weights)",
}


@pytest.mark.parametrize("kind", DELTA_KINDS)
@pytest.mark.parametrize(("message_type", "record", "key"), DELTA_FIELDS,
                         ids=[f"{m.split('.')[1]}-{r}.{k}" for m, r, k in DELTA_FIELDS])
def test_hostile_int8_delta_fields_are_excluded_or_plausible(root: Path, tmp_path: Path,
                                                             message_type, record, key, kind):
    cfg = {"method": "fedcref", "dataset": "mnist", "data-dir": str(root), "num-clients": 5,
           "seed": 1, "fedcref.dirtiness": 0.2, **FAST, "fedcref.wire": "int8-delta",
           "fedcref.max-iterations": 1, "fedcref.fl-rounds": 2, "output-dir": str(tmp_path)}
    app = Hostile(message_type, record, key, kind)
    summary = run_method(InProcessGrid(app, 5, cfg), dict(cfg))      # never raises
    assert app.hits >= 1, "the corrupted field is not in the node's reply"
    mine = [e for e in summary["excluded_nodes"] if e["node"] == BAD]
    assert all(e["node"] == BAD for e in summary["excluded_nodes"]), summary["excluded_nodes"]
    if not app.changed or (f"{record}.{key}", kind) in DELTA_PLAUSIBLE:
        assert not mine, mine
        return
    assert mine, f"node {BAD}'s corrupted {record}.{key} ({kind}) was accepted"
    assert mine[0]["phase"].startswith(PHASE[message_type]), mine[0]
    assert summary["metrics"]["iterations"] == 1
