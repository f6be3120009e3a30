"""Exact federated FCM's clients as plain objects in one process:
:class:`fedclust.fcm.loop.Clients` by direct calls, with no messages.

The same client steps as the ClientApp (:mod:`client_apps.fcm_handlers`: the privacy guard,
the federated scaling, :func:`fedclust.fcm.local_sums`, the objective, the evaluation tables),
so :func:`fedclust.fcm.loop.run` over these clients follows the same trajectory as a Flower run
on the same rows (plain sums: the server sees each client's). For tests, benchmarks and
notebooks::

    from fedclust.fcm import inmemory, loop
    from fedclust.results import MemoryRecord

    record = MemoryRecord()
    metrics = loop.run(inmemory.InMemoryClients(parts, s), s, record)
    record.arrays["centers_unscaled"]
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray

from fedclust import fcm
from fedclust.data import scaling
from fedclust.fcm.client import eval_codes, eval_table
from fedclust.fcm.keys import FamilySettings
from fedclust.fcm.loop import RoundSums
from fedclust.fcm.phases import Client, FinalStats, NodeStats, Replies, Scaling

Float = NDArray[np.float64]


class InMemoryClients:
    """``n`` clients holding the rows ``xs[i]`` (in the data's own units).

    Parameters
    ----------
    xs : sequence of arrays (n_i, F)
        Each client's rows.
    s : FamilySettings
        The run's settings (the privacy guard, the fuzzifier, ``evaluate``).
    ys : sequence of int arrays (n_i,), optional
        Each client's label codes, for the evaluation tables only.

    Client ``i`` is ``xs[i]``; every client answers every message.
    """

    #: whether the final phase brings the evaluation tables (exact FCM; FedFCM's come with
    #: the index phase)
    final_tables = True

    def __init__(self, xs: Sequence[ArrayLike], s: FamilySettings,
                 ys: Sequence[ArrayLike] | None = None) -> None:
        self.xs = [np.asarray(x, dtype=np.float64) for x in xs]
        self.ys = None if ys is None else [np.asarray(y) for y in ys]
        self.s = s
        self.ids: list[Client] = list(range(len(self.xs)))
        self._scaled: tuple[int, list[Float]] | None = None

    def name(self, client: Client) -> str:
        return f"client {client}"

    def scaled(self, i: int, sc: Scaling) -> Float:
        """Client ``i``'s rows in the run's scaling (computed once per scaling)."""
        if self._scaled is None or self._scaled[0] != id(sc):
            self._scaled = (id(sc), [scaling.apply(x, sc.shift, sc.scale) for x in self.xs])
        return self._scaled[1][i]

    def _silent(self, i: int) -> bool:
        return self.s.withholds(*self.xs[i].shape)

    def statistics(self) -> Replies[NodeStats]:
        out: Replies[NodeStats] = Replies()
        for i, x in enumerate(self.xs):
            if self._silent(i):
                out.withheld.append(i)
            else:
                out.got[i] = NodeStats(scaling.column_stats(x), int(x.shape[0]))
        return out

    def sums(self, rnd: int, sampled: list[Client], centers: Float, sc: Scaling) -> RoundSums:
        c, f = centers.shape
        out: Replies[tuple[Float, Float]] = Replies()
        for i in sampled:
            if self._silent(i):
                out.withheld.append(i)
            else:
                out.got[i] = fcm.local_sums(self.scaled(i, sc), centers, self.s.m)
        sums = list(out.got.values())
        u = np.sum([s[0] for s in sums], axis=0) if sums else np.zeros(c)
        ws = np.sum([s[1] for s in sums], axis=0) if sums else np.zeros((c, f))
        return RoundSums(u, ws, len(sums), out)

    def final(self, centers: Float, sc: Scaling) -> FinalStats:
        out: Replies[float] = Replies()
        tables = []
        for i in self.ids:
            if self._silent(i):
                out.withheld.append(i)
                continue
            x = self.scaled(i, sc)
            out.got[i] = fcm.objective(x, centers, self.s.m)
            if self.final_tables and self.s.evaluate and self.ys is not None:
                tables.append((eval_codes(self.ys[i])[0], eval_table(self.ys[i], x, centers)))
        return FinalStats(float(sum(out.got.values())), out, withheld=len(out.withheld),
                          tables=tables, eval_nodes=len(tables),
                          eval_rows=sum(int(t.sum()) for _, t in tables))
