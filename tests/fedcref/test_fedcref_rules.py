"""FedCRef's association rules (fedclust/fedcref/rules.py), one planted case per part: in each,
that part alone decides, so removing it or flipping its comparison changes the answer.

Errors are built in log space around an own model's errors ``own``: ``own * e^g`` is a model
``g`` worse (in log error) on every sample."""

from __future__ import annotations

import numpy as np
import pytest

from fedclust.config import validate
from fedclust.fedcref.association import accept_matrix
from fedclust.fedcref.keys import ClientSettings
from fedclust.fedcref.rules import Calibrated, Cluster, Confident, Eq2, Ratio

N, HELD = 200, 40


def _own(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Errors of an own model on N samples, the first HELD of them held out from its training."""
    own = np.exp(np.random.default_rng(seed).normal(0.0, 0.3, N))
    held = np.zeros(N, dtype=bool)
    held[:HELD] = True
    return own, held


def test_part_one_a_foreign_model_must_be_within_the_margin_of_the_own_model() -> None:
    # both foreign models are as good as the best on most samples (the held-out share is small)
    # and beat the client's other model everywhere; model 1 is e^0.5 worse than the own model
    # on the held-out samples: beyond the margin 0.3
    own, held = _own()
    far = own.copy()
    far[held] *= np.exp(0.5)
    foreign, others = np.stack([own * np.exp(0.01), far]), (own * 3.0)[None]
    rule = Confident(margin=0.3, best_margin=0.1, beta=0.02)
    parts = rule.parts(own, foreign, others, held)
    assert parts.tolist() == [[True, False], [True, True], [True, True]]
    assert rule.accepts(own, foreign, others, held).tolist() == [True, False]
    # a wider margin lets it through: the margin is what decided
    assert Confident(margin=0.6, best_margin=0.1, beta=0.02).accepts(
        own, foreign, others, held).tolist() == [True, True]
    # "within the margin" must hold on most held-out samples, shown by the sign test: on 25 of
    # the 40 (P(Bin(40, 1/2) >= 25) = 0.08 > beta) it is not shown, on 32 of them it is
    for within, shown in ((25, False), (32, True)):
        some = own.copy()
        some[within:HELD] *= np.exp(0.5)
        assert rule.parts(own, some[None], others, held)[0].tolist() == [shown], within


def test_part_two_a_foreign_model_must_be_within_best_margin_of_the_best_foreign_model() -> None:
    # model 1 is e^0.2 worse than model 0 on every sample: within the margin (0.3) of the own
    # model and better than the other cluster's model, but 0.2 > best-margin 0.1 behind the best
    own, held = _own(1)
    foreign, others = np.stack([own, own * np.exp(0.2)]), (own * 3.0)[None]
    rule = Confident(margin=0.3, best_margin=0.1, beta=0.02)
    assert rule.parts(own, foreign, others, held).tolist() == [[True, True], [True, False],
                                                               [True, True]]
    assert rule.accepts(own, foreign, others, held).tolist() == [True, False]
    # the order of the models does not matter: the best is the lowest mean log error
    assert rule.accepts(own, foreign[::-1], others, held).tolist() == [False, True]
    # without the comparison with the best (best_margin=None) both are accepted
    assert Confident(margin=0.3, best_margin=None, beta=0.02).accepts(
        own, foreign, others, held).tolist() == [True, True]


def test_part_three_a_foreign_model_must_beat_the_clients_other_cluster_models() -> None:
    # the client's other model is e^0.1 worse than the own one: model 0 (e^0.05) beats it on
    # every sample, model 1 (e^0.2) on none, though it is within the margin of the own model
    own, held = _own(2)
    foreign = np.stack([own * np.exp(0.05), own * np.exp(0.2)])
    others = (own * np.exp(0.1))[None]
    rule = Confident(margin=0.3, best_margin=None, beta=0.02)
    assert rule.parts(own, foreign, others, held).tolist() == [[True, True], [True, True],
                                                               [True, False]]
    assert rule.accepts(own, foreign, others, held).tolist() == [True, False]
    # every other cluster counts: a second, weaker one does not rescue model 1
    both = np.stack([others[0], own * 5.0])
    assert rule.accepts(own, foreign, both, held).tolist() == [True, False]
    # with no other cluster there is no "different" anchor: nothing is accepted
    assert not rule.accepts(own, foreign, np.zeros((0, N)), held).any()


@pytest.mark.parametrize(("held_out", "decided"), [(5, False), (6, True)])
def test_the_confident_test_abstains_when_the_held_out_samples_are_too_few(
        held_out: int, decided: bool) -> None:
    # a foreign model identical to the own one: with h held-out samples the best the sign test
    # can show is P(Bin(h, 1/2) >= h) = 2^-h, above beta = 0.02 for h = 5 (1/32), below for 6
    own, _ = _own(3)
    held = np.zeros(N, dtype=bool)
    held[:held_out] = True
    others = (own * 3.0)[None]
    ok = Confident(margin=0.3, best_margin=0.1, beta=0.02).accepts(own, own[None], others, held)
    assert ok.tolist() == [decided]


def test_a_cluster_below_the_minimum_size_abstains() -> None:
    # cluster 0 has 6 samples, cluster 1 the rest; a foreign model equal to cluster 0's own
    # model passes eq. (2) on them, unless the rule's minimum size exceeds 6
    labels = np.r_[np.zeros(6, int), np.ones(N - 6, int)]
    own = np.stack([np.linspace(1.0, 2.0, N), np.full(N, 5.0)])
    foreign = own[:1].copy()
    assert accept_matrix(labels, own, foreign, Eq2(0.2, 0.75, min_size=6))[0].tolist() == [True]
    assert accept_matrix(labels, own, foreign, Eq2(0.2, 0.75, min_size=7))[0].tolist() == [False]


def test_the_settings_choose_the_minimum_size_and_the_rule_once() -> None:
    def settings_with(name: str) -> ClientSettings:
        cfg = validate({"method": "fedcref", "fedcref.assoc-rule": name,
                        "fedcref.min-cluster-size": 7})
        return ClientSettings.from_config(cfg)

    s = settings_with("confident")
    assert s.association_rule == Confident(0.3, 0.1, 0.02, 0.3, min_size=7)
    assert s.association_rule is s.association_rule           # built once
    for name, rule in (("eq2", Eq2(0.2, 0.75, 7)), ("ratio", Ratio(0.15, 0.5, 7)),
                       ("calibrated", Calibrated(0.9, 0.5, 7))):
        assert settings_with(name).association_rule == rule


def test_the_ratio_rule_accepts_within_a_factor_e_epsilon_on_held_out_samples() -> None:
    own, held = _own(4)
    near, far = own * np.exp(0.1), own * np.exp(0.2)
    far[~held] = own[~held]            # as good as the own model where the own model trained
    near[~held] *= 100.0               # far worse there: the training samples are not looked at
    c = Cluster(0, own[None], np.stack([near, far]), held)
    v = Ratio(epsilon=0.15).test(c)
    assert v.ok.tolist() == [True, False]
    np.testing.assert_allclose(v.ratio, [0.1, 0.2])
    assert Ratio(epsilon=0.25).test(c).ok.tolist() == [True, True]
    # the quantile: 30 % of the held-out samples e^0.5 worse fail the 0.75-quantile, not the median
    part = own.copy()
    part[:12] *= np.exp(0.5)
    c = Cluster(0, own[None], part[None], held)
    assert Ratio(0.15, 0.5).test(c).ok.tolist() == [True]
    assert Ratio(0.15, 0.75).test(c).ok.tolist() == [False]


def test_the_eq2_rule_accepts_when_enough_normalised_gaps_are_below_theta() -> None:
    # gaps |e_own - e_foreign|: 80 % of the samples 0, 20 % 1 -> normalised 0 and 1;
    # Pr{D <= theta} = 0.8 for any theta < 1
    own = np.linspace(1.0, 2.0, 100)
    foreign = own.copy()
    foreign[80:] += 1.0
    c = Cluster(0, own[None], foreign[None])
    assert Eq2(theta=0.2, alpha=0.75).test(c).ok.tolist() == [True]
    assert Eq2(theta=0.2, alpha=0.85).test(c).ok.tolist() == [False]
    # theta decides: gaps 0, 0.01, ..., 0.99 normalise to 0..1; Pr{D <= theta} ~ theta
    ramp = own + np.arange(100) / 100.0
    c = Cluster(0, own[None], ramp[None])
    assert Eq2(theta=0.8, alpha=0.75).test(c).ok.tolist() == [True]
    assert Eq2(theta=0.7, alpha=0.75).test(c).ok.tolist() == [False]
    np.testing.assert_allclose(Eq2(theta=0.8).test(c).score, [0.80])
