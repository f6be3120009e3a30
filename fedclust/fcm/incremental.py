r"""Incremental exact federated FCM: the server keeps every client's latest local sums.

With participation :math:`\gamma < 1` paper 004's round update uses only the sampled set
:math:`S_t`,

.. math:: v_c(t+1) = \frac{\sum_{k \in S_t} WS_c^{(k)}(t)}{\sum_{k \in S_t} U_c^{(k)}(t)},

so on a label-skewed partition the centers follow whichever clients were drawn. The
incremental rule (incremental EM, Neal & Hinton 1998) keeps, for every client :math:`k`, its
most recent sums :math:`(U^{(k)}, WS^{(k)})` and the round :math:`r_k` they were computed in
(from the centers :math:`V(r_k)` broadcast then); a round replaces only the answering clients'
entries and updates from the sum over **all** clients that have ever answered:

.. math:: v_c(t+1) = \frac{\sum_{k} WS_c^{(k)}(r_k)}{\sum_{k} U_c^{(k)}(r_k)},
          \qquad r_k = \text{the last round client } k \text{ answered}.

A client that has never answered contributes nothing. At a fixed point :math:`V^*` every
stored sum is :math:`(U^{(k)}(V^*), WS^{(k)}(V^*))`, whose total is the pooled sum, so the
fixed points are those of centralized FCM whatever the participation pattern; with
:math:`\gamma = 1` every :math:`r_k = t` and the rule is paper 004's.

Stopping: one round moves the centers only by the answering clients' share, so a small
:math:`\|V(t+1)-V(t)\|` proves little. The *drift*
:math:`\max_k \|V(t+1) - V(r_k)\|_F` measures how far the centers are from those each stored
sum was computed from; the loop stops when every client has answered and the drift is below
:math:`\varepsilon` (with :math:`\gamma = 1` the drift is the shift).

This module is numpy only (no Flower): :class:`LatestSums` is the server's store and
:func:`converged` the stopping rule; :class:`fedclust.fcm.loop.IncrementalRule` uses both in
the server's loop.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping

import numpy as np
from numpy.typing import ArrayLike

from fedclust.fcm import Float


class LatestSums:
    r"""The server's store of each client's most recent local sums.

    Per client :math:`k` it holds :math:`U^{(k)} \in \mathbb{R}^C`,
    :math:`WS^{(k)} \in \mathbb{R}^{C \times F}` and the round :math:`r_k` they came from;
    per round still referenced by some :math:`r_k`, the centers :math:`V(r_k)` the server
    broadcast in it (the server's own numbers). Nothing per row: the same per-client sums the
    plain rule sees each round, now kept between rounds.

    Parameters
    ----------
    n_clusters, n_features : int
        ``C`` and ``F``: every stored ``U`` has shape ``(C,)``, every ``WS`` ``(C, F)``.
    """

    def __init__(self, n_clusters: int, n_features: int) -> None:
        self.n_clusters, self.n_features = int(n_clusters), int(n_features)
        self._u: dict[Hashable, Float] = {}
        self._ws: dict[Hashable, Float] = {}
        self._round: dict[Hashable, int] = {}
        self._sent: dict[int, Float] = {}

    def replace(self, rnd: int, centers: ArrayLike,
                sums: Mapping[Hashable, tuple[ArrayLike, ArrayLike]]) -> None:
        """Store the sums of the clients that answered round ``rnd``; keep everyone else's.

        Parameters
        ----------
        rnd : int
            The round; must not be older than a round already stored.
        centers : array of shape (C, F)
            The centers ``V(rnd)`` broadcast in this round (the sums were computed from them).
        sums : mapping client -> (U, WS)
            The answering clients' local sums (paper 004 Algorithm 2).
        """
        if self._round and rnd < max(self._round.values()):
            raise ValueError(f"round {rnd} is older than round {max(self._round.values())} "
                             f"already stored")
        c, f = self.n_clusters, self.n_features
        checked = {}
        for client, (u, ws) in sums.items():
            u = np.array(u, dtype=np.float64)
            ws = np.array(ws, dtype=np.float64)
            if u.shape != (c,) or ws.shape != (c, f):
                raise ValueError(f"client {client!r}: U {u.shape} and WS {ws.shape}, expected "
                                 f"({c},) and ({c}, {f})")
            if not (np.all(np.isfinite(u)) and np.all(np.isfinite(ws))):
                raise ValueError(f"client {client!r}: non-finite local sums")
            checked[client] = (u, ws)
        if not checked:
            return
        for client, (u, ws) in checked.items():
            self._u[client], self._ws[client], self._round[client] = u, ws, int(rnd)
        self._sent[int(rnd)] = np.array(centers, dtype=np.float64)
        live = set(self._round.values())
        self._sent = {r: v for r, v in self._sent.items() if r in live}

    def totals(self) -> tuple[Float, Float]:
        r""":math:`(\sum_k U^{(k)}, \sum_k WS^{(k)})` over every stored client (in sorted
        client order, so the result does not depend on the order of the replies); zeros when
        no client has answered yet."""
        clients = self.clients()
        if not clients:
            return np.zeros(self.n_clusters), np.zeros((self.n_clusters, self.n_features))
        return (np.sum([self._u[k] for k in clients], axis=0),
                np.sum([self._ws[k] for k in clients], axis=0))

    def clients(self) -> list[Hashable]:
        """The clients with sums on the server, sorted."""
        return sorted(self._round, key=_order)

    def __len__(self) -> int:
        return len(self._round)

    def round_of(self, client: Hashable) -> int | None:
        """The round ``r_k`` of the client's stored sums (None: it has never answered)."""
        return self._round.get(client)

    def oldest_age(self, rnd: int) -> int | None:
        """``rnd − min_k r_k``: how many rounds old the oldest stored sums are (None: empty)."""
        return rnd - min(self._round.values()) if self._round else None

    def drift(self, centers: ArrayLike, clients: Iterable[Hashable] | None = None) -> float:
        r""":math:`\max_k \|V - V(r_k)\|_F`: how far ``centers`` are from the centers the
        stored sums were computed from, over ``clients`` (default: every stored client; inf
        when none of them has sums)."""
        keys = self._round if clients is None else [k for k in clients if k in self._round]
        rounds = {self._round[k] for k in keys}
        if not rounds:
            return math.inf
        v = np.asarray(centers, dtype=np.float64)
        return max(float(np.linalg.norm(v - self._sent[r])) for r in rounds)

    def arrays(self) -> dict[str, Float]:
        """Everything the store holds as named arrays (``U/<client>``, ``WS/<client>``,
        ``round/<client>``, ``sent/<round>``): what a server operator could read."""
        out: dict[str, Float] = {}
        for k in self.clients():
            out[f"U/{k}"], out[f"WS/{k}"] = self._u[k], self._ws[k]
            out[f"round/{k}"] = np.array([self._round[k]])
        out.update({f"sent/{r}": v for r, v in sorted(self._sent.items())})
        return out


def _order(client: Hashable) -> tuple[str, object]:
    # node ids are ints; anything else sorts by its text after the ints
    return ("", client) if isinstance(client, (int, np.integer)) else ("~", str(client))


def converged(store: LatestSums, required: Iterable[Hashable], centers: ArrayLike,
              tol: float) -> bool:
    """The incremental stopping rule: every ``required`` client holds sums on the server and
    their :meth:`LatestSums.drift` from the new centers is below ``tol``.

    ``required`` are the clients that can still answer: the server loop leaves out those the
    privacy guard keeps silent and those that dropped (their latest sums stay in the total, a
    constant part of the update, so their age does not hold the run back).
    """
    required = set(required)
    return required <= set(store.clients()) and store.drift(centers, required) < tol
