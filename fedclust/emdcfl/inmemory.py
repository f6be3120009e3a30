"""EMD-CFL's clients as plain objects in one process: :class:`fedclust.emdcfl.clients.Clients`
by direct calls to the client steps of :mod:`fedclust.emdcfl.client`, with no messages.

The same steps, seeds and keys as a simulated ClientApp node (:mod:`client_apps.emdcfl_handlers`:
partition ``i``'s data, minibatch seeds from the run seed and ``i``, the X25519 pair derived
from the run seed and ``i``, pair seeds named by key ids), so :func:`fedclust.emdcfl.loop.run`
over these clients gives the clusters and accuracies of a simulated Flower run with the same
settings. For tests, benchmarks and notebooks::

    from fedclust.emdcfl import inmemory, loop
    from fedclust.results import MemoryRecord

    clients = inmemory.InMemoryClients.simulated(s, 8)
    metrics = loop.run(clients, s, MemoryRecord())

:class:`fedclust.emdcfl.batched.BatchedClients` is the same with every client of a phase
computed together (stacked on CUDA).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

from fedclust.emdcfl import client
from fedclust.emdcfl.clients import (
    Clouds,
    Evaluation,
    Final,
    Groups,
    Subspaces,
    Trained,
    Weights,
)
from fedclust.emdcfl.data import ClientSplit
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.emdcfl.privacy import key_id, simulated_keypair


class InMemoryClients:
    """Clients ``0 … n−1`` holding ``data[i]``; every client answers every call.

    Parameters
    ----------
    s : EMDCFLSettings
    data : sequence of ClientSplit
        Client ``i``'s train, validation and test splits (and its ground-truth group).
    """

    def __init__(self, s: EMDCFLSettings, data: Sequence[ClientSplit]) -> None:
        self.s, self.data = s, list(data)
        self.ids = list(range(len(self.data)))
        self.keys = [simulated_keypair(s.seed, i) for i in self.ids]
        self.device = client.device_for(s.device, simulated=True)

    @classmethod
    def simulated(cls, s: EMDCFLSettings, n: int) -> InMemoryClients:
        """``n`` clients holding the partitions of the run's simulated dataset."""
        return cls(s, [client.simulated_split(s, i, n) for i in range(n)])

    def _seed(self, i: int, rnd: int) -> int:
        return client.train_seed(self.s.seed, rnd, i)

    def train(self, rnd: int, models: Mapping[int, Weights], keygen: bool) -> Trained:
        t0, out = time.perf_counter(), Trained()
        for i in sorted(models):
            out.models[i], out.losses[i], out.counts[i] = client.train(
                self.s, self.data[i], models[i], rnd, self._seed(i, rnd), self.device)
            if keygen:
                out.pubs[i] = self.keys[i][1]
        out.seconds = time.perf_counter() - t0
        return out

    def ifca(self, rnd: int, models: Sequence[Weights]) -> Trained:
        t0, out = time.perf_counter(), Trained()
        for i in self.ids:
            (out.models[i], out.losses[i], out.counts[i], out.choices[i],
             _) = client.ifca(self.s, self.data[i], models, rnd, self._seed(i, rnd), self.device)
        out.seconds = time.perf_counter() - t0
        return out

    def embed(self, rnd: int, members: list[int], models: Mapping[int, Weights],
              pubs: Mapping[int, bytes]) -> Clouds:
        t0, out = time.perf_counter(), Clouds()
        for c in members:
            peers = [o for o in members if o != c]
            src, tgt, reference = client.embed_pairs(
                self.s, self.data[c], models[c], peers, pubs, (models[o] for o in peers),
                self.keys[c][0], key_id(self.keys[c][1]), lambda o: key_id(pubs[o]),
                self.device)
            out.replies[c] = {"src": src, "tgt": tgt, "reference": reference}
        out.seconds = time.perf_counter() - t0
        return out

    def subspaces(self) -> Subspaces:
        t0 = time.perf_counter()
        out = Subspaces(u={i: client.subspaces(self.s, self.data[i]) for i in self.ids})
        out.seconds = time.perf_counter() - t0
        return out

    def groups(self) -> Groups:
        return Groups(truth={i: int(self.data[i].cluster) for i in self.ids})

    def final(self, models: Mapping[int, Weights], found: Mapping[int, int]) -> Final:
        t0, out = time.perf_counter(), Final(answered=len(models))
        for i in sorted(models):
            result = client.test(self.s, self.data[i], models[i], self.device)
            if self.s.evaluate:
                ev = client.evaluation(self.s, self.data[i], models[i], result, self.device)
                out.evaluations[i] = Evaluation(ev["test-acc"], int(ev["cluster"]),
                                                len(self.data[i].y_test),
                                                ev.get("backdoor-acc"))
        out.seconds = time.perf_counter() - t0
        return out
