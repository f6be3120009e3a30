"""EMD-CFL (paper 001) and its baselines over Flower messages: :class:`FlowerClients`, the
:class:`fedclust.emdcfl.clients.Clients` of a run's nodes, and :func:`run`, the method's entry
of the ServerApp (the ``server`` column of :data:`fedclust.registry.METHODS`).

The loop is :func:`fedclust.emdcfl.loop.run` (Algorithm 1 and the baselines' loops of
:mod:`fedclust.emdcfl.baselines`); the messages, both ends, and the checks of every reply are
:mod:`strategies.wire.emdcfl`. A reply that fails a check, an error reply or a late one is
rejected with a logged reason, the node is named in ``history.jsonl`` ``dropped_nodes`` (node
id → reason) and the phase continues with the others. A phase that keeps no client stops the
run with a RuntimeError naming the phase and every node's reason.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedclust.common import CommonSettings
from fedclust.emdcfl import loop
from fedclust.emdcfl.clients import (
    Clouds,
    Evaluation,
    Final,
    Groups,
    Phase,
    Subspaces,
    Trained,
    Weights,
)
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.emdcfl.privacy import projection_dim
from fedclust.results import RunRecorder
from strategies.common import (
    Exchange,
    check_each,
    connected_clients,
    reject,
    require_honest,
    result_record,
    send_and_collect,
)
from strategies.wire import emdcfl as wire

LOG = logging.getLogger("fedclust")
WARN_MESSAGE_MIB = 256.0     # larger embedding messages: warn (memory, gRPC) and name the fix


def require_replies(ex: Exchange, phase: str) -> None:
    """Stop the run when a phase kept no client, naming the phase and every node's reason.

    Raises
    ------
    RuntimeError
        ``ex`` has no usable reply.
    """
    if ex.replies:
        return
    reasons = "; ".join(f"node {n}: {why}" for n, why in sorted(ex.failed.items()))
    raise RuntimeError(
        f"EMD-CFL phase '{phase}': no client left — every reply was missing, an error or "
        f"rejected ({reasons or 'no client was asked'}). Fix the cause named above (e.g. "
        "data-dir, node data-path files, timeout) and run again.")


def peer_batches(members: list[int], batch: int) -> list[list[int]]:
    """Peers per embedding message: all (``batch`` 0) or slices of ``batch`` members."""
    size = batch or len(members)
    return [members[i:i + size] for i in range(0, len(members), size)]


def embed_message_mib(model: Weights, models: int) -> float:
    """MiB of the model arrays in an embedding message that carries ``models`` models."""
    return models * sum(np.asarray(a).nbytes for a in model) / 2**20


def warn_message_size(model: Weights, members: list[int], batch: int) -> float:
    """Largest embedding message in MiB; logs a warning with the fix above WARN_MESSAGE_MIB."""
    # a message holds the batch's models plus the receiver's own when it is not in the batch
    peers = max(len(b) for b in peer_batches(members, batch)) if members else 0
    models = peers + (peers < len(members))
    mib = embed_message_mib(model, models)
    if mib > WARN_MESSAGE_MIB:
        per_model = embed_message_mib(model, 1)
        fit = max(1, int(WARN_MESSAGE_MIB // per_model) - 1)
        LOG.warning(
            "EMD-CFL: embedding messages carry up to %d models (peers and the client's own), "
            "%.0f MiB (%.1f MiB per model), to each of %d clients at once: expect that much "
            "memory per message on the server, the SuperLink and every node. Pass "
            "emdcfl.embed-batch=%d (peer models per message; same distances) to keep "
            "messages under %.0f MiB", models, mib, per_model, len(members), fit,
            WARN_MESSAGE_MIB)
    return mib


class FlowerClients:
    """:class:`fedclust.emdcfl.clients.Clients` over Flower messages.

    Parameters
    ----------
    grid : Grid
    nodes : list of int
        The run's nodes (:func:`strategies.common.connected_clients`), sorted.
    common : CommonSettings
        The run's common settings (``timeout``, ``min_clients``).
    s : EMDCFLSettings
    recorder : RunRecorder
        The run's folder: the final phase saves every cluster's model there and names it to
        the nodes.
    """

    def __init__(self, grid: Grid, nodes: list[int], common: CommonSettings,
                 s: EMDCFLSettings, recorder: RunRecorder) -> None:
        self.grid, self.ids, self.common, self.s = grid, list(nodes), common, s
        self.recorder = recorder
        self.timeout = common.timeout
        self.declared: dict[int, int] = {}    # train sizes as first reported

    def _send(self, nodes: Sequence[int], content: RecordDict | Callable[[int], RecordDict],
              message_type: str, phase: str, check: wire.Check,
              node_check: wire.NodeCheck | None = None, required: bool = True,
              across: Callable[[Mapping[int, RecordDict]], dict[int, str]] | None = None
              ) -> Exchange:
        """One exchange: send, check every reply (and, given the node, ``node_check``; given
        ``across``, the replies against each other), stop when ``required`` and no client is
        left or too few honest ones."""
        ex = send_and_collect(self.grid, nodes, content, message_type, phase, self.timeout,
                              validate=check)
        if node_check is not None:
            check_each(ex, node_check, phase)
        if across is not None:
            for nid, why in sorted(across(ex.replies).items()):
                reject(ex, nid, why, phase)
        if required:
            require_replies(ex, phase)
            require_honest(ex, phase, len(ex.replies), len(nodes), self.common)
        return ex

    @staticmethod
    def _phase(ex: Exchange, out: Phase) -> Phase:
        out.failed, out.seconds = dict(ex.failed), ex.seconds
        out.bytes_sent, out.bytes_received = ex.bytes_sent, ex.bytes_received
        return out

    def train(self, rnd: int, models: Mapping[int, Weights], keygen: bool) -> Trained:
        config = wire.train_config(rnd, keygen)
        shapes = wire.shapes_of(next(iter(models.values()))) if models else []
        ex = self._send(sorted(models), lambda nid: wire.train_request(models[nid], config),
                        wire.TRAIN, f"train-{rnd}", wire.check_train(shapes, keygen),
                        wire.check_trained(models, self.declared),
                        across=lambda got: wire.across_trained(got, models))
        out = Trained()
        for nid, rd in ex.replies.items():
            out.models[nid], out.counts[nid], out.losses[nid], pub = wire.read_trained(rd,
                                                                                   keygen)
            if pub is not None:
                out.pubs[nid] = pub
        return self._phase(ex, out)

    def ifca(self, rnd: int, models: Sequence[Weights]) -> Trained:
        sent: dict[int, Weights] = {}

        def trained(nid: int, rd: RecordDict) -> str | None:
            # the model a node trained is the one it chose
            sent[nid] = models[wire.read_choice(rd)]
            return wire.check_trained(sent, self.declared)(nid, rd)

        ex = self._send(self.ids, wire.ifca_request(models, rnd), wire.IFCA, f"ifca-{rnd}",
                        wire.check_ifca(wire.shapes_of(models[0]), len(models)), trained,
                        across=lambda got: wire.across_trained(got, sent))
        out = Trained()
        for nid, rd in ex.replies.items():
            out.models[nid], out.counts[nid], out.losses[nid], _ = wire.read_trained(rd, False)
            out.choices[nid] = wire.read_choice(rd)
        return self._phase(ex, out)

    def embed(self, rnd: int, members: list[int], models: Mapping[int, Weights],
              pubs: Mapping[int, bytes]) -> Clouds:
        """With ``emdcfl.embed-batch`` = B > 0 the peer models go out B at a time (one
        exchange per batch, each client also gets its own model); each pair's projection and
        subsample come from the pair seed, so the distances equal those of one message with
        every peer."""
        s, group = self.s, f"embed-{rnd}"
        check = wire.check_embed(members, projection_dim(s.spec.embed_dim, s.proj_ratio),
                                 s.max_samples, all_but_sender=False, metric=s.metric)
        batches = peer_batches(members, s.embed_batch)
        out = Clouds(replies={n: {"src": {}, "tgt": {}, "reference": {}} for n in members},
                     messages=len(batches))
        out.message_mib = (warn_message_size(models[members[0]], members, s.embed_batch)
                           if members else 0.0)
        records = {n: wire.model_record(models[n]) for n in members}   # shared by all messages
        for b, batch in enumerate(batches):
            targets = [n for n in members if set(batch) - {n}]
            name = group if len(batches) == 1 else f"{group}-batch{b}"
            ex = self._send(targets,
                            lambda nid, batch=batch: wire.embed_request(nid, batch, records,
                                                                        pubs),
                            wire.EMBED, name, check, wire.check_peers(batch))
            out.seconds += ex.seconds
            out.bytes_sent += ex.bytes_sent
            out.bytes_received += ex.bytes_received
            out.failed.update(ex.failed)
            for nid, rd in ex.replies.items():
                for part, values in wire.read_clouds(rd).items():
                    out.replies[nid][part].update(values)
        out.replies = {n: r for n, r in out.replies.items() if n not in out.failed}
        return out

    def subspaces(self) -> Subspaces:
        spec = self.s.spec
        ex = self._send(self.ids, RecordDict(), wire.PACFL, "pacfl-subspaces",
                        wire.check_pacfl(spec.in_channels * spec.size * spec.size,
                                         self.s.pacfl_basis * spec.num_classes))
        out = Subspaces(u={n: wire.read_subspace(rd) for n, rd in ex.replies.items()})
        return self._phase(ex, out)

    def groups(self) -> Groups:
        ex = self._send(self.ids, RecordDict(), wire.GROUP, "oracle-groups",
                        wire.check_group())
        return self._phase(ex, Groups(truth={n: wire.read_group(rd)
                                             for n, rd in ex.replies.items()}))

    def final(self, models: Mapping[int, Weights], found: Mapping[int, int]) -> Final:
        """Saves every cluster's model in the run's folder first (:func:`save_final_models`);
        with ``evaluate=false`` a node that missed its model is only named."""
        save_final_models(self.recorder, self.s, models, found)
        num_clusters = len(set(found.values()))
        ex = self._send(sorted(models),
                        lambda nid: wire.final_request(models[nid],
                                                       result_record(self.recorder.dir),
                                                       found[nid], num_clusters),
                        wire.FINAL, "evaluate", wire.check_final(self.s.evaluate),
                        required=self.s.evaluate)
        out = Final(answered=len(ex.replies))
        for nid, rd in ex.replies.items():
            ev = wire.read_evaluation(rd)
            if ev is not None:
                out.evaluations[nid] = Evaluation(**ev)
        return self._phase(ex, out)


def save_final_models(recorder: RunRecorder, s: EMDCFLSettings, models: Mapping[int, Weights],
                      found: Mapping[int, int]) -> None:
    """``models/cluster_<c>.pt`` for every final cluster (a torch ``state_dict``) and
    ``models/clusters.json`` (network shape, file and client ids of every cluster)."""
    from fedclust.emdcfl.predict import save_cluster_models

    members: dict[int, list[int]] = {}
    for n in sorted(models):
        members.setdefault(found[n], []).append(n)
    save_cluster_models(recorder.dir, s.spec, {c: models[ns[0]] for c, ns in members.items()},
                        members)


def preflight(cfg: dict[str, Any]) -> None:
    """Fail before any message when the base image files of the dataset are missing.

    The simulated clients regenerate their data from ``data-dir`` (MNIST or Fashion-MNIST
    train and test files; ``rotdigits`` is embedded). Skipped with ``emdcfl.preflight=false``
    (a deployment whose nodes read their own ``data-path`` files).

    Raises
    ------
    fedclust.data.images.DatasetError
        A file is missing: the message names it, the folder searched and where to get it.
    """
    s = EMDCFLSettings.from_config(cfg)
    if not s.preflight or cfg["dataset"] in ("local", "files"):
        return      # the nodes read their own files: no base images to check here
    from fedclust.emdcfl.data import check_files

    check_files(s.dataset, s.data_dir)


def run(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    """``method=emdcfl``: EMD-CFL, or the baseline named by ``emdcfl.algorithm``, over the
    run's nodes (``preflight`` runs before, from the ServerApp's method registry)."""
    from fedclust.emdcfl.keys import uneven_groups

    warning = uneven_groups(cfg)
    if warning:
        LOG.warning("method=emdcfl: %s", warning)
    s = EMDCFLSettings.from_config(cfg)
    clients = FlowerClients(grid, connected_clients(grid, cfg), CommonSettings.from_config(cfg),
                            s, recorder)
    out = loop.run(clients, s, recorder)
    if s.algorithm == "emdcfl" and s.plots and "emd_matrix" in recorder.arrays:
        from fedclust.emdcfl.plots import emd_heatmap

        emd_heatmap(recorder.path("emd_heatmap.png"), recorder.arrays["emd_matrix"],
                    recorder.arrays["clusters"],
                    f"EMD-CFL {s.dataset} ({s.rotation}), seed {s.seed}")
    return out
