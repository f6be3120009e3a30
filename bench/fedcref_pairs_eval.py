"""Compare FedCRef association tests on cached iteration-1 errors (bench/fedcref_pairs_cache.py).

For every cached system and every test setting: the share of same-class and different-class
cluster pairs linked both ways, the iteration-1 graph (edges, wrong edges, communities,
isolated clusters, wrong associations %) with and without the split of communities that hold
two clusters of one client, and with the bridge cut after that split (``--bridge-cut``: one
line per value). Labels are used only to score::

    python bench/fedcref_pairs_eval.py runs/pairs/mnist-n10-s60-*.npz --bridge-cut 0 3

With ``--parts`` it prints instead the pass rate of each part of the confident test (with
``--by-class``, also per true class), per system and, for several caches, over all of them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


MIN_SIZE = 5      # fedcref.min-cluster-size: smaller clusters accept nothing


def majority(sys_: dict) -> tuple[dict, dict]:
    """Per cluster node: its true-class histogram and majority class (scoring only)."""
    hist = {(i, q): np.bincount(sys_["y"][i][sys_["labels"][i] == q], minlength=10)
            for i, q in sys_["owner"]}
    return hist, {o: int(np.argmax(h)) for o, h in hist.items()}


def load(path: Path) -> dict:
    z = np.load(path)
    owner = [tuple(int(v) for v in o) for o in z["owner"]]
    n = 1 + max(o[0] for o in owner)
    return {"owner": owner, "n": n, "err": [z[f"err{i}"] for i in range(n)],
            "labels": [z[f"labels{i}"] for i in range(n)],
            "held": [z[f"held{i}"] for i in range(n)], "y": [z[f"y{i}"] for i in range(n)]}


def make_rule(rule: str, epsilon: float = 0.15, quantile: float = 0.5, lam: float = 0.5,
              beta: float = 0.05, delta: float | None = None, delta_growth: float = 0.0) -> Any:
    """The association rule object named ``rule`` with this script's parameter names."""
    from fedclust.fedcref import rules

    return {"eq2": lambda: rules.Eq2(0.2, 0.75, MIN_SIZE),
            "ratio": lambda: rules.Ratio(epsilon, quantile, MIN_SIZE),
            "calibrated": lambda: rules.Calibrated(lam, quantile, MIN_SIZE),
            "confident": lambda: rules.Confident(epsilon, delta, beta, delta_growth, MIN_SIZE),
            }[rule]()


def accept_bits(sys_: dict, rule: str, **kw) -> dict:
    """{(i, q): set of foreign nodes accepted}, best per foreign client."""
    from fedclust.fedcref.association import accept_matrix

    test = make_rule(rule, **kw)

    owner = sys_["owner"]
    row = {o: r for r, o in enumerate(owner)}
    out = {}
    for i in range(sys_["n"]):
        err, labels, held = sys_["err"][i], sys_["labels"][i], sys_["held"][i]
        k = int(labels.max()) + 1
        mine = [o for o in owner if o[0] == i]
        own = np.full((k, err.shape[1]), np.nan, np.float32)
        for o in mine:
            own[o[1]] = err[row[o]]
        fk = [r for r, o in enumerate(owner) if o[0] != i]
        groups = np.array([owner[r][0] for r in fk])
        acc = accept_matrix(labels, own, err[fk], test, held, groups)
        for q in range(k):
            out[(i, q)] = {owner[fk[c]] for c in np.flatnonzero(acc[q])}
    return out


def part_tally(sys_: dict, epsilon: float, beta: float, delta: float | None = None,
               delta_growth: float = 0.0, by_class: bool = False) -> dict[str, NDArray]:
    """Directed pairs (same and different class) and how many pass each confident part, as
    ``[pairs, own, best, others, all]``; with ``by_class``, the same-class pairs also per true
    class of the tested cluster (``"same:<class>"``)."""
    test = make_rule("confident", epsilon=epsilon, beta=beta, delta=delta,
                     delta_growth=delta_growth)
    owner = sys_["owner"]
    row = {o: r for r, o in enumerate(owner)}
    _, major = majority(sys_)
    tally: dict[str, NDArray] = {"same": np.zeros(5), "different": np.zeros(5)}
    for i, q in owner:
        err, labels, held = sys_["err"][i], sys_["labels"][i], sys_["held"][i]
        whole = labels == q
        if whole.sum() < MIN_SIZE or not (whole & held).any():
            continue
        others = [row[o] for o in owner if o[0] == i and o != (i, q)]
        fk = [row[o] for o in owner if o[0] != i]
        parts = test.parts(err[row[(i, q)]][whole], err[fk][:, whole], err[others][:, whole],
                           held[whole])
        for c, r in enumerate(fk):
            kind = "same" if major[owner[r]] == major[(i, q)] else "different"
            counts = [1, *parts[:, c], parts[:, c].all()]
            tally[kind] += counts
            if by_class and kind == "same":
                tally.setdefault(f"same:{major[(i, q)]}", np.zeros(5))[:] += counts
    return tally


def part_rates(tally: dict[str, NDArray]) -> dict:
    """Share of the directed pairs of each kind passing each confident part."""
    return {k: {"pairs": int(v[0]), **{name: round(float(v[j + 1] / max(v[0], 1)), 4)
                for j, name in enumerate(("own", "best", "others", "all"))}}
            for k, v in sorted(tally.items(), key=lambda kv: (":" in kv[0], kv[0]))}


def score(sys_: dict, accept: dict, split: bool, bridge_cut: int = 0) -> dict:
    from fedclust.fedcref.association import (
        communities,
        cut_bridges,
        mutual_edges,
        split_conflicts,
    )
    from fedclust.fedcref.evaluation import wrong_associations

    owner = sys_["owner"]
    hist, major = majority(sys_)
    edges = mutual_edges(accept)
    cut = 0
    if split:
        kept = split_conflicts(owner, edges)
        cut = len(edges) - len(kept)
        edges = kept
    kept = cut_bridges(owner, edges, bridge_cut)
    bridges, edges = len(edges) - len(kept), kept
    comms, iso = communities(owner, edges)
    same = [(a, b) for a, b in itertools.combinations(owner, 2)
            if a[0] != b[0] and major[a] == major[b]]
    es = set(edges)
    linked_same = sum((a, b) in es or (b, a) in es for a, b in same)
    classes = {major[o] for o in owner}
    holders = {c: len({o[0] for o in owner if major[o] == c}) for c in classes}
    return {"edges": len(edges), "wrong_edges": sum(major[a] != major[b] for a, b in edges),
            "same_linked": round(linked_same / max(len(same), 1), 3), "cut": cut,
            "bridges_cut": bridges,
            "communities": len(comms), "ideal": sum(h >= 2 for h in holders.values()),
            "isolated": len(iso), "wrong_pct": round(wrong_associations(comms, hist)[2], 1),
            "merged": sum(len({major[o] for o in g}) > 1 for g in comms)}


def settings(names: list[str]) -> list[tuple[str, dict]]:
    out = []
    for name in names:
        rule, _, rest = name.partition(":")
        kw = {}
        for part in filter(None, rest.split(",")):
            k, v = part.split("=")
            kw[k] = float(v)
        out.append((rule, kw))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("caches", nargs="+")
    ap.add_argument("--tests", nargs="+", default=["ratio:epsilon=0.15"],
                    help="rule:key=value,... e.g. ratio:epsilon=0.15 "
                    "confident:epsilon=0.15,beta=0.05")
    ap.add_argument("--bridge-cut", type=int, nargs="+", default=[0],
                    help="fedcref.bridge-cut values scored after the split (0 = no cut)")
    ap.add_argument("--parts", action="store_true",
                    help="print the pass rate of each part of the confident test instead")
    ap.add_argument("--by-class", action="store_true",
                    help="with --parts: also the same-class rates per true class")
    args = ap.parse_args()
    if args.by_class and not args.parts:
        ap.error("--by-class splits the --parts rates: add --parts")
    totals: dict[int, dict[str, NDArray]] = {}
    for path in args.caches:
        s = load(Path(path))
        for t, (rule, kw) in enumerate(settings(args.tests)):
            if args.parts:
                if rule != "confident":
                    ap.error("--parts needs confident tests")
                tally = part_tally(s, **kw, by_class=args.by_class)
                total = totals.setdefault(t, {})
                for kind, counts in tally.items():
                    total[kind] = total.get(kind, 0) + counts
                print(json.dumps({"system": Path(path).stem, **kw, **part_rates(tally)}),
                      flush=True)
                continue
            acc = accept_bits(s, rule, **kw)
            print(json.dumps({"system": Path(path).stem, "rule": rule, **kw, "split": False,
                              **score(s, acc, False)}), flush=True)
            for m in args.bridge_cut:
                print(json.dumps({"system": Path(path).stem, "rule": rule, **kw, "split": True,
                                  "bridge_cut": m, **score(s, acc, True, m)}), flush=True)
    if len(args.caches) > 1:
        for t, (_, kw) in enumerate(settings(args.tests)):
            if t in totals:
                print(json.dumps({"system": "all", **kw, **part_rates(totals[t])}), flush=True)


if __name__ == "__main__":
    main()
