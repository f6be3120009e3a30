"""FedCRef clients as plain objects in one process: :class:`~fedclust.fedcref.algorithm.Clients`
by direct calls to the client steps of :mod:`fedclust.fedcref.client`, with no messages.

The same client steps and seeds as the ClientApp (``client_apps.fedcref_handlers``), so
:func:`fedclust.fedcref.algorithm.run` over these clients follows the same trajectory as a
Flower run on the same data and start. For tests and probes of the algorithm.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref import client as core
from fedclust.fedcref import wire
from fedclust.fedcref.algorithm import (
    Contribution,
    LocalReply,
    Model,
    Node,
    RefineReply,
    foreign_nodes,
)
from fedclust.fedcref.keys import ClientSettings


class InMemoryClients:
    """``n`` clients holding ``xs[i]`` with start labels ``starts[i]`` (0..K_i−1).

    Parameters
    ----------
    xs : samples of each client, (n_i, d) in [0, 1]
    starts : initial local clustering of each client
    ks : K_i of each client (default: ``starts[i].max() + 1``)
    cfg : a validated FedCRef run config (``fedclust.config.validate``), or its
        :class:`~fedclust.fedcref.keys.ClientSettings`
    ys : true classes of each client, for the ``eval`` histograms only (optional)

    Clients are numbered in the order of their identity key (:func:`core.client_key`), as
    the strategy numbers nodes; ``order[i]`` is the position in ``xs`` of client ``i``. They
    compute on ``fedcref.device`` with ``fedcref.torch-threads`` torch threads (set for the
    process, as a node sets it).
    """

    def __init__(self, xs: Sequence[NDArray], starts: Sequence[NDArray],
                 cfg: Mapping[str, Any] | ClientSettings, ks: Sequence[int] | None = None,
                 ys: Sequence[NDArray] | None = None) -> None:
        self.s = cfg if isinstance(cfg, ClientSettings) else ClientSettings.from_config(cfg)
        keys = [core.client_key(x) for x in xs]
        self.order = sorted(range(len(xs)), key=lambda i: keys[i])
        self.keys = [keys[i] for i in self.order]
        self.xs = [np.asarray(xs[i], dtype=np.float32) for i in self.order]
        self.ys = [np.asarray(ys[i]) for i in self.order] if ys is not None else None
        kk = [int(np.max(s)) + 1 for s in starts] if ks is None else list(ks)
        self.states = [core.ClientState(labels=np.asarray(starts[i], dtype=np.int64).copy(),
                                        k=int(kk[i])) for i in self.order]
        self.n = len(xs)
        self.evaluated: list[set[str]] = [set() for _ in range(self.n)]
        self.device = self.s.torch_device()
        import torch

        torch.set_num_threads(self.s.torch_threads)     # as every node does (the handlers)

    def _seed(self, i: int, seed: int) -> int:
        return core.derive_seed(seed, self.keys[i])

    def _hist(self, i: int) -> NDArray[np.int64] | None:
        if self.ys is None or not self.s.evaluate:
            return None
        st = self.states[i]
        return core.class_histograms(st.labels, self.ys[i], st.k, int(self.ys[i].max()) + 1)

    def _run(self, calls: list[ae.TrainCall]) -> list[ae.Params]:
        """The trained models of every training call of a phase (here one after another)."""
        return [c.run(self.device) for c in calls]

    def local(self, t: int, active: Collection[int], seed: int) -> dict[int, LocalReply]:
        train = [i for i, st in enumerate(self.states)
                 if i in active or not ae.n_models(st.models)]
        plans = {i: core.plan_local(self.states[i], self.xs[i], self.s, self._seed(i, seed))
                 for i in train}
        trained = self._run([c for i in train for c in plans[i].calls])
        for i in train:
            n = len(plans[i].calls)
            core.finish_local(self.states[i], self.xs[i], plans[i], trained[:n], self.device)
            trained = trained[n:]
        out = {}
        for i, st in enumerate(self.states):
            reply = LocalReply(k=st.k, version=st.version)
            if i in plans:
                sent = ae.to_numpy(wire.roundtrip_params(st.models, self.s.wire))
                reply.models = {int(q): {k: v[j:j + 1] for k, v in sent.items()}
                                for j, q in enumerate(st.model_clusters)}
                reply.modelled = [int(q) for q in st.model_clusters]
            else:
                pruned = core.drop_emptied(st, self.s)
                if pruned:
                    reply.modelled = [int(q) for q in st.model_clusters]
            reply.hist = self._hist(i)
            out[i] = reply
        return out

    def associate(self, t: int, models: Mapping[Node, tuple[int, Model]], asked: list[int],
                  only: Mapping[int, list[Node]] | None = None) -> dict[int, NDArray[np.bool_]]:
        return self._associate(t, models, asked, only,
                               lambda node: ae.from_numpy(models[node][1]))

    def _associate(self, t: int, models: Mapping[Node, tuple[int, Model]], asked: list[int],
                   only: Mapping[int, list[Node]] | None,
                   model: Callable[[Node], ae.Params]) -> dict[int, NDArray[np.bool_]]:
        """:meth:`associate` with ``model(node)``: the relayed model as a client decodes it."""
        out = {}
        for i in asked:
            foreign = foreign_nodes(models, i, only)
            keys = [f"{c}:{q}:{models[(c, q)][0]}" for c, q in foreign]
            new = {key: model(node) for key, node in zip(keys, foreign, strict=True)
                   if key not in self.states[i].cache}
            acc, missing, _ = core.associate(self.states[i], self.xs[i], keys, new, self.s,
                                             self.device)
            assert not missing
            out[i] = acc
        return out

    def community_round(self, t: int, rnd: int, params: ae.Params,
                        members: dict[int, list[tuple[int, list[int]]]], seed: int
                        ) -> dict[int, list[Contribution]]:
        order = sorted(members)
        calls, counts = [], []
        for i in order:
            mine = self._travel([p[[g for g, _ in members[i]]] for p in params])
            call, n = core.community_call(
                self.xs[i], self.states[i].labels, mine,
                [np.asarray(qs, dtype=np.int64) for _, qs in members[i]], self.s,
                self._seed(i, seed))
            calls.append(call)
            counts.append(n)
        out = {}
        for i, trained, n in zip(order, self._run(calls), counts, strict=True):
            trained = self._travel(trained)
            out[i] = [Contribution(g, [p[j:j + 1] for p in trained], float(n[j]))
                      for j, (g, _) in enumerate(members[i])]
        return out

    def _travel(self, params: ae.Params) -> ae.Params:
        """``params`` as a message in the run's wire format delivers them."""
        return wire.roundtrip_params(params, self.s.wire)

    def refine(self, t: int, targets: list[int], params: ae.Params,
               members: dict[int, list[tuple[int, list[int]]]]) -> dict[int, RefineReply]:
        out = {}
        mode = self.s.refinement
        for i in targets:
            offer = core.refine_inputs(params, members.get(i, []), mode)
            if ae.n_models(offer.models):
                offer = replace(offer, models=self._travel(offer.models))
            r = core.refine(self.states[i], self.xs[i], offer, mode, self.device)
            out[i] = RefineReply(r.agreement, self._hist(i),
                                 [bool(b) for b in r.confirmed] if mode.confirms else None,
                                 r.community_share)
        return out

    def note_communities(self, t: int, members: dict[int, list[tuple[int, list[int]]]]
                         ) -> None:
        """Nothing to do: these clients keep no results for a data owner."""
