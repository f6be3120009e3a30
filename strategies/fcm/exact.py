"""Exact federated FCM over Flower messages: the plain-sums :class:`FlowerClients`, and
:func:`run`, the method's server loop (the ``server`` column of
:data:`fedclust.registry.METHODS`).

The loop is :func:`fedclust.fcm.loop.run`; with ``fcm.secure-aggregation`` its clients are
:class:`strategies.fcm.secure.SecureClients`, with ``fcm.incremental`` its update rule is
:class:`fedclust.fcm.loop.IncrementalRule`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.serverapp import Grid

from fedclust.common import CommonSettings
from fedclust.fcm import loop
from fedclust.fcm.keys import FCMSettings
from fedclust.fcm.phases import Scaling
from fedclust.results import RunRecorder
from strategies.common import check_each, connected_clients, require_honest
from strategies.fcm.family import FamilyClients, record_features, replies
from strategies.wire import fcm as wire


class FlowerClients(FamilyClients):
    """:class:`fedclust.fcm.loop.Clients` over plain Flower messages: the server sees each
    node's sums (and checks them, :func:`strategies.wire.fcm.check_sums`)."""

    s: FCMSettings

    def sums(self, rnd: int, sampled: list[int], centers: np.ndarray, sc: Scaling
             ) -> loop.RoundSums:
        c, f = centers.shape
        phase = f"round-{rnd}"
        ex = self.send(sampled, wire.centers_request(centers, sc.shift, sc.scale), wire.SUMS,
                       phase)
        passed = wire.sums_passing(ex.replies, c, f, sc.box, sc.rows, self.s.m)
        check_each(ex, wire.check_sums(c, f, sc.box, sc.rows, self.s.m,
                                       self.s.guard_bound(f)), phase, passed)
        by_node = {nid: sums for nid, r in ex.replies.items()
                   if (sums := passed.get(nid) or wire.read_sums(r)) is not None}
        require_honest(ex, phase, len(by_node), len(sampled), self.common)
        sums = list(by_node.values())
        u = np.sum([s[0] for s in sums], axis=0) if sums else np.zeros(c)
        ws = np.sum([s[1] for s in sums], axis=0) if sums else np.zeros((c, f))
        withheld = [nid for nid in ex.replies if nid not in by_node]
        return loop.RoundSums(u, ws, len(sums), replies(ex, by_node, withheld))


def run(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    """``method=exact-fcm``: the loop over the run's nodes; writes the run's arrays (and the
    shift plot) into ``recorder``'s folder and returns the metrics."""
    s = FCMSettings.from_config(cfg)
    if s.secure_aggregation:
        from strategies.fcm.secure import SecureClients as Clients
    else:
        Clients = FlowerClients
    clients = Clients(grid, connected_clients(grid, cfg), CommonSettings.from_config(cfg), s,
                      str(recorder.dir))
    metrics = loop.run(clients, s, recorder)
    record_features(recorder, cfg, clients)
    if cfg["plots"]:
        from fedclust.plots import plot_series

        plot_series(recorder.path("shift.png"), {"‖V(t+1) − V(t)‖_F": [
            h["shift"] for h in recorder.history]}, "round", "center shift", log=True,
            hline=s.epsilon)
    return metrics
