"""EMD-CFL's ε read from the run's own excesses (``emdcfl.epsilon="auto"``,
fedclust/emdcfl/cluster.py ``auto_epsilon``, fedclust/emdcfl/excess.py ``auto_excess``).

- planted systems: one group gives one cluster; every client in its own group gives
  singletons; clients on a continuum (no usable gap) give no ε and the label-free warning;
  planted groups give the groups;
- the two-stage solve (dual bounds, then only what the choice needs) gives the full matrix's
  ε and clusters, with fewer solves;
- the measured fixture at paper 001's Table 1 sizes gives the 4 rotations (skips without data);
- the choice and the warnings reach history.jsonl, summary.json and the log.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import numpy as np
import pytest

from fedclust.emdcfl import cluster
from fedclust.emdcfl.cluster import auto_epsilon, neighbourhood_clusters, threshold_adjacency
from fedclust.emdcfl.excess import PairClouds, Solver, cluster_clients
from fedclust.metrics import adjusted_rand

SOLVER = Solver(metric="euclidean")
DIM = 6
AXIS = np.eye(DIM)[0]


def planted(means: list[np.ndarray], seed: int, n: int = 40
            ) -> tuple[list[int], dict[tuple[int, int], PairClouds]]:
    """Client ``i``'s clouds are Gaussian around ``means[i]``: every ordered pair's source,
    target and own validation cloud, and the reference ``W(source, own)``."""
    rng = np.random.default_rng(seed)
    members = list(range(len(means)))
    pairs = {}
    for i in members:
        for j in members:
            if i != j:
                src = means[i] + rng.normal(size=(n, DIM))
                tgt = means[j] + rng.normal(size=(n, DIM))
                own = means[i] + rng.normal(size=(n, DIM))
                pairs[(i, j)] = PairClouds(src, tgt, float(SOLVER.many([(src, own)])[0]))
    return members, pairs


def one_group(seed: int = 0) -> list[np.ndarray]:
    return [np.zeros(DIM)] * 8


def own_groups(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + seed)
    return [6.0 * rng.normal(size=DIM) for _ in range(8)]


def continuum(seed: int = 0) -> list[np.ndarray]:
    """Ten clients a step apart on a line: neighbours barely differ, the ends differ a lot."""
    return [i * 1.0 * AXIS for i in range(10)]


def three_groups(seed: int = 0, shift: float = 4.0) -> list[np.ndarray]:
    return [m for m in (np.zeros(DIM), shift * AXIS, -shift * AXIS) for _ in range(3)]


def test_one_group_gives_one_cluster():
    members, pairs = planted(one_group(), seed=0)
    found = cluster_clients(members, pairs, "auto", SOLVER)
    c = found.choice
    assert c.rule == "all-alike" and c.epsilon == cluster.AUTO_ALIKE * c.scale
    assert np.nanmax(found.excess) < c.epsilon       # every pair passes
    assert found.labels.tolist() == [0] * 8
    assert found.warnings == []


def test_every_client_in_its_own_group_gives_singletons():
    members, pairs = planted(own_groups(), seed=0)
    found = cluster_clients(members, pairs, "auto", SOLVER)
    assert found.choice.rule == "all-different"
    assert found.labels.tolist() == list(range(8))
    # every client alone: the label-free warning about singletons, and no "cannot tell"
    assert len(found.warnings) == 1 and "left 8 of 8 clients alone" in found.warnings[0]
    assert found.solves == 0          # the dual bounds alone put every pair above the cap


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_an_excess_without_a_usable_gap_gives_the_warning_and_no_groups(seed):
    members, pairs = planted(continuum(), seed=seed)
    found = cluster_clients(members, pairs, "auto", SOLVER)
    c = found.choice
    assert c.rule == "no-gap" and c.epsilon is None and c.clearness < cluster.AUTO_CLEAR
    assert found.labels.tolist() == list(range(10))        # no group is invented
    assert found.warnings[0] == c.warning
    assert "no clear gap" in c.warning and "emdcfl.epsilon" in c.warning
    assert any("alone" in w for w in found.warnings[1:])


def test_planted_groups_give_the_groups_in_the_clearest_gap():
    members, pairs = planted(three_groups(), seed=0)
    found = cluster_clients(members, pairs, "auto", SOLVER)
    c = found.choice
    assert c.rule == "gap" and c.clearness >= cluster.AUTO_CLEAR
    lo, hi = c.gap
    assert lo < c.epsilon < hi and c.epsilon <= c.cap
    assert adjusted_rand([0, 0, 0, 1, 1, 1, 2, 2, 2], found.labels) == 1.0
    pair = np.maximum(found.excess, found.excess.T)
    same = np.kron(np.eye(3), np.ones((3, 3))).astype(bool) & ~np.eye(9, dtype=bool)
    assert np.nanmax(pair[same]) == pytest.approx(lo)          # the gap the run saw
    assert found.warnings == []


@pytest.mark.parametrize("system", [one_group, own_groups, continuum, three_groups])
def test_the_two_stage_solve_gives_the_full_matrixs_epsilon_and_clusters(system):
    members, pairs = planted(system(), seed=3)
    full = cluster_clients(members, pairs, "auto", SOLVER, lazy=False)
    lazy = cluster_clients(members, pairs, "auto", SOLVER, lazy=True)
    assert full.solves == len(pairs)
    assert lazy.solves + lazy.skipped == len(pairs) and lazy.solves <= full.solves
    assert (lazy.choice.rule, lazy.choice.epsilon) == (full.choice.rule, full.choice.epsilon)
    assert lazy.choice.clearness == full.choice.clearness
    np.testing.assert_array_equal(lazy.labels, full.labels)
    np.testing.assert_array_equal(lazy.adjacency, full.adjacency)
    solved = np.isfinite(lazy.excess)
    np.testing.assert_array_equal(lazy.excess[solved], full.excess[solved])
    # a direction left unsolved lies above the chosen ε (its dual bound says so)
    assert not np.any(np.isnan(lazy.excess) & (full.excess < (lazy.choice.epsilon or 0.0)))


def test_far_groups_solve_only_what_the_choice_needs():
    members, pairs = planted(three_groups(shift=10.0), seed=4)
    lazy = cluster_clients(members, pairs, "auto", SOLVER, lazy=True)
    assert lazy.solves == 18           # the same-group directions; the bounds decide the rest
    assert adjusted_rand([0, 0, 0, 1, 1, 1, 2, 2, 2], lazy.labels) == 1.0


def test_a_given_epsilon_is_kept_and_recorded():
    members, pairs = planted(three_groups(), seed=0)
    found = cluster_clients(members, pairs, 0.5, SOLVER)
    assert found.choice.rule == "given" and found.choice.epsilon == 0.5
    assert found.choice.record()["epsilon_rule"] == "given"


def test_the_rule_needs_no_more_than_the_pairs_below_the_cap():
    # a pair whose lower bound is at or above the cap is never asked for
    low = np.array([[np.nan, 0.01, 5.0], [0.02, np.nan, 6.0], [5.5, 7.0, np.nan]])
    exact = np.array([[False, True, False], [True, False, False], [False, False, False]])
    choice, need = auto_epsilon(low, exact, scale=1.0)
    assert not need.any() and choice.rule == "gap"
    assert choice.gap == (0.02, 5.5) and 0.02 < choice.epsilon <= choice.cap
    # one direction's bound below the cap: the other direction still puts the pair above it
    low[0, 2] = 0.3
    choice, need = auto_epsilon(low, exact, scale=1.0)
    assert choice is not None and not need.any()
    # both below: that pair's unsolved directions first
    low[2, 0] = 0.4
    choice, need = auto_epsilon(low, exact, scale=1.0)
    assert choice is None and need.tolist() == [[False, False, True],
                                                [False, False, False],
                                                [True, False, False]]


FIXTURE = "emdcfl/rotmnist-max-40clients-paper-size-round0.npz"


def test_the_measured_paper_size_excess_gives_the_four_rotations():
    """The excess matrix of one EMD-CFL clustering step at paper 001's Table 1 sizes (see the
    data README, "Measured fixtures"): ε = 0.1 gave 39 clusters; ε auto must give the 4
    rotation groups. Entries screened at ε = 0.1 (NaN) are known only to be ≥ 0.1."""
    root = os.environ.get("FEDCLUST_DATA_DIR", "")
    path = Path(root) / FIXTURE
    if not root or not path.is_file():
        pytest.skip(f"{FIXTURE} not under FEDCLUST_DATA_DIR")
    d = np.load(path)
    excess, emd, truth = d["excess"], d["emd"], d["truth"]
    n = len(truth)
    off = ~np.eye(n, dtype=bool)
    solved = np.isfinite(excess) & off
    reference = float(np.median((emd - excess)[solved]))   # W(train_c, val_c), solved pairs
    # a screened entry is only known to be >= 0.1: the choice must not depend on its value
    choices = []
    for screened in (0.1, 0.15, 1.0):
        full = np.where(solved, excess, screened)
        np.fill_diagonal(full, np.nan)
        choice, need = auto_epsilon(full, off, reference)
        assert choice is not None and not need.any()
        labels = neighbourhood_clusters(threshold_adjacency(full, choice.epsilon))
        assert choice.rule == "gap" and 0.02 <= choice.epsilon <= 0.08, choice
        assert len(set(labels.tolist())) == 4 and adjusted_rand(truth, labels) == 1.0
        choices.append((choice.epsilon, choice.gap[0], labels.tolist()))
    assert choices[0] == choices[1] == choices[2]
    # the paper's ε = 0.1 shatters the same matrix (what the automatic ε avoids)
    fixed = neighbourhood_clusters(threshold_adjacency(np.where(solved, excess, np.nan), 0.1))
    assert len(set(fixed.tolist())) > 30


# ------------------------------------------------------------------- records and warnings

class Lines(logging.Handler):
    """The fedclust logger's lines (it does not propagate to the root logger)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_the_choice_reaches_history_summary_and_log(tmp_path, monkeypatch):
    from tests.emdcfl.test_emdcfl_server import TINY, planted_nodes
    from tests.fake_grid import run_server

    cfg = {**TINY, "emdcfl.epsilon": "auto", "emdcfl.rounds": 1, "evaluate": True,
           "output-dir": str(tmp_path / "run")}
    summary, _ = run_server(cfg, node_configs=planted_nodes(tmp_path))
    m = summary["metrics"]
    history = [json.loads(line) for line in (tmp_path / "run" / "history.jsonl").open()]
    assert m["epsilon_rule"] == history[0]["epsilon_rule"] == "gap"
    assert m["epsilon"] == history[0]["epsilon"] and m["epsilon_gap"] == history[0]["epsilon_gap"]
    lo, hi = m["epsilon_gap"]
    assert lo < m["epsilon"] < hi and m["epsilon"] <= m["epsilon_cap"]
    assert m["eval_ari"] == 1.0 and m["warnings"] == [] == history[0]["clustering_warnings"]
    # no clear gap (a demand no gap can meet): no ε, every client alone, the same warning in
    # the log, in history.jsonl and in summary.json
    monkeypatch.setattr(cluster, "AUTO_CLEAR", 1e9)
    cfg["output-dir"] = str(tmp_path / "nogap")
    log, lines = logging.getLogger("fedclust"), Lines()
    log.addHandler(lines)
    try:
        summary, _ = run_server(cfg, node_configs=planted_nodes(tmp_path))
    finally:
        log.removeHandler(lines)
    m = summary["metrics"]
    history = [json.loads(line) for line in (tmp_path / "nogap" / "history.jsonl").open()]
    assert m["epsilon_rule"] == "no-gap" and m["epsilon"] is None and m["num_clusters"] == 4
    assert m["warnings"] == history[0]["clustering_warnings"] and len(m["warnings"]) == 2
    assert "no clear gap" in m["warnings"][0] and "left 4 of 4 clients alone" in m["warnings"][1]
    for text in m["warnings"]:
        assert any(text in line for line in lines.lines)
    for text in m["warnings"]:           # label-free: nothing about the true groups
        assert "truth" not in text and "ARI" not in text and "group" not in text


def test_the_tuning_tool_reads_cached_systems(tmp_path, capsys):
    """bench/emdcfl_epsilon_tuning.py margins: the rule's outcome per cached system (and its
    first n clients) with the clearness of the true gap and of the clearest other."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "eps_tuning", Path(__file__).resolve().parents[2] / "bench" / "emdcfl_epsilon_tuning.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    members, pairs = planted(three_groups(), seed=0)
    n = len(members)
    w, ref = np.full((n, n), np.nan), np.full((n, n), np.nan)
    for (c, o), pc in pairs.items():
        w[c, o], ref[c, o] = SOLVER.many([(pc.source, pc.target)])[0], pc.reference
    np.savez(tmp_path / "planted-s100.npz", w=w, ref=ref, lb=w, truth=np.repeat([0, 1, 2], 3))
    assert tool.main(["margins", "--cache", str(tmp_path), "--sizes", "0", "6"]) == 0
    out = capsys.readouterr().out
    assert "| planted-s100 | 9 | gap |" in out and "| planted-s100 | 6 | gap |" in out
    assert "smallest clearness of a true gap" in out
