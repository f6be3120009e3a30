"""EMD-CFL's client steps without Flower (paper 001, Alg. 1, the client's side), and its
baselines': what a client computes from its own data when the server asks. The ClientApp
(:mod:`client_apps.emdcfl_handlers`) calls them between parsing a message and building the
reply; the in-memory clients (:mod:`fedclust.emdcfl.inmemory`) call them directly.

Every step reads :class:`~fedclust.emdcfl.keys.EMDCFLSettings` and the client's
:class:`~fedclust.emdcfl.data.ClientSplit`; none sends anything: the caller decides what
leaves the client (models, projected clouds, scalars, counts; never samples or labels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.emdcfl.data import ClientSplit
from fedclust.emdcfl.keys import EMDCFLSettings, resolve_device

Weights = list[NDArray[np.float32]]


def device_for(name: str, simulated: bool) -> str:
    """Torch device of a client for ``emdcfl.device`` = ``name``; on the CPU, torch runs one
    thread.

    On a GPU, a simulated client also turns cuDNN's autotuner off and asks for its
    deterministic kernels (reproducible runs).

    Raises
    ------
    fedclust.schema.ConfigError
        ``cuda`` requested but unavailable (on a node: an error reply naming the key).
    """
    device = resolve_device(name)
    if device == "cpu":
        import torch

        # 2 threads thrash on a shared 2-core box; one thread also fixes the reduction order
        torch.set_num_threads(1)
    elif simulated:
        import torch

        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return device


@lru_cache(maxsize=64)
def simulated_split(s: EMDCFLSettings, partition: int, num_parts: int) -> ClientSplit:
    """Partition ``partition`` of ``num_parts`` of the run's simulated dataset (cached: every
    message of a run asks for the same)."""
    from fedclust.emdcfl.data import client_split

    return client_split(s.dataset, s.rotation, partition, num_parts, s.samples,
                        s.test_samples, s.val_fraction, s.seed, s.data_dir,
                        s.backdoor_colours)


def train_seed(seed: int, rnd: int, who: int) -> int:
    """Seed of the minibatch order of round ``rnd`` for client ``who`` (a simulated client's
    partition id, a deployed node's id)."""
    return int(np.random.SeedSequence([seed, rnd, who]).generate_state(1)[0])


def train(s: EMDCFLSettings, data: ClientSplit, weights: Weights, rnd: int, seed: int,
          device: str = "cpu") -> tuple[Weights, float, int]:
    """Alg. 1 line 5 (and every baseline's local update): ``s.epochs(rnd)`` epochs of SGD on
    the client's train split from ``weights``. Returns the new weights, the mean training
    loss and the train size."""
    from fedclust.emdcfl.model import train_local

    new, loss = train_local(s.spec, weights, data.x_train, data.y_train, s.epochs(rnd), s.lr,
                            s.batch_size, seed, device=device)
    return new, loss, len(data.y_train)


def embed_pairs(s: EMDCFLSettings, data: ClientSplit, own: Weights, peers: Sequence[int],
                pubs: Mapping[int, bytes], models: Iterable[Weights], private: bytes,
                me_in_pair: int, in_pair: Callable[[int], int], device: str = "cpu"
                ) -> tuple[dict[str, NDArray], dict[str, NDArray], dict[str, float]]:
    """Alg. 1 lines 11–13, the client's side, for every peer ``o`` (paper §3, "privacy"):

    - ``src[o] = R_co · emb_own(train)`` (subsampled): the source cloud of ``W(train_c, ·)``;
    - ``tgt[o] = R_co · emb_o(val)``: its val under ``o``'s model, the target of ``o``'s row;
    - ``reference[o] = W(src[o], R_co · emb_own(val))``, the paper's ``W(train_c, val_c)``
      under the pair's projection: only this scalar leaves, never the own-model val cloud.

    ``R_co`` and the subsamples come from the X25519 shared secret of the pair (``private``
    and the peer's public key), named by ``me_in_pair`` and ``in_pair(peer)``
    (:class:`fedclust.emdcfl.privacy.PairContext`). ``models``: the peers' models in the
    order of ``peers``, consumed one at a time.
    """
    from fedclust.emdcfl.excess import reference_distance
    from fedclust.emdcfl.model import embed, embed_many
    from fedclust.emdcfl.privacy import PairContext

    spec = s.spec
    e_train = embed(spec, own, data.x_train, device=device)
    # own val under every model (own first): images converted once, no module per peer
    e_vals = embed_many(spec, chain([own], models), data.x_val, device=device)

    def pair(peer: int) -> PairContext:
        return PairContext(private, me_in_pair, in_pair(peer), pubs[peer], spec.embed_dim,
                           s.proj_ratio, s.projection)

    src, tgt, own_val = pair_clouds(s, peers, e_train, e_vals[0], e_vals[1:], pair)
    reference = {str(peer): reference_distance(src[str(peer)], own_val[str(peer)], s.solver)
                 for peer in peers}
    return src, tgt, reference


def pair_clouds(s: EMDCFLSettings, peers: Sequence[int], e_train: NDArray, e_val: NDArray,
                e_peers: Iterable[NDArray], pair: Callable[[int], Any]
                ) -> tuple[dict[str, NDArray], dict[str, NDArray], dict[str, NDArray]]:
    """The projected clouds of :func:`embed_pairs` from a client's embeddings: per peer ``o``
    (``pair(o)``: the pair's :class:`~fedclust.emdcfl.privacy.PairContext`) the ``src`` and
    ``tgt`` clouds it sends and the own-model val cloud its reference is solved against
    (``own_val``, never sent). ``e_peers``: its val embeddings under each peer's model, in
    the order of ``peers``."""
    cap = s.max_samples
    src, tgt, own_val = {}, {}, {}
    for peer, e_peer in zip(peers, e_peers):
        ctx = pair(peer)
        src[str(peer)] = ctx.project(e_train, cap)        # W(train_me, ·) source cloud
        own_val[str(peer)] = ctx.project(e_val, cap)      # never sent
        tgt[str(peer)] = ctx.project(e_peer, cap)         # val_me under peer's model
    return src, tgt, own_val


def ifca(s: EMDCFLSettings, data: ClientSplit, models: Sequence[Weights], rnd: int, seed: int,
         device: str = "cpu") -> tuple[Weights, float, int, int, list[float]]:
    """IFCA's client step: pick the cluster model with the lowest validation loss, train it.
    Returns the new weights, the training loss, the train size, the choice and the
    validation losses."""
    from fedclust.emdcfl.model import evaluate

    losses = np.array([evaluate(s.spec, w, data.x_val, data.y_val, device=device)[0]
                       for w in models])
    choice = int(np.argmin(losses))
    new, loss, n = train(s, data, models[choice], rnd, seed, device)
    return new, loss, n, choice, losses.tolist()


def subspaces(s: EMDCFLSettings, data: ClientSplit) -> NDArray[np.float32]:
    """PACFL's client step: the first ``pacfl-basis`` left singular vectors of each class's
    validation images, as the model sees them (the labels stay on the client)."""
    from fedclust.emdcfl.model import to_tensor
    from fedclust.emdcfl.pacfl import class_subspaces

    return class_subspaces(to_tensor(data.x_val).numpy(), data.y_val, s.pacfl_basis)


def test(s: EMDCFLSettings, data: ClientSplit, weights: Weights, device: str = "cpu"
         ) -> tuple[float, float]:
    """``(loss, accuracy)`` of the final model on the client's test split."""
    from fedclust.emdcfl.model import evaluate

    return evaluate(s.spec, weights, data.x_test, data.y_test, device=device)


def evaluation(s: EMDCFLSettings, data: ClientSplit, weights: Weights,
               test_result: tuple[float, float], device: str = "cpu") -> dict[str, Any]:
    """The evaluation metrics a client sends when the run evaluates and it allows it: test
    loss and accuracy, its ground-truth group (``cluster``, −1 when unknown) and data set and,
    on a Backdoor MNIST target, the backdoor accuracy."""
    from fedclust.emdcfl.model import evaluate

    loss, acc = test_result
    out: dict[str, Any] = {"test-loss": loss, "test-acc": acc, "cluster": data.cluster,
                           "set": data.set_id}
    if data.x_test_bd is not None and data.set_id == 0:
        out["backdoor-acc"] = evaluate(s.spec, weights, data.x_test_bd, data.y_test,
                                       device=device)[1]
    return out

