"""FedCRef's Flower strategy: the messages of Algorithm 1 (paper 000).

The loop itself — local models, associations, communities, community FedAvg, refinement,
stopping — is :func:`fedclust.fedcref.algorithm.run`, Flower-free. This module implements its
:class:`~fedclust.fedcref.algorithm.Clients` with messages and checks every reply:

1. ``train.fedcref_local`` — active clients (re)train one autoencoder per local cluster and
   send it; inactive clients send only the list of clusters that still have a model.
2. ``query.fedcref_assoc`` — every client receives only the model versions it has not
   evaluated yet (it caches their errors), tests each of its clusters against each foreign
   model and returns the accept bits. A node whose cache was lost lists the missing keys and
   gets them in a second message.
3. ``train.fedcref_comm`` × ``fl-rounds`` — a client trains all of its communities in one
   message per round; the server averages (weighted by counts). With
   ``reuse-communities``, the members of a community whose model is kept get one
   ``query.fedcref_member`` instead (which community each cluster is in, for the owner).
4. ``train.fedcref_refine`` — active clients run Algorithm 2 and report ACC(previous, new).

The results for each data owner travel in these messages, with no extra round trip: the
config record ``"result"`` (the run folder, for simulated clients) rides on every local,
community and refinement message; a client learns the community of each of its clusters from
the community rounds (none: isolated) and writes its labels and the models that define them
after each refinement (docs/fedcref.md, "Results for each data owner"). At the end the server
saves the final community models as ``community_models.npz`` for ``fedclust predict``.

Clients that do not answer are left out of that step and recorded (``dropped_nodes``).
Evaluation metrics (``eval_*``) come from per-cluster true-class histograms sent by the
clients only when ``evaluate`` is true and the node allows it (a simulated node always; a
deployed node with node config ``allow-evaluation=true``, :mod:`client_apps.evaluation`); they
cover only the nodes that sent them (``eval_nodes``). The algorithm never uses them (except
the explicit ``association=perfect`` baseline, which refuses to run without every node's).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ConfigRecord, RecordDict
from flwr.serverapp import Grid

from fedclust.common import CommonSettings
from fedclust.fedcref import algorithm, wire
from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref.algorithm import (
    Contribution,
    LocalReply,
    Model,
    Node,
    RefineReply,
    community_seed,
    foreign_nodes,
)
from fedclust.fedcref.client import refine_inputs as core_refine_inputs
from fedclust.fedcref.keys import ClientSettings, Settings
from fedclust.results import Progress, RunRecorder
from strategies.common import (
    Exchange,
    check_each,
    connected_clients,
    name_nodes,
    node_name,
    reject,
    require_honest,
    result_record,
    send_and_collect,
)
from strategies.wire import fedcref as fw
from strategies.wire.replies import above_others

LOG = logging.getLogger("fedclust")


class _Traffic:
    """Running totals of bytes and seconds per phase, with per-iteration differences."""

    def __init__(self) -> None:
        self.sent = self.received = 0
        self.by_phase: dict[str, int] = {}      # bytes both ways
        self.seconds: dict[str, float] = {}
        self.client_seconds: dict[str, float] = {}
        self._mark: tuple[int, int, dict[str, int], dict[str, float], dict[str, float]] = (
            0, 0, {}, {}, {})

    def since_mark(self) -> dict[str, Any]:
        """What was added since the previous call (one iteration), then move the mark."""
        sent, received, phases, secs, csecs = self._mark
        out = {"bytes_sent_iter": self.sent - sent,
               "bytes_received_iter": self.received - received,
               "bytes_by_phase_iter": {k: v - phases.get(k, 0)
                                       for k, v in self.by_phase.items()},
               "seconds_iter": {k: v - secs.get(k, 0.0) for k, v in self.seconds.items()},
               "client_seconds_iter": {k: v - csecs.get(k, 0.0)
                                       for k, v in self.client_seconds.items()}}
        self._mark = (self.sent, self.received, dict(self.by_phase), dict(self.seconds),
                      dict(self.client_seconds))
        return out

    def add(self, phase: str, ex: Exchange) -> None:
        self.sent += ex.bytes_sent
        self.received += ex.bytes_received
        self.by_phase[phase] = (self.by_phase.get(phase, 0) + ex.bytes_sent
                                + ex.bytes_received)
        self.seconds[phase] = self.seconds.get(phase, 0.0) + ex.seconds
        cs = sum(float(r.metric_records["metrics"].get("seconds", 0.0))
                 for r in ex.replies.values() if "metrics" in r.metric_records)
        self.client_seconds[phase] = self.client_seconds.get(phase, 0.0) + cs


def order_by_client_key(nodes: list[int], keys: dict[int, int]) -> list[int]:
    """Nodes sorted by the identity key their client reported (nodes without one last, by id).

    Client seeds and the order of clients and communities then depend only on what each
    client holds, never on the node ids the engine assigned (random in deployment).
    """
    return sorted(nodes, key=lambda nid: (nid not in keys, keys.get(nid, 0), nid))


def _check_evaluation(replies: dict[int, RecordDict], hists: dict[int, np.ndarray],
                      mode: str) -> None:
    """With ``evaluate=true``, say which answering nodes sent no evaluation statistics (a
    deployed node sends them only with node config ``allow-evaluation=true`` and labels in its
    file); ``association=perfect`` needs every node's, so it stops the run."""
    silent = sorted(n for n in replies if n not in hists)
    if not silent:
        return
    why = ("a deployed node sends label statistics only with node config "
           "allow-evaluation=true (and a 'y' array in its data file)")
    if mode == "perfect":
        raise RuntimeError(
            f"fedcref.association='perfect' builds the graph from every node's true classes, "
            f"but {len(silent)} of {len(replies)} nodes sent none ({why}). Fix: use "
            "fedcref.association=mutual, or allow evaluation on every node.")
    covered = len(replies) - len(silent)
    LOG.warning("evaluate=true, but %d of %d nodes sent no evaluation statistics (%s): %s",
                len(silent), len(replies), why,
                f"the eval_* metrics cover the other {covered} only (eval_nodes)" if covered
                else "no eval_* metrics (eval_nodes = 0)")


def preflight(cfg: dict[str, Any]) -> None:
    """Fail before any work if the dataset is missing or cannot supply the system."""
    if cfg["dataset"] != "local":
        from fedclust.fedcref.client import build_system

        build_system(cfg)


class FlowerClients:
    """:class:`fedclust.fedcref.algorithm.Clients` over Flower messages.

    Client ``i`` of the loop is the node with the ``i``-th smallest identity key (reported in
    the first local phase), so that seeds and orders depend only on what each client holds,
    never on the node ids the engine assigned. Replies that fail their check count as not
    answered (``dropped_nodes``).
    """

    def __init__(self, grid: Grid, nodes: list[int], common: CommonSettings, s: ClientSettings,
                 result_dir: str, association: str = "mutual") -> None:
        self.grid, self.nodes, self.common, self.s = grid, nodes, common, s
        self.association = association     # the loop's (fedcref.association)
        self.n = len(nodes)
        self.index = {nid: i for i, nid in enumerate(nodes)}
        self.timeout = common.timeout
        self.result = result_dir
        self.hidden = s.hidden
        self.layer: list[int] | None = None     # fixed by the first valid model
        self.ks: dict[int, int] = {}
        self.evaluated: dict[int, set[str]] = {nid: set() for nid in nodes}
        self.arrays: dict[str, dict[str, Array]] = {}    # model key -> arrays as sent
        self.plain: dict[str, dict[str, Array]] = {}     # ... without a base (int8-delta)
        self.delta = s.wire == wire.DELTA
        self.init_check = wire.init_check(s.hidden, s.ae_init) if self.delta else None
        self.init_ok: dict[int, bool] = {}    # node rebuilds the seeded initialisations
        self.copies = _Copies()
        self.hists: dict[int, np.ndarray] = {}
        self.traffic = _Traffic()
        self.dropped_now: dict[str, dict[int, str]] = {}
        self.dropped: set[int] = set()
        self.declared: dict[int, tuple[int, int, int]] = {}   # node -> (key, rows, k)

    def _account(self, phase: str, ex: Exchange, part: str) -> None:
        self.traffic.add(phase, ex)
        self.dropped_now[part] = {**ex.failed, **self.dropped_now.get(part, {})}

    # -- Algorithm 1 lines 6-8 --------------------------------------------------------------
    def local(self, t: int, active: Collection[int], seed: int) -> dict[int, LocalReply]:
        self.dropped_now = {}
        act = {self.nodes[i] for i in active}

        self.copies = _Copies()        # a new iteration: no community copy is a base
        check_init = {} if self.init_check is None else {"init-check": self.init_check}

        def content(nid: int) -> RecordDict:
            return RecordDict({"config": ConfigRecord({
                "active": nid in act, "iteration": t, "seed": seed, **check_init}),
                "result": result_record(self.result)})

        # warm-started models carry earlier iterations' training: only their shapes and
        # finiteness are checked
        limits = None if self.s.warm_start else self.s
        phase_seed = seed if self.delta else None
        decoded: dict[int, dict[str, np.ndarray]] = {}

        def check(nid: int, c: RecordDict) -> str | None:
            decoded[nid] = {}
            problem = fw.check_local(c, self.layer, self.hidden, limits, phase_seed,
                                     self.s.ae_init, decoded[nid])
            if problem is None and nid in self.declared:
                met = c.metric_records["metrics"]
                now = (int(met["key"]), int(met["n"]), int(met["k"]))
                if now != self.declared[nid]:
                    problem = (f"identity key, rows or k changed during the run: "
                               f"{self.declared[nid]} -> {now}")
            if problem is None and self.layer is None and "models" in c.array_records:
                width = fw.input_width(c.array_records["models"])
                self.layer = ae.layer_sizes(int(width or 0), self.hidden)
            return problem

        ex = send_and_collect(self.grid, self.nodes, content, "train.fedcref_local",
                              f"local-{t}", self.timeout)
        check_each(ex, check, f"local-{t}")
        # a row count far above the other nodes' (it weighs every community average)
        for nid, why in sorted(above_others({nid: float(c.metric_records["metrics"]["n"])
                                             for nid, c in ex.replies.items()},
                                            "metrics.n").items()):
            reject(ex, nid, why, f"local-{t}")
        if not ex.replies:
            raise RuntimeError(
                f"FedCRef iteration {t}: no client answered the local phase; reasons: "
                + "; ".join(f"{node_name(n)}: {why}" for n, why in sorted(ex.failed.items()))
                + ". Fix: act on the nodes' reasons (their data, their logs, run config "
                  "'timeout'), then run again")
        require_honest(ex, f"local-{t}", len(ex.replies), len(self.nodes), self.common)
        for nid, c in ex.replies.items():
            met = c.metric_records["metrics"]
            self.declared.setdefault(nid, (int(met["key"]), int(met["n"]), int(met["k"])))
        if t == 1:
            # client order (and so community order) by the clients' own identity keys, not by
            # node ids, which differ between engines and runs (see client_key)
            self.nodes = order_by_client_key(self.nodes, {
                nid: int(c.metric_records["metrics"]["key"]) for nid, c in ex.replies.items()})
            self.index = {nid: i for i, nid in enumerate(self.nodes)}
            name_nodes({nid: f"client {i}" for nid, i in self.index.items()})
        self._account("local_training", ex, "local")
        LOG.info("iteration %d: local training %.1fs", t, ex.seconds)
        out: dict[int, LocalReply] = {}
        for nid, c in ex.replies.items():
            met = c.metric_records["metrics"]
            i = self.index[nid]
            self.ks[i] = int(met["k"])
            self.init_ok[nid] = bool(met.get("init-ok", 0))
            reply = LocalReply(k=int(met["k"]), version=int(met["version"]), hist=fw.read_hist(c))
            if "clusters" in c.array_records:
                clusters = [int(q) for q in c.array_records["clusters"]["clusters"].numpy()]
                reply.modelled = clusters
                if "models" in c.array_records:
                    raw = {name: a.numpy() for name, a in c.array_records["models"].items()}
                    models = decoded[nid]
                    reply.models = {}
                    for j, q in enumerate(clusters):
                        reply.models[q] = {name: a[j:j + 1] for name, a in models.items()}
                        # relayed for cross-evaluation as sent, in the wire format
                        self.arrays[_key((i, q), reply.version)] = (
                            fw.flower_arrays(wire.rows(raw, [j])) if "z" in raw else
                            {name: Array(np.ascontiguousarray(a[j:j + 1]))
                             for name, a in raw.items()})
            if reply.hist is not None:
                self.hists[i] = reply.hist
            out[i] = reply
        if t == 1 and self.s.evaluate:
            _check_evaluation(ex.replies, {self.nodes[i]: h for i, h in self.hists.items()},
                              self.association)
        return out

    # -- lines 9-16 ---------------------------------------------------------------------------
    def associate(self, t: int, models: Mapping[Node, tuple[int, Model]], asked: list[int],
                  only: Mapping[int, list[Node]] | None = None) -> dict[int, np.ndarray]:
        keys_all = {node: _key(node, version) for node, (version, _) in models.items()}
        current = set(keys_all.values())
        for key in [k for k in self.arrays if k not in current]:
            del self.arrays[key]
        for key in [k for k in self.plain if k not in current]:
            del self.plain[key]
        by_key = {keys_all[node]: model for node, (_, model) in models.items()}
        for node, (_, model) in models.items():
            if keys_all[node] not in self.arrays:
                self.arrays[keys_all[node]] = fw.encoded_arrays(model, self.s.wire)

        def relayed(key: str, nid: int, resend: bool) -> dict[str, Array]:
            # int8-delta models against an initialisation the node cannot rebuild (or asked
            # for again) go without a base: the same weights, more bytes
            if not self.delta or (self.init_ok.get(nid, False) and not resend):
                return self.arrays[key]
            if key not in self.plain:
                self.plain[key] = fw.encoded_arrays(by_key[key], self.s.wire)
            return self.plain[key]

        def foreign(nid: int) -> list[Node]:
            return foreign_nodes(models, self.index[nid], only)

        def content(nid: int, resend: set[str] | None = None) -> RecordDict:
            fk = foreign(nid)
            names = [keys_all[k] for k in fk]
            send = [keys_all[k] for k in fk if keys_all[k] not in self.evaluated[nid]
                    and (resend is None or keys_all[k] in resend)]
            c = RecordDict({"config": ConfigRecord(
                {"keys": names} if names else {"no-keys": True})})
            rec = fw.keyed_record({key: relayed(key, nid, resend is not None) for key in send})
            if rec is not None:
                c["models"] = rec
            return c

        def check(nid: int, c: RecordDict) -> str | None:
            return fw.check_accept(c, self.ks[self.index[nid]], len(foreign(nid)))

        ex = send_and_collect(self.grid, [self.nodes[i] for i in asked], content,
                              "query.fedcref_assoc", f"assoc-{t}", self.timeout)
        check_each(ex, check, f"assoc-{t}")
        require_honest(ex, f"assoc-{t}", len(ex.replies), len(asked), self.common)
        self.traffic.add("cross_evaluation", ex)
        retry = {}
        for nid, c in ex.replies.items():
            met = c.metric_records.get("metrics")
            miss = list(met.get("missing", [])) if met is not None else []
            if miss:
                fk = foreign(nid)
                retry[nid] = {keys_all[fk[int(i)]] for i in miss}
                self.evaluated[nid] -= retry[nid]
        replies, failed = dict(ex.replies), dict(ex.failed)
        if retry:
            ex2 = send_and_collect(self.grid, list(retry),
                                   lambda nid: content(nid, retry[nid]),
                                   "query.fedcref_assoc", f"assoc-{t}-resend", self.timeout)
            check_each(ex2, lambda nid, c: check(nid, c)
                       or (None if "accept" in c.array_records else "still missing models"),
                       f"assoc-{t}-resend")
            # a re-send that fails drops its node; too few honest replies left stop the run
            require_honest(ex2, f"assoc-{t}-resend", len(ex.replies) - len(retry)
                           + len(ex2.replies), len(asked), self.common)
            self.traffic.add("cross_evaluation", ex2)
            replies.update(ex2.replies)
            failed.update(ex2.failed)
        self.dropped_now["assoc"] = failed
        LOG.info("iteration %d: cross-evaluation %.1fs", t,
                 self.traffic.seconds["cross_evaluation"])
        out = {}
        for nid, c in replies.items():
            if "accept" in c.array_records:
                self.evaluated[nid] = {keys_all[k] for k in foreign(nid)}
                out[self.index[nid]] = fw.read_accept(c)
        return out

    # -- line 22 ------------------------------------------------------------------------------
    def community_round(self, t: int, rnd: int, params: ae.Params,
                        members: dict[int, list[tuple[int, list[int]]]], seed: int
                        ) -> dict[int, list[Contribution]]:
        np_params = ae.to_numpy(params)
        assert self.layer is not None    # communities exist only once models do
        if rnd == 1 and self.delta:
            self.copies.start(np_params, community_seed(self.s.seed, t), self.layer,
                              self.s.ae_init)
        encode = self.copies.encoder(np_params, self.s.wire)

        def content(nid: int) -> RecordDict:
            mine = members[self.index[nid]]
            gs = [g for g, _ in mine]
            return RecordDict({
                "models": fw.arrays(encode(nid, gs, self.init_ok.get(nid, False))),
                "config": ConfigRecord({**fw.members_config(gs, [qs for _, qs in mine]),
                                        "seed": seed}),
                "result": result_record(self.result)})

        targets = [self.nodes[ci] for ci in sorted(members)]
        shapes = {nid: fw.model_shapes(self.layer, len(members[self.index[nid]]))
                  for nid in targets}
        fmt = self.s.wire

        copies = {g: wire.roundtrip({k: v[[g]] for k, v in np_params.items()}, fmt)
                  for g in {g for m in members.values() for g, _ in m}}

        def received(nid: int) -> tuple[dict[str, np.ndarray], fw.Resolver]:
            # what the node decoded: its replies are sent against it (int8-delta)
            gs = [g for g, _ in members[self.index[nid]]]
            sent = {k: np.concatenate([copies[g][k] for g in gs]) for k in copies[gs[0]]}
            return sent, fw.expected_resolver(fw.held_ids(gs), sent)

        decoded: dict[int, dict[str, np.ndarray]] = {}

        def check(nid: int, c: RecordDict) -> str | None:
            sent, resolve = received(nid)
            decoded[nid] = {}
            return fw.check_comm(c, shapes[nid], sent, self.declared.get(nid, (0, None))[1],
                                 self.s, resolve, decoded[nid])

        ex = send_and_collect(self.grid, targets, content, "train.fedcref_comm",
                              f"comm-{t}-{rnd}", self.timeout)
        check_each(ex, check, f"comm-{t}-{rnd}")
        require_honest(ex, f"comm-{t}-{rnd}", len(ex.replies), len(targets), self.common)
        self._account("community_training", ex, "comm")
        self.copies.answered({nid: [g for g, _ in members[self.index[nid]]]
                              for nid in ex.replies}, copies)
        out: dict[int, list[Contribution]] = {}
        for nid, c in ex.replies.items():
            models, counts = decoded[nid], c.array_records["counts"]["counts"].numpy()
            got = ae.from_numpy(models)
            out[self.index[nid]] = [
                Contribution(g, [p[j:j + 1] for p in got], float(counts[j]))
                for j, (g, _) in enumerate(members[self.index[nid]])]
        return out

    # -- lines 26-30 --------------------------------------------------------------------------
    def refine(self, t: int, targets: list[int], params: ae.Params,
               members: dict[int, list[tuple[int, list[int]]]]) -> dict[int, RefineReply]:
        LOG.info("iteration %d: %d communities trained", t, ae.n_models(params))
        mode = self.s.refinement
        np_params = ae.to_numpy(params) if ae.n_models(params) else {}
        sent: dict[int, int] = {}
        encode = self.copies.encoder(np_params, self.s.wire)

        def content(nid: int) -> RecordDict:
            i = self.index[nid]
            offer = core_refine_inputs(params, members.get(i, []), mode)
            mine, ids = offer.members, offer.ids
            sent[nid] = len(ids)
            c = RecordDict({"config": ConfigRecord({"iteration": t,
                                                    **fw.members_config(ids, mine)}),
                            "result": result_record(self.result)})
            if len(ids):
                c["models"] = fw.arrays(encode(nid, [int(g) for g in ids],
                                               self.init_ok.get(nid, False)))
            return c

        def check(nid: int, c: RecordDict) -> str | None:
            _, rows, k = self.declared.get(nid, (None, None, None))
            return fw.check_refine(c, sent[nid] if mode.confirms else None, k, rows)

        ex = send_and_collect(self.grid, [self.nodes[i] for i in targets], content,
                              "train.fedcref_refine", f"refine-{t}", self.timeout)
        check_each(ex, check, f"refine-{t}")
        require_honest(ex, f"refine-{t}", len(ex.replies), len(targets), self.common)
        self._account("refinement", ex, "refine")
        out = {}
        for nid, c in ex.replies.items():
            i = self.index[nid]
            agreement, confirmed, share = fw.read_refine(c)
            out[i] = RefineReply(agreement, fw.read_hist(c), confirmed, share)
            if out[i].hist is not None:
                self.hists[i] = out[i].hist
        return out

    def note_communities(self, t: int, members: dict[int, list[tuple[int, list[int]]]]
                         ) -> None:
        def content(nid: int) -> RecordDict:
            mine = members[self.index[nid]]
            return RecordDict({"config": ConfigRecord(
                fw.members_config([g for g, _ in mine], [qs for _, qs in mine])),
                "result": result_record(self.result)})

        ex = send_and_collect(self.grid, [self.nodes[i] for i in sorted(members)], content,
                              "query.fedcref_member", f"member-{t}", self.timeout)
        self._account("community_training", ex, "comm")

    def annotate(self, rec: dict[str, Any]) -> None:
        """Add this iteration's dropped nodes and traffic to its record."""
        rec["dropped_nodes"] = {k: v for k, v in self.dropped_now.items() if v}
        for v in self.dropped_now.values():
            self.dropped |= set(v)
        # bytes_* and *seconds are running totals since the start of the run; *_iter are this
        # iteration's share
        rec["bytes_sent"], rec["bytes_received"] = self.traffic.sent, self.traffic.received
        rec["bytes_by_phase"] = dict(self.traffic.by_phase)
        rec["seconds"] = dict(self.traffic.seconds)
        rec["client_seconds"] = dict(self.traffic.client_seconds)
        rec.update(self.traffic.since_mark())
        rec["bytes_per_client_iter"] = ((rec["bytes_sent_iter"] + rec["bytes_received_iter"])
                                        / max(self.n, 1))


class _Copies:
    """The int8-delta bases of one iteration's community models (:mod:`fedclust.fedcref.wire`).

    A node that answered the last community round holds the models it received in it, so the
    next round's models (and the refinement's) go as their difference from those; a fresh
    community model goes to a node that rebuilds the seeded initialisations as its difference
    from that initialisation; any other as its codes (no base). Every base gives the
    receiver the same ``int8`` weights: the choice changes the bytes, never the trajectory.
    """

    def __init__(self) -> None:
        self.held: dict[int, set[int]] = {}       # node -> communities it holds a copy of
        self.last: dict[int, dict[str, np.ndarray]] = {}   # community -> that copy
        self.fresh: set[int] = set()              # communities that start from their init
        self.init: dict[str, np.ndarray] = {}
        self.seed = self.count = 0

    def start(self, np_params: dict[str, np.ndarray], seed: int, layer: list[int],
              ae_init: str) -> None:
        """Round 1: which communities start from the seeded initialisation of all of them."""
        self.seed, self.count = int(seed), int(np_params["W0"].shape[0])
        self.init = ae.to_numpy(ae.init_params(self.count, layer, self.seed, ae_init))
        self.fresh = {g for g in range(self.count)
                      if all(np.array_equal(np_params[k][g], self.init[k][g]) for k in np_params)}
        self.held, self.last = {}, {}

    def answered(self, gs: dict[int, list[int]], copies: dict[int, dict[str, np.ndarray]]
                 ) -> None:
        """After a round: the nodes that answered hold the copies of their communities."""
        self.held = {nid: set(g) for nid, g in gs.items()}
        self.last = copies

    def encoder(self, np_params: dict[str, np.ndarray], fmt: str
                ) -> Callable[[int, list[int], bool], dict[str, np.ndarray]]:
        """``encode(node, communities, rebuilds inits)``: the encoded models of
        ``communities`` for ``node`` (each model encoded once per base)."""
        done: dict[tuple[int, int], dict[str, np.ndarray]] = {}

        def one(g: int, kind: int) -> dict[str, np.ndarray]:
            if (g, kind) not in done:
                row = {k: v[[g]] for k, v in np_params.items()}
                if kind == wire.HELD:
                    base, ids = self.last[g], fw.held_ids([g])
                elif kind == wire.INIT:
                    base = {k: v[[g]] for k, v in self.init.items()}
                    ids = np.array([[wire.INIT, self.seed, self.count, g]], dtype=np.int64)
                else:
                    base, ids = None, None
                done[(g, kind)] = wire.encode(row, fmt, base, ids)
            return done[(g, kind)]

        def encode(nid: int, gs: list[int], init_ok: bool) -> dict[str, np.ndarray]:
            if fmt != wire.DELTA:
                return wire.encode({k: v[gs] for k, v in np_params.items()}, fmt)
            held = self.held.get(nid, set())
            return wire.join([one(g, wire.HELD if g in held else wire.INIT
                                  if init_ok and g in self.fresh else wire.NONE)
                              for g in gs])

        return encode


def _key(node: Node, version: int) -> str:
    """Name of one cluster model version in messages (``client:cluster:version``)."""
    return f"{node[0]}:{node[1]}:{version}"


def run(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    """``method=fedcref`` (``preflight`` runs before, from the ServerApp's method registry):
    :func:`fedclust.fedcref.algorithm.run` over :class:`FlowerClients`."""
    loop, settings = Settings.from_config(cfg), ClientSettings.from_config(cfg)
    clients = FlowerClients(grid, connected_clients(grid, cfg), CommonSettings.from_config(cfg),
                            settings,
                            str(recorder.dir), loop.association)
    progress = Progress(loop.max_iterations, "fedcref iteration")

    def log(rec: dict[str, Any]) -> None:
        clients.annotate(rec)
        recorder.log_round(rec)
        progress.step(rec["iteration"],
                      f"communities {rec['communities']} isolated {rec['isolated']} active "
                      f"{rec['active_after']}" + (f" acc {rec['eval_acc']:.3f}"
                                                  if "eval_acc" in rec else ""))

    outcome = algorithm.run(clients, loop, log)
    comm_params = outcome.community_models

    # what `fedclust predict RUN_DIR` applies: the last iteration's community models
    from fedclust.fedcref.predict import COMMUNITY_MODELS, save_models

    if ae.n_models(comm_params):
        # as the clients received them (in the wire format), so that the server's models and
        # the copies in the clients' models.npz are the same numbers
        sent = ae.from_numpy(wire.roundtrip(ae.to_numpy(comm_params), settings.wire))
        save_models(recorder.path(COMMUNITY_MODELS), sent, np.arange(ae.n_models(sent)))
    else:   # no community at the end (and none left from an earlier run in this folder)
        recorder.path(COMMUNITY_MODELS).unlink(missing_ok=True)
    if cfg["plots"]:
        try:
            from fedclust.fedcref.plots import figure4

            last = outcome.history[-1] if outcome.history else {}
            figure4(recorder.path("fedcref_figure4.png"), [recorder.history],
                    global_k=last.get("eval_global_k"), starts=[outcome.start])
        except Exception as exc:  # plots never fail a run
            LOG.warning("plot failed: %s", exc)
    traffic = clients.traffic
    per_iter = [h["bytes_per_client_iter"] for h in outcome.history]
    # the mean over iterations of each iteration's bytes per client, and its share per phase
    scale = 1.0 / (max(clients.n, 1) * len(per_iter)) if per_iter else 0.0
    return {**outcome.summary, "bytes_sent": traffic.sent, "bytes_received": traffic.received,
            "bytes_per_client_iter": sum(per_iter) / len(per_iter) if per_iter else 0.0,
            "bytes_per_client_iter_by_phase": {k: v * scale
                                               for k, v in traffic.by_phase.items()},
            "seconds": traffic.seconds, "client_seconds": traffic.client_seconds,
            "dropped_nodes": sorted(clients.dropped)}
