"""FedFCM's clients as plain objects in one process: :class:`fedclust.fedfcm.loop.Clients` by
direct calls, with no messages.

The same client steps as the ClientApp (:mod:`client_apps.fcm_handlers`, through
:mod:`fedclust.fedfcm.client`), so :func:`fedclust.fedfcm.loop.run` over these clients follows
the same trajectory as a Flower run on the same rows. For tests, benchmarks and notebooks.
"""

from __future__ import annotations

import numpy as np

from fedclust.fcm.client import eval_codes
from fedclust.fcm.inmemory import InMemoryClients as _FamilyClients
from fedclust.fcm.phases import Replies, Scaling
from fedclust.fedfcm.client import index_stats, local_centers
from fedclust.fedfcm.keys import FedFCMSettings
from fedclust.fedfcm.loop import IndexStats, LocalCenters


class InMemoryClients(_FamilyClients):
    """``n`` clients holding the rows ``xs[i]`` (see :class:`fedclust.fcm.inmemory.
    InMemoryClients` for the parameters), for FedFCM."""

    s: FedFCMSettings
    final_tables = False

    def local(self, rnd: int, centers: dict[int, np.ndarray], sc: Scaling
              ) -> Replies[LocalCenters]:
        out: Replies[LocalCenters] = Replies()
        named = [(f"k{k}", centers[k]) for k in sorted(centers)]
        for i in self.ids:
            if self._silent(i):
                out.withheld.append(i)
                continue
            local, _ = local_centers(self.scaled(i, sc), named, self.s)
            out.got[i] = {int(name[1:]): v for name, v in local.items()}
        return out

    def index(self, centers: dict[int, np.ndarray], sc: Scaling) -> Replies[IndexStats]:
        out: Replies[IndexStats] = Replies()
        named = [(f"k{k}", centers[k]) for k in sorted(centers)]
        for i in self.ids:
            if self._silent(i):
                out.withheld.append(i)
                continue
            y = self.ys[i] if self.ys is not None and self.s.evaluate else None
            stats, local, tables = index_stats(self.scaled(i, sc), named, self.s, y)
            got = IndexStats({int(name[1:]): v for name, v in stats.items()})
            if local:
                got.local_index = list(local.values())
            if tables:
                got.codes = eval_codes(y)[0]
                got.tables = {int(name[1:]): t for name, t in tables.items()}
            out.got[i] = got
        return out
