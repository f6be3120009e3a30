"""EMD-CFL simulation is reproducible: the same seed gives the same run.

Sources of run-to-run randomness in a simulated EMD-CFL run, and what fixes each:

- X25519 key pairs (→ pair seeds → projections ``R`` and subsamples): derived from the run
  seed and the partition id on simulated nodes (``partition-id``, no ``data-path``); deployed
  nodes keep fresh OS keys.
- Flower's simulated node ids (random in every run): pair seeds of simulated nodes name public
  keys (``key_id``), and the minibatch-order seed uses the partition id, not the node id.
- Initial model, data splits and shuffles, minibatch order: drawn from the run seed.
- Torch threads: one on the CPU; deterministic cuDNN for simulated nodes on a GPU.
"""

import numpy as np
from flwr.app import Context, RecordDict

from fedclust.emdcfl.privacy import (
    PairContext,
    generate_keypair,
    is_simulated,
    key_id,
    node_keypair,
    simulated_keypair,
)

CFG = {"method": "emdcfl", "dataset": "rotdigits", "num-clients": 4, "emdcfl.rotation": "two",
       "emdcfl.rounds": 2, "emdcfl.local-epochs": 3, "emdcfl.conv1": 8, "emdcfl.conv2": 16,
       "emdcfl.embed-dim": 32, "emdcfl.lr": 0.02, "emdcfl.batch-size": 16,
       "emdcfl.samples": 120, "emdcfl.max-samples": 64, "emdcfl.workers": 1, "seed": 3,
       "emdcfl.epsilon": 0.03, "emdcfl.full-matrix": True}


def _run(cfg, out, node_ids=None):
    """One in-process run; ``node_ids`` replaces the grid's node ids (Flower's simulation draws
    new random ones in every run)."""
    if node_ids is None:
        from server_app.inprocess import run_server

        summary, grid = run_server({**cfg, "output-dir": str(out)}, num_nodes=4)
    else:
        from client_apps.app import app as client_app
        from server_app.app import run_method
        from server_app.inprocess import InProcessGrid

        run_cfg = {**cfg, "output-dir": str(out)}
        grid = InProcessGrid(client_app, len(node_ids), run_cfg)
        grid.contexts = {nid: Context(run_id=1, node_id=nid, node_config=ctx.node_config,
                                      state=RecordDict(), run_config=dict(ctx.run_config))
                         for nid, ctx in zip(node_ids, grid.contexts.values())}
        summary = run_method(grid, run_cfg)
    publics = [bytes(ctx.state.config_records["emdcfl_keys"]["public"])
               for ctx in grid.contexts.values()]
    return summary["metrics"], np.load(out / "emd_matrix.npy"), publics


def test_same_seed_same_run_different_seed_different_keys(tmp_path):
    m1, e1, k1 = _run(CFG, tmp_path / "a")
    m2, e2, k2 = _run(CFG, tmp_path / "b")
    assert e1.shape == (4, 4) and np.isfinite(e1).all()
    np.testing.assert_array_equal(e1, e2)
    assert m1["clusters"] == m2["clusters"] and m1["num_clusters"] == m2["num_clusters"]
    assert m1["eval_ari"] == m2["eval_ari"]
    assert m1["eval_acc_mean"] == m2["eval_acc_mean"]
    assert m1["eval_acc_per_client"] == m2["eval_acc_per_client"]
    assert k1 == k2 and len(set(k1)) == 4                  # same keys, one per partition
    assert k1 == [simulated_keypair(CFG["seed"], p)[1] for p in range(4)]

    # other (random, as in Flower's simulation) node ids: the same run still
    m3, e3, k3 = _run(CFG, tmp_path / "c",
                      node_ids=[5_000_000_000_017 + 7919 * i for i in range(4)])
    np.testing.assert_array_equal(e1, e3)
    assert m3["clusters"] == m1["clusters"] and m3["eval_acc_mean"] == m1["eval_acc_mean"]
    assert k3 == k1

    # a different seed: different key material (and a different run)
    m4, e4, k4 = _run({**CFG, "seed": CFG["seed"] + 1}, tmp_path / "d")
    assert not set(k4) & set(k1)
    assert not np.array_equal(e4, e1)


def test_simulated_keys_follow_seed_and_partition():
    sim = {"partition-id": 2, "num-partitions": 4}
    assert is_simulated(sim)
    assert node_keypair(sim, 7) == node_keypair(sim, 7) == simulated_keypair(7, 2)
    assert node_keypair(sim, 7) != node_keypair(sim, 8)
    assert node_keypair(sim, 7) != node_keypair({**sim, "partition-id": 1}, 7)
    # a valid X25519 pair: both members of a pair agree on the projection
    a, b = simulated_keypair(7, 0), simulated_keypair(7, 1)
    ra = PairContext(a[0], key_id(a[1]), key_id(b[1]), b[1], 16, 0.5).R
    rb = PairContext(b[0], key_id(b[1]), key_id(a[1]), a[1], 16, 0.5).R
    np.testing.assert_array_equal(ra, rb)


def test_deployed_node_gets_fresh_os_keys(tmp_path):
    from client_apps.emdcfl_handlers import KEY_STATE, _ensure_keys

    deployed = {"data-path": str(tmp_path / "client0.npz")}
    assert not is_simulated(deployed)
    assert node_keypair(deployed, 0) != node_keypair(deployed, 0)
    # data-path wins over partition-id: such a node reads its own data and keeps OS keys
    both = {**deployed, "partition-id": 0, "num-partitions": 4}
    assert not is_simulated(both) and node_keypair(both, 0) != node_keypair(both, 0)
    assert len(generate_keypair()[1]) == 32

    def fresh(node_config):
        ctx = Context(run_id=1, node_id=1000, node_config=node_config, state=RecordDict(),
                      run_config={})
        return _ensure_keys(ctx, {"seed": 0}), ctx

    pub1, ctx1 = fresh(deployed)
    pub2, _ = fresh(deployed)
    assert pub1 != pub2
    assert _ensure_keys(ctx1, {"seed": 0}) == pub1          # one pair per node and run
    assert bytes(ctx1.state.config_records[KEY_STATE]["public"]) == pub1
    sim = {"partition-id": 0, "num-partitions": 4}
    assert fresh(sim)[0] == fresh(sim)[0] == simulated_keypair(0, 0)[1]


def test_train_seed_uses_partition_not_node_id_in_simulation():
    from client_apps.emdcfl_handlers import _train_seed

    def ctx(node_id, node_config):
        return Context(run_id=1, node_id=node_id, node_config=node_config, state=RecordDict(),
                       run_config={})

    sim = {"partition-id": 1, "num-partitions": 4}
    cfg = {"seed": 0}
    assert _train_seed(cfg, ctx(11, sim), 0) == _train_seed(cfg, ctx(987654321, sim), 0)
    assert _train_seed(cfg, ctx(11, sim), 0) != _train_seed(cfg, ctx(11, sim), 1)
    assert (_train_seed(cfg, ctx(11, sim), 0)
            != _train_seed(cfg, ctx(11, {**sim, "partition-id": 2}), 0))
    dep = {"data-path": "x.npz"}
    assert _train_seed(cfg, ctx(11, dep), 0) != _train_seed(cfg, ctx(12, dep), 0)
