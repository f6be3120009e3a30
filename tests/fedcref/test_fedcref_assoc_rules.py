"""FedCRef's association rules on planted reconstruction errors, without training.

What the association probe and the pairs evaluation of the tuning work checked, as tests of
the library (:mod:`fedclust.fedcref.association`):

- each rule's threshold moves acceptance one way only, and the accepted pairs of the stricter
  setting are a subset of the looser one's: eq. (2) accepts more with a larger θ and fewer
  with a larger α, the ratio test more with a larger ε, the calibrated test more with a larger
  λ; the best match per foreign client keeps a subset of all pairs, one per client;
- the confident test's parts on a planted federation (3 clients × classes 0 and 1): a
  different-class model fails "as good as the own model" (its errors are far above the own
  model's), a same-class model that trails the best by more than the margin fails "as good as
  the best", and the margin grows with the cluster's size as documented.

The helpers ``_accept`` and ``_parts`` are the only places that name the library's API.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.fedcref.association import accept_matrix
from fedclust.fedcref.rules import Calibrated, Confident, Eq2, Ratio

N = 200          # samples of the tested client, 100 per cluster
F = 40           # foreign models


def _accept(labels, own, foreign, held, groups=None, rule="eq2", theta=0.2, alpha=0.75,
            epsilon=0.15, lam=0.5) -> np.ndarray:
    test = {"eq2": Eq2(theta, alpha), "ratio": Ratio(epsilon),
            "calibrated": Calibrated(lam)}[rule]
    return accept_matrix(labels, own, foreign, test, held_out=held, groups=groups)


def _parts(own, foreign, others, held, epsilon=0.3, beta=0.02, delta=0.1, growth=0.0):
    """(3, F) bool: as good as the own model, as good as the best, better than the others."""
    return Confident(epsilon, delta, beta, growth).parts(own, foreign, others, held)


@pytest.fixture(scope="module")
def client():
    """One client with two clusters (0: the first 100 samples, 1: the rest); its own models
    explain their own cluster (log error ≈ 0) and not the other (≈ 1). The foreign models
    trail the own ones by offsets spread from 0 to 1.2 in log error, so every threshold
    below sits inside the spread and accepts some of them but not all."""
    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], N // 2)
    own = np.exp(np.stack([np.where(labels == q, 0.0, 1.0) for q in (0, 1)])
                 + rng.normal(0, 0.05, (2, N)))
    kind = rng.integers(0, 2, F)                                # the class a model explains
    lag = np.linspace(0.0, 1.2, F)
    log_f = (np.where(labels[None, :] == kind[:, None], 0.0, 1.0) + lag[:, None]
             + rng.normal(0, 0.3, (F, N)))
    held = np.zeros(N, dtype=bool)
    held[rng.choice(N, N // 4, replace=False)] = True
    groups = np.arange(F) // 4                                  # 10 foreign clients, 4 models
    return labels, own, np.exp(log_f), held, groups


def _monotone(loose: np.ndarray, strict: np.ndarray) -> None:
    assert not (strict & ~loose).any(), "the stricter setting accepted a pair the looser refused"
    assert strict.sum() < loose.sum(), "the planted spread must separate the two settings"
    assert strict.any(), "the planted spread must let the stricter setting accept some pairs"


@pytest.mark.parametrize("rule, fixed, key, loose, strict", [
    ("eq2", {"alpha": 0.4}, "theta", 0.4, 0.2),
    ("eq2", {"theta": 0.4}, "alpha", 0.5, 0.7),
    ("ratio", {}, "epsilon", 0.6, 0.3),
    ("calibrated", {}, "lam", 0.8, 0.4),
])
def test_each_threshold_moves_acceptance_one_way(client, rule, fixed, key, loose, strict):
    labels, own, foreign, held, _ = client
    _monotone(_accept(labels, own, foreign, held, rule=rule, **fixed, **{key: loose}),
              _accept(labels, own, foreign, held, rule=rule, **fixed, **{key: strict}))


@pytest.mark.parametrize("rule", ["eq2", "ratio", "calibrated"])
def test_best_per_client_keeps_one_of_the_accepted_models_per_client(client, rule):
    labels, own, foreign, held, groups = client
    kw = {"rule": rule, "theta": 0.4, "alpha": 0.5, "epsilon": 0.6, "lam": 0.8}
    every = _accept(labels, own, foreign, held, **kw)
    best = _accept(labels, own, foreign, held, groups, **kw)
    assert best.sum() < every.sum(), "some foreign client must have two accepted models"
    assert not (best & ~every).any()
    for q in range(2):
        kept = groups[best[q]]
        assert len(kept) == len(set(kept.tolist())) == len(set(groups[every[q]].tolist()))


def _federation(lag: float) -> tuple[list, np.ndarray, np.ndarray]:
    """3 clients × 2 clusters (classes 0 and 1), 200 samples each; client i's errors of all
    six models on its samples. A model explains its own class (log error ≈ 0) and not the
    other (+1.1); client 0's class-0 model trails the other class-0 models by ``lag`` in log
    error on every sample."""
    rng = np.random.default_rng(0)
    owner = [(i, q) for i in range(3) for q in range(2)]
    y = np.repeat([0, 1], 200)
    errs = []
    for i in range(3):
        err = np.empty((len(owner), 400))
        for r, (j, q) in enumerate(owner):
            log_e = np.where(y == q, 0.0, 1.1) + rng.normal(0, 0.02, 400)
            if (j, q) == (0, 0) and i != 0:
                log_e = log_e + lag
            err[r] = np.exp(log_e)
        errs.append(err)
    return owner, y, np.stack(errs)


def _tally(lag: float, growth: float) -> dict[str, np.ndarray]:
    """Per kind of directed pair (same or different class): how many pass [own, best,
    others, all], over every cluster of every client and every foreign model."""
    owner, y, errs = _federation(lag)
    rng = np.random.default_rng(1)
    out = {"same": np.zeros(5, int), "different": np.zeros(5, int)}
    for i in range(3):
        held = np.zeros(400, dtype=bool)
        held[rng.choice(400, 80, replace=False)] = True
        fk = [r for r, (j, _) in enumerate(owner) if j != i]
        for q in range(2):
            whole = y == q
            own = errs[i][owner.index((i, q))][whole]
            other = errs[i][[owner.index((i, 1 - q))]][:, whole]
            parts = _parts(own, errs[i][fk][:, whole], other, held[whole], growth=growth)
            for c, r in enumerate(fk):
                kind = "same" if owner[r][1] == q else "different"
                out[kind] += [1, *parts[:, c], parts[:, c].all()]
    return out


def test_a_different_class_model_fails_as_good_as_the_own_model():
    t = _tally(lag=0.15, growth=0.0)
    # 12 directed pairs of each kind; a different-class model is 1.1 above the own model in
    # log error on every held-out sample: it is not "as good as the own model"
    assert t["different"][0] == 12
    assert t["different"][1] == 0 and t["different"][4] == 0
    # the same-class models pass that part, also the lagging one (0.15 < ε = 0.3)
    assert t["same"][0] == 12 and t["same"][1] == 12


def test_a_same_class_model_trailing_the_best_fails_the_best_margin_only():
    t = _tally(lag=0.15, growth=0.0)
    # the 2 clusters of class 0 that see client 0's lagging model reject it on the
    # best-margin part only
    assert t["same"].tolist() == [12, 12, 10, 12, 10]


@pytest.mark.parametrize("growth, passes", [(0.3, 10), (0.5, 12)])
def test_the_best_margin_grows_with_the_cluster_size(growth, passes):
    # 200 samples: δ_n = 0.1 · (200/60)^γ is 0.14 < 0.15 at γ = 0.3 (still out) and 0.18 at
    # γ = 0.5 (the lagging model passes)
    assert _tally(lag=0.15, growth=growth)["same"][4] == passes


def test_as_good_as_the_own_model_alone_decides_on_the_held_out_samples():
    """A foreign model that beats the client's other cluster and is the only foreign model
    (so the best) is accepted when its held-out errors are within ε of the own model's and
    refused when they are ε + 0.2 above them, whichever way the gap is measured elsewhere."""
    rng = np.random.default_rng(2)
    n = 120
    held = np.zeros(n, dtype=bool)
    held[:40] = True
    own = np.exp(rng.normal(0, 0.02, n))
    other = np.exp(1.0 + rng.normal(0, 0.02, (1, n)))
    near = own * np.exp(0.1)
    far = own * np.exp(np.where(held, 0.5, 0.1))
    p_near, p_far = (_parts(own, f[None], other, held, epsilon=0.3)[:, 0] for f in (near, far))
    assert p_near.all()
    assert p_far.tolist() == [False, True, True]
