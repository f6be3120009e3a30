"""FedFCM with FedFuzzDB over Flower messages: :class:`FlowerClients`, and :func:`run`, the
method's server loop (the ``server`` column of :data:`fedclust.registry.METHODS`). The loop
is :func:`fedclust.fedfcm.loop.run`."""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.serverapp import Grid

from fedclust.common import CommonSettings
from fedclust.fcm.phases import Replies, Scaling
from fedclust.fedfcm import loop
from fedclust.fedfcm.keys import FedFCMSettings
from fedclust.results import RunRecorder
from strategies.common import check_each, connected_clients, require_honest
from strategies.fcm.family import FamilyClients, record_features, replies
from strategies.wire import fedfcm as wire


class FlowerClients(FamilyClients):
    """:class:`fedclust.fedfcm.loop.Clients` over Flower messages; every reply is checked
    (:mod:`strategies.wire.fedfcm`) before the loop sees it."""

    s: FedFCMSettings
    final_tables = False    # the evaluation tables of every K come with the index phase

    def local(self, rnd: int, centers: dict[int, np.ndarray], sc: Scaling
              ) -> Replies[loop.LocalCenters]:
        phase = f"round-{rnd}"
        ks = sorted(centers)
        ex = self.send(self.ids, wire.centers_request(centers, sc.shift, sc.scale), wire.LOCAL,
                       phase)
        fedavg = self.s.averaging == "fedavg"
        check_each(ex, wire.check_local(ks, sc.n_features, sc.box, sc.rows, fedavg,
                                        self.s.guard_bound(sc.n_features)), phase)
        got = {nid: local for nid, r in ex.replies.items()
               if (local := wire.read_local(r, ks, fedavg)) is not None}
        require_honest(ex, phase, len(got), len(self.ids), self.common)
        return replies(ex, got, [nid for nid in ex.replies if nid not in got])

    def index(self, centers: dict[int, np.ndarray], sc: Scaling) -> Replies[loop.IndexStats]:
        ks = sorted(centers)
        ex = self.send(self.ids, wire.centers_request(centers, sc.shift, sc.scale), wire.DB,
                       "fedfuzzdb")
        check_each(ex, wire.check_db(ks, sc.box, sc.rows, self.s.q,
                                     self.s.guard_bound(sc.n_features), self.s.evaluate),
                   "fedfuzzdb")
        got = {nid: stats for nid, r in ex.replies.items()
               if (stats := wire.read_index(r, ks, self.s.local_index, self.s.evaluate))
               is not None}
        withheld = [nid for nid in ex.replies if nid not in got]
        for nid in withheld:
            del ex.replies[nid]   # withheld by the privacy guard: nothing to add
        require_honest(ex, "fedfuzzdb", len(ex.replies), len(self.ids), self.common)
        return replies(ex, got, withheld)


def run(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    """``method=fedfcm``: the loop over the run's nodes; writes the run's arrays (and the index
    plot) into ``recorder``'s folder and returns the metrics."""
    s = FedFCMSettings.from_config(cfg)
    clients = FlowerClients(grid, connected_clients(grid, cfg), CommonSettings.from_config(cfg),
                            s, str(recorder.dir))
    metrics = loop.run(clients, s, recorder)
    record_features(recorder, cfg, clients)
    if cfg["plots"]:
        from fedclust.plots import plot_index_vs_k

        plot_index_vs_k(recorder.path("index_vs_k.png"), metrics["ks"], metrics["index"],
                        local=metrics.get("local_index"),
                        title=f"FedFuzzDB ({s.averaging} averaging)")
    return metrics
