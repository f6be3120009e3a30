"""FedCRef's Flower-free loop (fedclust.fedcref.algorithm): the same trajectory as before it was
taken out of the strategy, the same trajectory over Flower messages and over direct calls, and
tests that fail on a wrong algorithm (one-way edges, unweighted FedAvg, a member's model in
place of the aggregate, a plain argmin in place of Algorithm 2, evaluation steering the run)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from fedclust.config import validate
from fedclust.fedcref import algorithm
from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref import client as core
from fedclust.fedcref.inmemory import InMemoryClients
from fedclust.fedcref.keys import ClientSettings
from tests.fake_grid import run_server
from tests.fedcref.test_fedcref_e2e import FAST, planted

# A small fixed run: the planted system of test_fedcref_e2e, 3 iterations at most.
FIXED = {"method": "fedcref", "dataset": "mnist", "num-clients": 5, "seed": 1,
         "fedcref.dirtiness": 0.2, **FAST, "fedcref.max-iterations": 3}

# Recorded with the strategy before the loop moved to fedclust/fedcref/algorithm.py (the
# one-function server loop), same config.
BEFORE = {
    "summary": {"iterations": 2, "stop_reason": "no active clients", "communities": 0,
                "isolated_start": 13, "isolated_first": 6, "isolated_end": 13,
                "active_clients": 0, "eval_acc_start": 0.792222222222222, "eval_acc_end": 1.0,
                "eval_wrong_associations_pct": 0.0},
    "hist": [{"communities": 3, "isolated": 6, "edges": 5, "clusters": 13, "sizes": [3, 2, 2],
              "active_after": 2, "mean_agreement": 0.7888888888888888,
              "eval_acc": 0.9966666666666667},
             {"communities": 0, "isolated": 13, "edges": 0, "clusters": 13, "sizes": [],
              "active_after": 0, "mean_agreement": 0.9916666666666667, "eval_acc": 1.0}],
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return planted(tmp_path_factory.mktemp("planted"))


@pytest.fixture(scope="module")
def flower_run(root: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("fixed")
    summary, _ = run_server({**FIXED, "data-dir": str(root), "output-dir": str(out)})
    hist = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    return summary["metrics"], hist


def _compare(metrics: dict, hist: list[dict], ref: dict) -> None:
    for k, v in ref["summary"].items():
        assert metrics[k] == (pytest.approx(v) if isinstance(v, float) else v), k
    assert len(hist) == len(ref["hist"])
    for h, r in zip(hist, ref["hist"], strict=True):
        for k, v in r.items():
            assert h[k] == (pytest.approx(v) if isinstance(v, float) else v), (h["iteration"], k)


def test_same_trajectory_as_the_former_server_loop(flower_run) -> None:
    _compare(*flower_run, BEFORE)


def _inmemory(root: Path, **extra: object) -> tuple[InMemoryClients, dict]:
    """The fixed system's clients and their dirty start, as the ClientApp builds them."""
    from fedclust.fedcref.initial import Dirty, initial_clustering

    cfg = validate({**FIXED, "data-dir": str(root), "output-dir": "unused", **extra})
    xs, ys, starts = [], [], []
    for i in range(cfg["num-clients"]):
        x, y = core.client_data(cfg, i)
        k = int(np.unique(y).size)
        starts.append(initial_clustering(Dirty(cfg["fedcref.dirtiness"]), x, k, y_true=y,
                                         random_state=core.derive_seed(cfg["seed"],
                                                                       core.client_key(x), 0)))
        xs.append(x)
        ys.append(y)
    return InMemoryClients(xs, starts, cfg, ys=ys), cfg


def test_direct_calls_follow_the_flower_trajectory(root: Path, flower_run) -> None:
    clients, cfg = _inmemory(root)
    out = algorithm.run(clients, algorithm.Settings.from_config(cfg))
    metrics, hist = flower_run
    _compare(out.summary, out.history, {
        "summary": {k: metrics[k] for k in BEFORE["summary"]},
        "hist": [{k: h[k] for k in BEFORE["hist"][0]} for h in hist]})


def test_trajectory_is_the_same_with_evaluation_on_and_off(root: Path) -> None:
    on_clients, cfg = _inmemory(root, evaluate=True)
    on = algorithm.run(on_clients, algorithm.Settings.from_config(cfg))
    off_clients, cfg_off = _inmemory(root, evaluate=False)
    off = algorithm.run(off_clients, algorithm.Settings.from_config(cfg_off))
    assert "eval_acc_end" in on.summary and "eval_acc_end" not in off.summary
    keys = ("communities", "isolated", "edges", "clusters", "sizes", "active_after",
            "mean_agreement")
    assert [{k: h[k] for k in keys} for h in on.history] == \
        [{k: h[k] for k in keys} for h in off.history]
    for a, b in zip(on_clients.states, off_clients.states, strict=True):
        np.testing.assert_array_equal(a.labels, b.labels)


def test_trajectory_is_the_same_with_evaluation_off_over_flower(root: Path, flower_run,
                                                                 tmp_path: Path) -> None:
    summary, _ = run_server({**FIXED, "data-dir": str(root), "output-dir": str(tmp_path),
                             "evaluate": False})
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    keys = ("communities", "isolated", "edges", "clusters", "sizes", "active_after",
            "mean_agreement")
    assert [{k: h[k] for k in keys} for h in hist] == \
        [{k: h[k] for k in keys} for h in flower_run[1]]
    assert not any(k.startswith("eval_") for h in hist for k in h)


# --- a scripted federation: what the loop does with what the clients answer -------------------

def _const_models(outputs: list[float]) -> ae.Params:
    """Autoencoders 1-2-1 whose reconstruction is the constant ``outputs[m]`` (all weights 0,
    output bias logit(c)): model m's error on a sample x is (c_m − x)²."""
    c = torch.tensor(outputs, dtype=torch.float32)
    return [torch.zeros(len(c), 1, 2), torch.zeros(len(c), 1, 2), torch.zeros(len(c), 2, 1),
            torch.log(c / (1 - c)).reshape(-1, 1, 1)]


class Scripted:
    """Two clients with one cluster each; accept bits, community copies and counts given."""

    n = 2

    def __init__(self, accepts: dict[int, bool], copies: dict[int, float],
                 counts: dict[int, float]) -> None:
        self.accepts, self.copies, self.counts = accepts, copies, counts
        self.rounds = 0
        self.refined_with: list[ae.Params] = []

    def local(self, t, active, seed):
        return {i: algorithm.LocalReply(k=1, version=1, models={0: ae.to_numpy(
            _const_models([0.5]))}, modelled=[0]) for i in range(self.n)}

    def associate(self, t, models, asked, only=None):
        return {i: np.array([[self.accepts[i]]]) for i in asked}

    def community_round(self, t, rnd, params, members, seed):
        self.rounds += 1
        return {i: [algorithm.Contribution(g, [torch.full_like(p[g:g + 1], self.copies[i])
                                               for p in params], self.counts[i])
                    for g, _ in members[i]] for i in members}

    def refine(self, t, targets, params, members):
        self.refined_with.append(params)
        return {i: algorithm.RefineReply(1.0) for i in targets}


SCRIPT = algorithm.Settings(max_iterations=1, fl_rounds=2)


def test_an_edge_needs_both_clusters_to_accept() -> None:
    one_way = Scripted({0: True, 1: False}, {0: 1.0, 1: 3.0}, {0: 1, 1: 3})
    out = algorithm.run(one_way, SCRIPT)
    assert out.history[0]["edges"] == 0 and out.history[0]["communities"] == 0
    assert out.history[0]["isolated"] == 2 and one_way.rounds == 0
    both = Scripted({0: True, 1: True}, {0: 1.0, 1: 3.0}, {0: 1, 1: 3})
    out = algorithm.run(both, SCRIPT)
    assert out.history[0]["communities"] == 1 and out.history[0]["sizes"] == [2]


def test_community_model_is_the_count_weighted_aggregate() -> None:
    # copies 1.0 (1 sample) and 3.0 (3 samples): FedAvg = (1·1 + 3·3) / 4 = 2.5; an unweighted
    # mean gives 2.0, a member's model 1.0 or 3.0
    fed = Scripted({0: True, 1: True}, {0: 1.0, 1: 3.0}, {0: 1, 1: 3})
    out = algorithm.run(fed, SCRIPT)
    assert fed.rounds == 2
    for params in (out.community_models, fed.refined_with[0]):
        assert ae.n_models(params) == 1
        for p in params:
            torch.testing.assert_close(p, torch.full_like(p, 2.5))


def test_refinement_is_algorithm_2_not_a_plain_argmin() -> None:
    # three candidates (own models of clusters 0 and 1, one community model) reconstructing the
    # constants 0.1, 0.5, 0.9; K = 2. A plain argmin splits the samples three ways; Algorithm 2
    # picks model 0 (3 votes), then model 1 (2 votes, tie with the community model resolved to
    # the lower index), and gives the leftovers 0.9, 0.95 to the closer selected model, 0.5.
    x = np.array([[0.05], [0.1], [0.15], [0.5], [0.55], [0.9], [0.95]], dtype=np.float32)
    st = core.ClientState(labels=np.array([0, 0, 0, 0, 1, 1, 1]), k=2,
                          models=_const_models([0.1, 0.5]), model_clusters=np.array([0, 1]))
    st.own_errors = core.own_error_matrix(st, x)
    core.refine(st, x, _const_models([0.9]))
    assert st.labels.tolist() == [0, 0, 0, 1, 1, 1, 1]
    assert st.used_kind.tolist() == [core.USED_OWN, core.USED_OWN]


def test_a_cluster_emptied_by_refinement_leaves_the_graph() -> None:
    # client side: an inactive client whose cluster 1 lost its samples drops that model
    x = np.linspace(0.0, 1.0, 12, dtype=np.float32)[:, None]
    st = core.ClientState(labels=np.zeros(12, dtype=np.int64), k=2,
                          models=_const_models([0.1, 0.5]), model_clusters=np.array([0, 1]))
    st.own_errors = core.own_error_matrix(st, x)
    s = ClientSettings.from_config(validate({"method": "fedcref", "output-dir": "unused",
                                             "fedcref.min-cluster-size": 5}))
    assert core.drop_emptied(st, s)
    assert st.model_clusters.tolist() == [0] and ae.n_models(st.models) == 1
    assert np.isnan(st.own_errors[1]).all() and not np.isnan(st.own_errors[0]).any()
    assert not core.drop_emptied(st, s)

    # server side: a reply listing fewer modelled clusters removes the stale graph node
    class Shrinking(Scripted):
        def local(self, t, active, seed):
            if t == 1:
                return {i: algorithm.LocalReply(k=2, version=1, models={
                    q: ae.to_numpy(_const_models([0.5])) for q in (0, 1)}, modelled=[0, 1])
                    for i in range(self.n)}
            return {0: algorithm.LocalReply(k=2, version=1, modelled=[0]),
                    1: algorithm.LocalReply(k=2, version=1)}

        def associate(self, t, models, asked, only=None):
            return {i: np.zeros((2, sum(n[0] != i for n in models)), bool) for i in asked}

        def refine(self, t, targets, params, members):
            return {i: algorithm.RefineReply(0.0) for i in targets}

    out = algorithm.run(Shrinking({}, {}, {}), algorithm.Settings(max_iterations=2))
    assert [h["clusters"] for h in out.history] == [4, 3]
    assert [h["isolated"] for h in out.history] == [4, 3]
    assert out.history[1]["unmodelled_clusters"] == 1


@pytest.mark.parametrize("new_links", ["every", "first", "once", "partners"])
def test_later_iterations_add_no_link_unless_new_links_is_every(new_links: str) -> None:
    # three clients, one cluster each: 0-1 accept each other in iterations 1 and 2, then not;
    # 1-2 first accept each other in iteration 2
    pairs = {1: {(0, 1)}, 2: {(0, 1), (1, 2)}, 3: set()}

    class Changing(Scripted):
        n = 3

        asked_at: list[int] = []
        tested: list[dict[int, list[int]]] = []

        def associate(self, t, models, asked, only=None):
            self.asked_at.append(t)
            out = {}
            tested = {}
            for i in asked:
                foreign = [node[0] for node in algorithm.foreign_nodes(models, i, only)]
                tested[i] = foreign
                out[i] = np.array([[tuple(sorted((i, j))) in pairs[t] for j in foreign]])
            self.tested.append(tested)
            return out

        def refine(self, t, targets, params, members):
            return {i: algorithm.RefineReply(0.0) for i in targets}

    fed = Changing({}, {i: 1.0 for i in range(3)}, {i: 1 for i in range(3)})
    out = algorithm.run(fed, algorithm.Settings(max_iterations=3, fl_rounds=1,
                                                new_links=new_links, stop_window=9))
    edges = [h["edges"] for h in out.history]
    if new_links == "every":
        assert edges == [1, 2, 0] and out.history[1]["sizes"] == [3]
    elif new_links == "once":       # the first links, kept without asking again
        assert edges == [1, 1, 1] and fed.asked_at == [1]
    else:
        assert edges == [1, 1, 0] and out.history[1]["sizes"] == [2]
        assert fed.asked_at == [1, 2, 3]
        # with partners the new 1-2 acceptance is never tested, so nothing is blocked
        blocked = [0, 0, 0] if new_links == "partners" else [0, 1, 0]
        assert [h.get("blocked_links", 0) for h in out.history] == blocked
        assert fed.tested[0] == {0: [1, 2], 1: [0, 2], 2: [0, 1]}
        if new_links == "partners":    # only the first link's two ends, each other's model
            assert fed.tested[1] == fed.tested[2] == {0: [1], 1: [0]}
            assert out.history[1]["clusters"] == 3 and out.history[1]["isolated"] == 1
        else:
            assert fed.tested[1] == fed.tested[0]


@pytest.mark.parametrize("bridge_cut", [0, 3])
def test_bridge_cut_separates_two_triangles_that_one_link_joins(bridge_cut: int) -> None:
    # six clients, one cluster each: triangles 0-1-2 and 3-4-5, and the link 2-3
    pairs = {(0, 1), (0, 2), (1, 2), (3, 4), (3, 5), (4, 5), (2, 3)}

    class Triangles(Scripted):
        n = 6

        def associate(self, t, models, asked, only=None):
            return {i: np.array([[tuple(sorted((i, node[0]))) in pairs
                                  for node in models if node[0] != i]]) for i in asked}

        def refine(self, t, targets, params, members):
            return {i: algorithm.RefineReply(0.0) for i in targets}

    fed = Triangles({}, {i: 1.0 for i in range(6)}, {i: 1 for i in range(6)})
    out = algorithm.run(fed, algorithm.Settings(max_iterations=1, fl_rounds=1,
                                                bridge_cut=bridge_cut))
    first = out.history[0]
    if bridge_cut:
        assert first["sizes"] == [3, 3] and first["edges"] == 6 and first["bridge_cuts"] == 1
        assert out.summary["health"]["bridge_cuts"] == 1
    else:
        assert first["sizes"] == [6] and first["edges"] == 7 and "bridge_cuts" not in first


@pytest.mark.parametrize("agreement", [1.0, 0.9])
def test_an_unchanged_community_keeps_its_model_with_reuse(agreement: float) -> None:
    class Noting(Scripted):
        notes: list = []

        def refine(self, t, targets, params, members):
            self.refined_with.append(params)
            return {i: algorithm.RefineReply(agreement) for i in targets}

        def note_communities(self, t, members):
            self.notes.append((t, members))

    fed = Noting({0: True, 1: True}, {0: 1.0, 1: 3.0}, {0: 1, 1: 3})
    s = algorithm.Settings(max_iterations=2, fl_rounds=2, tau=2.0, reuse_communities=True)
    algorithm.run(fed, s)
    if agreement == 1.0:    # labels unchanged: iteration 2 keeps iteration 1's model
        assert fed.rounds == 2 and fed.notes == [(2, {0: [(0, [0])], 1: [(0, [0])]})]
        for a, b in zip(*fed.refined_with, strict=True):
            torch.testing.assert_close(a, b)
    else:                   # labels changed: retrained
        assert fed.rounds == 4 and fed.notes == []


def test_flower_run_with_reused_communities(root: Path, tmp_path: Path) -> None:
    summary, _ = run_server({**FIXED, "data-dir": str(root), "output-dir": str(tmp_path),
                             "fedcref.reuse-communities": True, "fedcref.tau": 0.999})
    assert summary["metrics"]["eval_acc_end"] >= 0.95


def test_a_community_starts_from_the_nearest_model_with_fewer_rounds() -> None:
    class Recording(Scripted):
        def __init__(self, *a) -> None:
            super().__init__(*a)
            self.starts: list[tuple[int, int, float]] = []   # (iteration, round, weight)

        def community_round(self, t, rnd, params, members, seed):
            self.starts.append((t, rnd, float(params[0].flatten()[0])))
            return super().community_round(t, rnd, params, members, seed)

        def refine(self, t, targets, params, members):
            self.refined_with.append(params)
            return {i: algorithm.RefineReply(0.5) for i in targets}   # labels changed

    warm = Recording({0: True, 1: True}, {0: 1.0, 1: 3.0}, {0: 1, 1: 3})
    s = algorithm.Settings(max_iterations=2, fl_rounds=4, tau=2.0, warm_start=True,
                           warm_rounds=2)
    algorithm.run(warm, s)
    # iteration 1: no earlier community, so it starts from its first member's cluster model
    # (all weights 0), 2 rounds; iteration 2: the labels changed, so the community is
    # retrained, starting from iteration 1's model (2.5), 2 rounds
    assert [(t, r) for t, r, _ in warm.starts] == [(1, 1), (1, 2), (2, 1), (2, 2)]
    assert warm.starts[0][2] == 0.0 and warm.starts[2][2] == 2.5
    cold = Recording({0: True, 1: True}, {0: 1.0, 1: 3.0}, {0: 1, 1: 3})
    algorithm.run(cold, algorithm.Settings(max_iterations=2, fl_rounds=4, tau=2.0))
    # without warm starts: a fresh initialisation (keras: weight 0 is not 0) and 4 rounds
    assert len(cold.starts) == 8 and cold.starts[0][2] != 0.0 and cold.starts[4][2] != 2.5


def test_nearest_model_is_the_one_with_most_members_in_common() -> None:
    reuse = algorithm._Reuse()
    a, b = [torch.zeros(1)], [torch.ones(1)]
    reuse.remember(1, [[(0, 0), (1, 0)], [(2, 0), (3, 0), (4, 1)]], [torch.stack([a[0], b[0]])])
    assert reuse.nearest([(2, 0), (3, 0), (0, 0)])[0].item() == 1.0     # 2 in common vs 1
    assert reuse.nearest([(0, 0), (2, 0)])[0].item() == 0.0             # tie 1-1: Jaccard 1/3
    assert reuse.nearest([(5, 0), (6, 0)]) is None


@pytest.mark.parametrize("wire_format", ["int8", "float16", "int8-delta"])
def test_direct_calls_follow_the_flower_trajectory_with_the_confident_test(
        root: Path, tmp_path: Path, wire_format: str) -> None:
    # the confident test, the covered refinement and models on the wire in 8 or 16 bits: the
    # in-memory clients round the models where a message would, so both paths agree
    extra = {"fedcref.assoc-rule": "confident", "fedcref.refine": "covered",
             "fedcref.wire": wire_format, "fedcref.samples-per-cluster": 60}
    summary, _ = run_server({**FIXED, "data-dir": str(root), "output-dir": str(tmp_path),
                             **extra})
    hist = [json.loads(line) for line in (tmp_path / "history.jsonl").read_text().splitlines()]
    clients, cfg = _inmemory(root, **extra)
    out = algorithm.run(clients, algorithm.Settings.from_config(cfg))
    keys = ("communities", "isolated", "edges", "clusters", "sizes", "active_after",
            "mean_agreement", "eval_acc", "community_share")
    assert hist[0]["communities"] >= 1
    assert [{k: h.get(k) for k in keys} for h in out.history] == \
        [{k: h.get(k) for k in keys} for h in hist]
