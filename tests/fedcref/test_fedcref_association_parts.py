"""Each part of FedCRef's confident association test, on a planted case where that part alone
decides (the two others hold for every foreign model).

A planted bug flipped the sign of the first part ("as good as the own model": the foreign
model's log error minus the own one's, at most ε, on most held-out samples) and no algorithm,
safety or end-to-end test noticed: a foreign model far *worse* than the own one was then
accepted. The errors here are exact multiples of the own model's, so each part's count is
all or nothing and its sign test is far from its level β.
"""

from __future__ import annotations

import numpy as np

from fedclust.fedcref.rules import Confident


def confident_parts(own, foreign, others, held, epsilon, beta, delta=None, growth=0.0):
    """(3, F) bool: the parts of :class:`~fedclust.fedcref.rules.Confident`."""
    return Confident(epsilon, delta, beta, growth).parts(own, foreign, others, held)


def confident_accepts(own, foreign, others, held, epsilon, beta, delta=None, growth=0.0):
    return Confident(epsilon, delta, beta, growth).accepts(own, foreign, others, held)


N, H = 40, 20                   # samples of the cluster, the first H held out
EPS, BETA, DELTA = 0.3, 0.05, 0.1
OWN = np.random.default_rng(0).uniform(0.5, 1.5, N)     # the own model's errors
HELD = np.arange(N) < H


def _times(log_ratio: float) -> np.ndarray:
    """Errors ``e^log_ratio`` times the own model's on every sample."""
    return OWN * np.exp(log_ratio)


def test_as_good_as_the_own_model_alone_decides():
    # within ε of the own model, far better than it, far worse than it; the client's other
    # cluster model is far worse than all three on every sample
    foreign = np.stack([_times(0.1), _times(-1.0), _times(1.0)])
    others = _times(3.0)[None]
    parts = confident_parts(OWN, foreign, others, HELD, EPS, BETA)
    assert parts.tolist() == [[True, True, False], [True, True, True], [True, True, True]]
    assert confident_accepts(OWN, foreign, others, HELD, EPS, BETA).tolist() == [
        True, True, False]


def test_as_good_as_the_best_foreign_model_alone_decides():
    # both within ε of the own model and better than the other cluster's model; the second
    # trails the best foreign model by 0.15 > δ on every sample
    foreign = np.stack([_times(0.05), _times(0.2)])
    others = _times(3.0)[None]
    parts = confident_parts(OWN, foreign, others, HELD, EPS, BETA, DELTA)
    assert parts.tolist() == [[True, True], [True, False], [True, True]]
    assert confident_accepts(OWN, foreign, others, HELD, EPS, BETA, DELTA).tolist() == [
        True, False]
    # without δ there is no comparison with the best: both accepted
    assert confident_accepts(OWN, foreign, others, HELD, EPS, BETA).tolist() == [True, True]


def test_better_than_the_other_own_cluster_models_alone_decides():
    # both within ε of the own model; the client's other cluster model explains q's samples
    # only a little worse than q's own (×e^0.2): the first foreign model beats it on every
    # sample, the second (×e^0.25) on none
    foreign = np.stack([_times(0.1), _times(0.25)])
    others = _times(0.2)[None]
    parts = confident_parts(OWN, foreign, others, HELD, EPS, BETA)
    assert parts.tolist() == [[True, True], [True, True], [True, False]]
    assert confident_accepts(OWN, foreign, others, HELD, EPS, BETA).tolist() == [True, False]
    # each other cluster counts: a second one that the first foreign model cannot beat on
    # most of the samples q explains better refuses it too
    two = np.stack([_times(3.0), _times(0.05)])
    assert confident_accepts(OWN, foreign[:1], two, HELD, EPS, BETA).tolist() == [False]
