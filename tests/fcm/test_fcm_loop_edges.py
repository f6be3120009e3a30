"""Edges of exact federated FCM's server loop (paper 004, Algorithm 1) that a planted bug
crossed without a test failing: the number of clients a round samples, ⌈γM⌉."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedclust.config import validate
from fedclust.fcm import inmemory, loop
from fedclust.fcm.keys import FCMSettings
from fedclust.results import MemoryRecord


def _clients(m: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(20, 2)) + (i % 2) * 4 for i in range(m)]


@pytest.mark.parametrize(("m", "fraction"), [(5, 0.41), (7, 0.5), (4, 0.5), (3, 1.0)])
def test_a_round_samples_the_ceiling_of_gamma_m_clients(m, fraction):
    # γM = 2.05 and 3.5 round up (3 and 4 clients, not 2 and 3); 2 and 3 are exact
    cfg = validate({"method": "exact-fcm", "dataset": "blobs", "num-clients": m,
                    "fcm.n-clusters": 2, "fcm.fraction": fraction, "fcm.max-rounds": 3,
                    "fcm.epsilon": 0.0, "plots": False, "seed": 0})
    s = FCMSettings.from_config(cfg)
    record = MemoryRecord()
    loop.run(inmemory.InMemoryClients(_clients(m), s), s, record)
    want = math.ceil(round(fraction * m, 9))
    assert [h["sampled"] for h in record.history] == [want] * 3
    assert [h["contributed"] for h in record.history] == [want] * 3


def test_a_round_nobody_contributed_to_proves_no_convergence():
    """Paper 004's stop ‖V(t+1) − V(t)‖ < ε counts only in a round somebody contributed to:
    with no sums the centers stay put (shift 0), which says nothing about convergence."""
    centers = np.zeros((2, 2))
    rule = loop.RoundRule(epsilon=1e-3)
    nobody = loop.RoundSums(np.zeros(2), np.zeros((2, 2)), contributed=0)
    somebody = loop.RoundSums(np.ones(2), np.zeros((2, 2)), contributed=1)
    assert not rule.converged(0.0, nobody, centers)
    assert rule.converged(0.0, somebody, centers)
    assert not rule.converged(1e-3, somebody, centers)          # strictly below ε
