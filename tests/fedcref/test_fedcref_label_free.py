"""FedCRef on deployment-style nodes (node config ``data-path``, ``dataset="local"``), in-process:
the default start needs no labels, and label-derived statistics leave a node only when the run
asks for evaluation (``evaluate=true``) **and** the node allows it (node config
``allow-evaluation=true``; a simulated node always does).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from flwr.app import ArrayRecord, Context, Message, RecordDict

from client_apps.evaluation import allows_evaluation, is_simulated, node_allows_evaluation
from client_apps.fedcref_handlers import _data, start_kind
from fedclust.config import ConfigError, validate
from tests.fake_grid import run_server

# eq. (2), loose enough on 30-sample digit clusters that communities form (the default test
# abstains there) and every phase, refinement with its confirmation bits included, is seen
CFG = {"method": "fedcref", "dataset": "digits", "num-clients": 3, "seed": 0,
       "fedcref.assoc-rule": "eq2",
       "fedcref.split": "all", "fedcref.fl-rounds": 2, "fedcref.fl-local-epochs": 1,
       "fedcref.batch-size": 16, "fedcref.ae-epochs": 3, "fedcref.ae-patience": 0,
       "fedcref.max-iterations": 2, "fedcref.k-max": 3, "fedcref.samples-per-cluster": 30,
       "fedcref.k-estimate-max": 4, "plots": False}
# what a FedCRef reply may carry besides the evaluation record "eval"
ALGORITHM_RECORDS = {"models", "clusters", "accept", "counts", "confirmed"}


def _ctx(node_config: dict, cfg: dict) -> Context:
    return Context(run_id=1, node_id=1, node_config=node_config, state=RecordDict(),
                   run_config=cfg)


def _write_nodes(directory: Path, with_y: bool, **extra: object) -> list[dict]:
    """The simulated clients of CFG written out as one .npz per node (x, and y if asked)."""
    full = validate(CFG)
    nodes = []
    for i in range(CFG["num-clients"]):
        ctx = _ctx({"partition-id": i, "num-partitions": CFG["num-clients"]}, CFG)
        x, y, _ = _data(ctx, {**full, "evaluate": True})
        path = directory / f"c{i}.npz"
        np.savez(path, **({"x": x, "y": y} if with_y else {"x": x}))
        nodes.append({"data-path": str(path), **extra})
    return nodes


class Replies:
    """``inspect`` of the in-process grid: record names of every reply, by message type."""

    def __init__(self) -> None:
        self.records: list[tuple[str, set[str], dict]] = []   # (type, arrays, metrics)

    def __call__(self, msg: Message, rep: Message) -> None:
        assert rep.has_content(), rep.error
        arrays = {k for k, v in rep.content.items() if isinstance(v, ArrayRecord)}
        metrics = {m: v for rec in rep.content.metric_records.values() for m, v in rec.items()}
        self.records.append((msg.metadata.message_type, arrays, metrics))

    def with_eval(self) -> list[str]:
        return [t for t, arrays, metrics in self.records
                if "eval" in arrays or any(m.startswith("eval") for m in metrics)]


@pytest.mark.parametrize("evaluate", [True, False])
def test_default_start_on_deployed_nodes_needs_no_labels(tmp_path: Path, evaluate: bool) -> None:
    nodes = _write_nodes(tmp_path, with_y=False)          # x only, no num-clusters
    seen = Replies()
    summary, _ = run_server({**CFG, "dataset": "local", "evaluate": evaluate,
                             "output-dir": str(tmp_path / "run")},
                            node_configs=nodes, inspect=seen)
    met = summary["metrics"]
    assert met["dropped_nodes"] == [] and met["iterations"] >= 1
    assert met["isolated_start"] > 0
    assert seen.with_eval() == []
    assert all(arrays <= ALGORITHM_RECORDS for _, arrays, _ in seen.records)
    if evaluate:    # asked for, but no node could send any
        assert met["eval_nodes"] == 0 and met["eval_acc_end"] is None
    # every node estimated its K_i (silhouette over 2..k-estimate-max) from its own rows
    ks = [int(m["k"]) for t, _, m in seen.records if t == "train.fedcref_local"]
    assert len(ks) == met["iterations"] * CFG["num-clients"]
    assert all(2 <= k <= CFG["fedcref.k-estimate-max"] for k in ks), ks
    for i in range(CFG["num-clients"]):
        folder = tmp_path / "fedclust-results" / f"c{i}.npz" / "1"
        assert (folder / "assignments.csv").is_file() and (folder / "result.json").is_file()


def test_default_start_on_a_deployed_node_is_kmeans_with_its_num_clusters(
        tmp_path: Path) -> None:
    from client_apps.fedcref_handlers import _init_state

    nodes = _write_nodes(tmp_path, with_y=False, **{"num-clusters": 3})
    cfg = validate({**CFG, "dataset": "local"})
    ctx = _ctx(nodes[0], cfg)
    assert start_kind(ctx, cfg) == "kmeans"
    x, y, k = _data(ctx, cfg)
    assert y is None and k == 3
    st = _init_state(ctx, cfg, x, y, k, seed=0)
    assert st.k == 3 and set(np.unique(st.labels)) == {0, 1, 2}


def test_default_start_of_simulated_nodes_is_still_the_dirty_split(tmp_path: Path) -> None:
    cfg = validate(CFG)
    assert start_kind(_ctx({"partition-id": 0, "num-partitions": 3}, cfg), cfg) == "dirty"
    files = validate({**CFG, "dataset": "files", "data-dir": str(tmp_path)})
    assert start_kind(_ctx({"partition-id": 0, "num-partitions": 3, "data-path": "x.npz"},
                           files), files) == "dirty"
    default, _ = run_server({**CFG, "output-dir": str(tmp_path / "a")})
    dirty, _ = run_server({**CFG, "fedcref.init": "dirty", "output-dir": str(tmp_path / "b")})
    a, b = default["metrics"], dirty["metrics"]
    for key in ("isolated_start", "isolated_end", "communities", "eval_acc_start",
                "eval_acc_end", "bytes_sent", "bytes_received", "eval_nodes"):
        assert a[key] == b[key], key
    assert a["eval_nodes"] == CFG["num-clients"]


@pytest.mark.parametrize(("allow", "evaluate", "sends"), [
    (None, True, False),            # default on a deployed node: not allowed
    (False, True, False),
    (True, False, False),           # the run did not ask
    (True, True, True),
], ids=["default", "refused", "not-asked", "allowed"])
def test_label_statistics_leave_a_deployed_node_only_when_asked_and_allowed(
        tmp_path: Path, allow: bool | None, evaluate: bool, sends: bool) -> None:
    extra = {} if allow is None else {"allow-evaluation": allow}
    nodes = _write_nodes(tmp_path, with_y=True, **extra)       # the files do hold labels
    seen = Replies()
    summary, _ = run_server({**CFG, "dataset": "local", "evaluate": evaluate,
                             "output-dir": str(tmp_path / "run")},
                            node_configs=nodes, inspect=seen)
    met = summary["metrics"]
    assert met["dropped_nodes"] == []
    assert all(arrays <= ALGORITHM_RECORDS | {"eval"} for _, arrays, _ in seen.records)
    with_eval = seen.with_eval()
    if sends:
        # every local and refinement reply carries the per-cluster class histograms
        expected = [t for t, _, _ in seen.records
                    if t in ("train.fedcref_local", "train.fedcref_refine")]
        assert with_eval == expected and len(expected) >= 2 * CFG["num-clients"]
        assert met["eval_nodes"] == CFG["num-clients"]
        assert 0.0 <= met["eval_acc_start"] <= 1.0 and 0.0 <= met["eval_acc_end"] <= 1.0
    else:
        assert with_eval == []
        assert all(not k.startswith("eval") or met[k] in (None, 0) or np.isnan(met[k])
                   for k in met), {k: met[k] for k in met if k.startswith("eval")}
    # the permission changes what is reported, never the clustering (label-free start)
    ref, _ = run_server({**CFG, "dataset": "local", "evaluate": False,
                         "output-dir": str(tmp_path / "ref")},
                        node_configs=_write_nodes(tmp_path, with_y=False))
    for key in ("isolated_start", "isolated_end", "communities", "iterations", "stop_reason"):
        assert met[key] == ref["metrics"][key], key


def test_perfect_association_needs_every_nodes_permission(tmp_path: Path) -> None:
    nodes = _write_nodes(tmp_path, with_y=True)
    with pytest.raises(Exception, match=r"association='perfect'.*allow-evaluation=true"):
        run_server({**CFG, "dataset": "local", "fedcref.association": "perfect",
                    "output-dir": str(tmp_path / "run")}, node_configs=nodes)


def test_allows_evaluation_rules() -> None:
    cfg = validate(CFG)
    no = {**cfg, "evaluate": False}
    sim = {"partition-id": 1, "num-partitions": 3}
    dep = {"data-path": "/data/c.npz"}
    assert is_simulated(sim, cfg) and not is_simulated(dep, cfg)
    # a node with its own data-path is deployed, whatever else it says ...
    assert not is_simulated({**dep, "partition-id": 0}, cfg)
    # ... except under dataset=files, where the engine hands simulated clients the site files
    assert is_simulated({**dep, "partition-id": 0}, {**cfg, "dataset": "files"})
    assert allows_evaluation(_ctx(sim, cfg), cfg)
    assert not allows_evaluation(_ctx(sim, no), no)
    assert not allows_evaluation(_ctx(dep, cfg), cfg)
    assert not allows_evaluation(_ctx({**dep, "partition-id": 0}, cfg), cfg)
    for value in (True, "true", "True", 1, "1"):
        assert allows_evaluation(_ctx({**dep, "allow-evaluation": value}, cfg), cfg), value
        assert not allows_evaluation(_ctx({**dep, "allow-evaluation": value}, no), no)
    for value in (False, "false", 0, "0"):
        assert not node_allows_evaluation({**dep, "allow-evaluation": value}, cfg)
    for value in ("yes please", 2, 0.5):
        with pytest.raises(ConfigError, match="node config 'allow-evaluation'.*Allowed: true"):
            node_allows_evaluation({**dep, "allow-evaluation": value}, cfg)
