"""Label-free signals of a FedCRef run, and the warnings they raise (no ground truth used).

A run cannot see its accuracy, but it sees the marks that merged communities and weak
evidence leave:

- ``cut_edges``: associations that joined two clusters of one client into one community
  (the cannot-link cut, :func:`fedclust.fedcref.association.split_conflicts`, removes them).
  A client's clusters are different groups by its own clustering, so every cut edge is an
  association that contradicts a client: a sign of similar groups the tests cannot separate.
- ``bridge_cuts``: links that alone joined two groups of clusters (``fedcref.bridge-cut``,
  :func:`fedclust.fedcref.association.cut_bridges`): two kinds of data one acceptance joined.
- ``unconfirmed_pct``: with ``fedcref.refine=covered``, the share of community memberships
  whose member does not confirm the community model on its own held-out samples (the model
  is not as good as the member's own, or no better than its other clusters' models).
- ``community_share``: the share of samples that community models label in refinement.
- ``fallback``: no community at the end: every client keeps its own models (local-only).

:func:`assess` turns them into the ``health`` entry of the summary, with warnings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: Warn when a run's last iteration cut at least this many associations (cannot-link).
CUT_WARN = 1
#: Warn when more than this share (%) of memberships went unconfirmed in an iteration.
UNCONFIRMED_WARN = 20.0


def assess(history: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``health`` summary entry: signals over the run and the warnings they raise."""
    if not history:
        return {"warnings": ["the run ended before its first iteration finished"]}
    last = history[-1]
    cuts = [int(h.get("cut_edges", 0)) for h in history]
    unconfirmed = [float(h["unconfirmed_pct"]) for h in history if "unconfirmed_pct" in h]
    out: dict[str, Any] = {
        "communities": last.get("communities"),
        "isolated": last.get("isolated"),
        "cut_edges": sum(cuts),
        "cut_edges_last": cuts[-1],
        "bridge_cuts": sum(int(h.get("bridge_cuts", 0)) for h in history),
        "unconfirmed_pct_max": max(unconfirmed) if unconfirmed else None,
        "community_share": last.get("community_share"),
        "fallback": not last.get("communities"),
    }
    warnings = []
    if out["fallback"]:
        warnings.append(
            "no community formed in the last iteration: every client keeps its own models "
            "(the result is local-only). The association test abstains when a client's "
            "samples cannot show that two clusters hold the same kind of data (small "
            "clusters, similar groups)")
    if cuts[-1] >= CUT_WARN:
        warnings.append(
            f"{cuts[-1]} association(s) of the last iteration joined two clusters of one "
            "client and were cut: some groups are too similar for the association test to "
            "separate, and a community may still mix them")
    if unconfirmed and max(unconfirmed) > UNCONFIRMED_WARN:
        warnings.append(
            f"up to {max(unconfirmed):.0f}% of the community memberships in an iteration "
            "were not confirmed by their member (the community model did not match the "
            "member's own model on its held-out samples): those clusters kept their own "
            "models")
    out["warnings"] = warnings
    return out
