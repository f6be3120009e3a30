"""What EMD-CFL's server loop and its baselines' ask of the clients (:class:`Clients`), what
each phase answers, and the run's traffic accounting; without Flower.

Two implementations: Flower messages (:class:`strategies.emdcfl.FlowerClients`, which checks
every reply and drops the nodes that fail) and direct calls in one process
(:class:`fedclust.emdcfl.inmemory.InMemoryClients`). A client missing from a phase's answers
did not answer, or its reply was rejected; ``failed`` names it with the reason.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

LOG = logging.getLogger("fedclust")
Weights = list[NDArray[np.float32]]
#: one client's embedding answer: "src"/"tgt" → peer id (str) → (n, k) cloud, "reference" →
#: peer id → W(train_c, val_c)
CloudReply = dict[str, dict[str, Any]]


@dataclass
class Phase:
    """What every phase reports besides its answers.

    Attributes
    ----------
    failed : dict
        Client → why it is missing from the answers (no reply, an error, a rejected reply).
    seconds : float
        Wall time of the phase.
    bytes_sent, bytes_received : int
        Payload bytes of its messages (0 in memory).
    """

    failed: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0

    def dropped(self, prefix: str = "") -> dict[str, str]:
        """``history.jsonl`` ``dropped_nodes`` of the phase: client id → reason."""
        return {str(n): f"{prefix}{why}" for n, why in sorted(self.failed.items())}


@dataclass
class Trained(Phase):
    """A local-training phase: per client its new model, train size and loss; with keygen
    its X25519 public key; under IFCA the cluster model it chose."""

    models: dict[int, Weights] = field(default_factory=dict)
    counts: dict[int, int] = field(default_factory=dict)
    losses: dict[int, float] = field(default_factory=dict)
    pubs: dict[int, bytes] = field(default_factory=dict)
    choices: dict[int, int] = field(default_factory=dict)


@dataclass
class Clouds(Phase):
    """The embedding exchange: per client its :data:`CloudReply`; the messages it took (peer
    batches) and the largest message in MiB."""

    replies: dict[int, CloudReply] = field(default_factory=dict)
    messages: int = 1
    message_mib: float = 0.0


@dataclass
class Subspaces(Phase):
    """PACFL: per client its class subspaces ``(pixels, basis × classes)``."""

    u: dict[int, NDArray] = field(default_factory=dict)


@dataclass
class Groups(Phase):
    """Oracle: per client its ground-truth group."""

    truth: dict[int, int] = field(default_factory=dict)


@dataclass
class Evaluation:
    """One client's evaluation (sent only when the run evaluates and the client allows it)."""

    acc: float
    cluster: int
    num_test: int
    backdoor_acc: float | None = None


@dataclass
class Final(Phase):
    """The final phase: the clients that evaluated, and how many answered at all."""

    evaluations: dict[int, Evaluation] = field(default_factory=dict)
    answered: int = 0


class Clients(Protocol):
    """What EMD-CFL and its baselines ask of the clients."""

    #: the run's clients, sorted
    ids: list[int]

    def train(self, rnd: int, models: Mapping[int, Weights], keygen: bool) -> Trained:
        """Round ``rnd``: every client in ``models`` trains its model locally (and with
        ``keygen`` returns its X25519 public key, creating the pair on first use)."""

    def embed(self, rnd: int, members: list[int], models: Mapping[int, Weights],
              pubs: Mapping[int, bytes]) -> Clouds:
        """Alg. 1 lines 11–13: every member receives the members' models and public keys and
        returns, per peer, its projected clouds and the scalar reference."""

    def ifca(self, rnd: int, models: Sequence[Weights]) -> Trained:
        """IFCA round ``rnd``: every client picks one of ``models`` and trains it."""

    def subspaces(self) -> Subspaces:
        """PACFL: every client's class subspaces."""

    def groups(self) -> Groups:
        """Oracle: every client's ground-truth group (the evaluation path only)."""

    def final(self, models: Mapping[int, Weights], found: Mapping[int, int]) -> Final:
        """The final phase: every client receives its cluster's model and cluster id, keeps
        them for its data owner and, when the run evaluates, reports its test accuracy."""


class Traffic:
    """Bytes and seconds of every phase, split into training, clustering and evaluation."""

    def __init__(self) -> None:
        self.sent = self.received = 0
        self.seconds = {"training": 0.0, "clustering": 0.0, "evaluation": 0.0}

    def add(self, phase: Phase, kind: str) -> None:
        self.sent += phase.bytes_sent
        self.received += phase.bytes_received
        self.seconds[kind] += phase.seconds


def singletons(labels: dict[int, int], clients: Sequence[int]) -> dict[int, int]:
    """``labels`` with every client it lacks as a fresh singleton (in the order of
    ``clients``)."""
    nxt = max(labels.values(), default=-1) + 1
    for n in clients:
        if n not in labels:
            labels[n], nxt = nxt, nxt + 1
    return labels


