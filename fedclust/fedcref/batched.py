"""FedCRef's in-memory clients with every client of a phase trained as one computation.

:class:`BatchedClients` is :class:`~fedclust.fedcref.inmemory.InMemoryClients` whose local
phase (every active client's cluster autoencoders) and community rounds (every member's copy
of every community model) run as one stacked :func:`fedclust.fedcref.autoencoder.train`
(:func:`~fedclust.fedcref.autoencoder.train_calls`): the autoencoders of all clients share
one batched matrix product per layer and one Adam step per minibatch, while each keeps its
own data, its own shuffling stream (the one its client's own call would give it), its own
Adam state and early stopping. Nothing waits for the host inside an epoch. The association's
and refinement's reconstruction errors run on the same device (``fedcref.device``).

On the CPU the default trains each client's models in its own call (bit for bit the
per-client path); ``stack=True`` merges there too (the tests compare both on the CPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref.algorithm import Model, Node
from fedclust.fedcref.inmemory import InMemoryClients
from fedclust.fedcref.keys import ClientSettings

#: whether the in-process engine's batched handlers merge the clients' training calls
#: (None: on CUDA only)
MERGE: bool | None = None


def merged(device: str) -> bool:
    """Whether training calls on ``device`` run merged (:data:`MERGE`)."""
    return MERGE if MERGE is not None else str(device).startswith("cuda")


class BatchedClients(InMemoryClients):
    """:class:`~fedclust.fedcref.inmemory.InMemoryClients` (same parameters) whose training
    phases run as one computation.

    Parameters
    ----------
    stack : bool or None
        Merge every client's training calls into one; None: on CUDA only.

    Attributes
    ----------
    seconds : dict
        Wall seconds of the training calls, summed over the run (``train``).
    """

    def __init__(self, xs: Sequence[NDArray], starts: Sequence[NDArray],
                 cfg: Mapping[str, Any] | ClientSettings, ks: Sequence[int] | None = None,
                 ys: Sequence[NDArray] | None = None, stack: bool | None = None) -> None:
        super().__init__(xs, starts, cfg, ks, ys)
        self.stack = stack
        self.seconds = {"train": 0.0}

    @property
    def stacked(self) -> bool:
        return self.stack if self.stack is not None else self.device.startswith("cuda")

    def associate(self, t: int, models: Mapping[Node, tuple[int, Model]], asked: list[int],
                  only: Mapping[int, list[Node]] | None = None) -> dict[int, NDArray[np.bool_]]:
        """:meth:`InMemoryClients.associate` with every relayed model decoded and moved to
        the device once for all clients."""
        on_device: dict[Node, ae.Params] = {}

        def model(node: Node) -> ae.Params:
            if node not in on_device:
                on_device[node] = [p.to(self.device) for p in ae.from_numpy(models[node][1])]
            return on_device[node]

        return self._associate(t, models, asked, only, model)

    def _run(self, calls: list[ae.TrainCall]) -> list[ae.Params]:
        import time

        t0 = time.perf_counter()
        out = ae.train_calls(calls, self.device, merge=self.stacked)
        self.seconds["train"] += time.perf_counter() - t0
        return out
