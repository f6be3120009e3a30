"""Server loop of FedCRef (paper 000, Algorithm 1).

One iteration t:

1. ``train.fedcref_local`` — active clients (re)train one autoencoder per local cluster and send
   it; inactive clients keep theirs (the server still relays their last version).
2. ``query.fedcref_assoc`` — the server relays the cluster models; every client receives only
   the model versions it has not evaluated yet (it caches their errors), tests eq. (2) for each
   of its clusters against each foreign model and returns the accept bits. A node whose cache
   was lost lists the missing keys and gets them in a second message.
3. Graph Γ: an edge when both sides accept (line 13); communities = connected components with
   ≥ 2 clusters (networkx), the rest isolated.
4. ``train.fedcref_comm`` × ``fl-rounds`` — FedAvg of all community models in parallel; a client
   trains all of its communities in one message; the community model is the aggregate.
5. ``train.fedcref_refine`` — active clients run Algorithm 2 with their own models and all
   community models and report ACC(previous, new) for the stability test (τ).

The results for each data owner travel in these messages, with no extra round trip: the
config record ``"result"`` (the run folder, for simulated clients) rides on every local,
community and refinement message; a client learns the community of each of its clusters from
the community rounds (none: isolated) and writes its labels and the models that define them
after each refinement (docs/fedcref.md, "Results for each data owner"). At the end the server
saves the final community models as ``community_models.npz`` for ``fedclust predict``.

Stop when no client is active, when communities and isolated counts changed by at most
``stop-change`` for ``stop-window`` consecutive iterations, or after ``max-iterations``.
Clients that do not answer are left out of that step and recorded (``dropped_nodes``).
Evaluation metrics (``eval_*``) come from per-cluster true-class histograms sent by the
clients only when ``evaluate`` is true and the node allows it (a simulated node always; a
deployed node with node config ``allow-evaluation=true``, :mod:`client_apps.evaluation`); they
cover only the nodes that sent them (``eval_nodes``). The algorithm never uses them (except
the explicit ``association=perfect`` baseline, which refuses to run without every node's).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.serverapp import Grid

from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref.association import communities, mutual_edges, perfect_edges
from fedclust.fedcref.client import derive_seed, hidden_sizes
from fedclust.fedcref.evaluation import majority_classes, mean_accuracy, wrong_associations
from fedclust.fedcref.stopping import StabilityStop
from fedclust.results import Progress, RunRecorder
from strategies.common import (
    Exchange,
    check_each,
    connected_clients,
    result_record,
    send_and_collect,
)

LOG = logging.getLogger("fedclust")
Node = tuple[int, int]   # (client index, local cluster)


def _arrays(named: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in named.items()})


class _Traffic:
    """Running totals of bytes and seconds per phase, with per-iteration differences."""

    def __init__(self) -> None:
        self.sent = self.received = 0
        self.seconds: dict[str, float] = {}
        self.client_seconds: dict[str, float] = {}
        self._mark: tuple[int, int, dict[str, float], dict[str, float]] = (0, 0, {}, {})

    def since_mark(self) -> dict[str, Any]:
        """What was added since the previous call (one iteration), then move the mark."""
        sent, received, secs, csecs = self._mark
        out = {"bytes_sent_iter": self.sent - sent,
               "bytes_received_iter": self.received - received,
               "seconds_iter": {k: v - secs.get(k, 0.0) for k, v in self.seconds.items()},
               "client_seconds_iter": {k: v - csecs.get(k, 0.0)
                                       for k, v in self.client_seconds.items()}}
        self._mark = (self.sent, self.received, dict(self.seconds), dict(self.client_seconds))
        return out

    def add(self, phase: str, ex: Exchange) -> None:
        self.sent += ex.bytes_sent
        self.received += ex.bytes_received
        self.seconds[phase] = self.seconds.get(phase, 0.0) + ex.seconds
        cs = sum(float(r.metric_records["metrics"].get("seconds", 0.0))
                 for r in ex.replies.values() if "metrics" in r.metric_records)
        self.client_seconds[phase] = self.client_seconds.get(phase, 0.0) + cs


def _metrics(content: RecordDict, *names: str) -> str | None:
    if "metrics" not in content.metric_records:
        return "missing metric record 'metrics'"
    met = content.metric_records["metrics"]
    for name in names:
        if name not in met:
            return f"metrics lack '{name}'"
        if not np.all(np.isfinite(np.asarray(met[name], dtype=float))):
            return f"metric '{name}' is not finite"
    return None


def model_shapes(sizes: list[int], rows: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of ``rows`` stacked autoencoders with layer sizes ``sizes``."""
    out: dict[str, tuple[int, ...]] = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=False)):
        out[f"W{i}"], out[f"b{i}"] = (rows, fan_in, fan_out), (rows, 1, fan_out)
    return out


def _models(content: RecordDict, name: str, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Array record ``name`` holds exactly the arrays ``shapes`` names, of those shapes, finite."""
    if name not in content.array_records:
        return f"missing array record '{name}'"
    rec = content.array_records[name]
    if set(rec) != set(shapes):
        return f"'{name}' has arrays {sorted(rec)}, expected {sorted(shapes)}"
    for k, shape in shapes.items():
        a = rec[k].numpy()
        if a.shape != shape:
            return f"'{name}.{k}' has shape {a.shape}, expected {shape}"
        if not np.all(np.isfinite(a)):
            return f"'{name}.{k}' has non-finite values"
    return None


def _check_local(content: RecordDict, sizes: list[int] | None, hidden: list[int]
                 ) -> str | None:
    """Reply of ``train.fedcref_local``: k, identity key, version and the stacked models
    (layer sizes ``sizes`` once known, else those its own input width implies)."""
    problem = _metrics(content, "k", "key", "version")
    if problem:
        return problem
    k = int(content.metric_records["metrics"]["k"])
    if k < 1:
        return f"k = {k} < 1"
    if "models" in content.array_records:
        if "clusters" not in content.array_records:
            return "models without array record 'clusters'"
        clusters = content.array_records["clusters"]["clusters"].numpy()
        if clusters.ndim != 1 or np.any(clusters < 0) or np.any(clusters >= k) \
                or len(np.unique(clusters)) != len(clusters):
            return (f"'clusters' must list distinct local clusters in 0..{k - 1}, got "
                    f"{clusters.tolist()}")
        w0 = content.array_records["models"].get("W0")
        if w0 is None or w0.numpy().ndim != 3:
            return "'models' lacks a 3-D 'W0'"
        dims = sizes or ae.layer_sizes(int(w0.numpy().shape[1]), hidden)
        problem = _models(content, "models", model_shapes(dims, len(clusters)))
    return problem or _check_hist(content, k)


def _check_hist(content: RecordDict, k: int) -> str | None:
    if "eval" in content.array_records:
        h = content.array_records["eval"]["hist"].numpy()
        if h.ndim != 2 or h.shape[0] != k:
            return f"'eval.hist' has shape {h.shape}, expected ({k}, classes)"
    return None


def _check_accept(content: RecordDict, k: int, n_foreign: int) -> str | None:
    """Reply of ``query.fedcref_assoc``: a (k, n_foreign) accept matrix or missing keys."""
    met = content.metric_records.get("metrics")
    miss = list(met.get("missing", [])) if met is not None else []
    if miss:
        if any(not 0 <= int(i) < n_foreign for i in miss):
            return f"'missing' indices outside 0..{n_foreign - 1}"
        return None
    if "accept" not in content.array_records:
        return "neither 'accept' nor 'missing' in the reply"
    shape = content.array_records["accept"]["accept"].numpy().shape
    if shape != (k, n_foreign):
        return f"'accept' has shape {shape}, expected {(k, n_foreign)}"
    return None


def _check_comm(content: RecordDict, shapes: dict[str, tuple[int, ...]]) -> str | None:
    """Reply of ``train.fedcref_comm``: the models it was sent (same names and shapes), trained,
    and one sample count per community."""
    problem = _models(content, "models", shapes)
    if problem:
        return problem
    n_comm = shapes["W0"][0]
    if "counts" not in content.array_records:
        return "missing array record 'counts'"
    counts = content.array_records["counts"]["counts"].numpy()
    if counts.shape != (n_comm,) or np.any(counts < 0) or not np.all(np.isfinite(counts)):
        return f"'counts' must be {n_comm} non-negative numbers, got shape {counts.shape}"
    return None


def _check_refine(content: RecordDict) -> str | None:
    problem = _metrics(content, "agreement")
    if problem:
        return problem
    if "eval" in content.array_records and content.array_records["eval"]["hist"].numpy().ndim != 2:
        return "'eval.hist' must be 2-D"
    return None


def _hist(content: RecordDict) -> np.ndarray | None:
    if "eval" in content.array_records:
        return content.array_records["eval"]["hist"].numpy()
    return None


def _pad(tables: list[np.ndarray]) -> list[np.ndarray]:
    width = max((t.shape[1] for t in tables), default=0)
    return [np.pad(t, ((0, 0), (0, width - t.shape[1]))) for t in tables]


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


def run(grid: Grid, cfg: dict[str, Any], recorder: RunRecorder) -> dict[str, Any]:
    """``method=fedcref`` (``preflight`` runs before, from the ServerApp's method registry)."""
    nodes = connected_clients(grid, cfg)
    index = {nid: i for i, nid in enumerate(nodes)}
    seed, timeout = cfg["seed"], cfg["timeout"]
    mode = cfg["fedcref.association"]
    evaluate = cfg["evaluate"]
    active = set(nodes)
    store: dict[Node, tuple[int, dict[str, Array]]] = {}   # (client, q) -> (version, arrays)
    evaluated: dict[int, set[str]] = {nid: set() for nid in nodes}
    ks: dict[int, int] = {}
    hists: dict[int, np.ndarray] = {}        # eval: per client (K, C) at association time
    traffic = _Traffic()
    dropped: set[int] = set()
    stopper = StabilityStop(cfg["fedcref.stop-window"], cfg["fedcref.stop-change"])
    acc_start = float("nan")
    iso_start: int | None = None
    iso_first: int | None = None
    progress = Progress(cfg["fedcref.max-iterations"], "fedcref iteration")
    last: dict[str, Any] = {}
    stop_reason = "max-iterations"
    layer: list[int] | None = None
    hidden = hidden_sizes(cfg)
    result_dir = str(recorder.dir)    # simulated clients keep their owner's results under it
    comm_params: ae.Params = []
    t = 0
    for t in range(1, cfg["fedcref.max-iterations"] + 1):
        rec: dict[str, Any] = {"iteration": t, "active_clients": len(active)}
        dropped_now: dict[str, dict[int, str]] = {}   # phase -> node -> reason

        # 1. local cluster models ------------------------------------------------------------
        def local_content(nid: int, t: int = t) -> RecordDict:
            return RecordDict({"config": ConfigRecord({
                "active": nid in active, "iteration": t,
                "seed": derive_seed(seed, t, 1)}), "result": result_record(result_dir)})

        def check_local(nid: int, content: RecordDict) -> str | None:
            nonlocal layer     # the first valid model fixes the layer sizes of the run
            problem = _check_local(content, layer, hidden)
            if problem is None and layer is None and "models" in content.array_records:
                layer = ae.layer_sizes(
                    content.array_records["models"]["W0"].numpy().shape[1], hidden)
            return problem

        ex = send_and_collect(grid, nodes, local_content, "train.fedcref_local", f"local-{t}",
                              timeout)
        check_each(ex, check_local, f"local-{t}")
        if not ex.replies:
            raise RuntimeError(
                f"FedCRef iteration {t}: no client answered the local phase; reasons: "
                + "; ".join(f"node {n}: {why}" for n, why in sorted(ex.failed.items())))
        if t == 1:
            # Client order (and so community order) by the clients' own identity keys, not by
            # node ids, which differ between engines and runs (see client_key).
            nodes = order_by_client_key(nodes, {nid: int(c.metric_records["metrics"]["key"])
                                                for nid, c in ex.replies.items()})
            index = {nid: i for i, nid in enumerate(nodes)}
        traffic.add("local_training", ex)
        LOG.info("iteration %d: local training %.1fs", t, ex.seconds)
        dropped_now["local"] = dict(ex.failed)
        for nid, content in ex.replies.items():
            met = content.metric_records["metrics"]
            ks[nid] = int(met["k"])
            if "models" in content.array_records:
                version = int(met["version"])
                clusters = content.array_records["clusters"]["clusters"].numpy()
                mrec = content.array_records["models"]
                for key in [k for k in store if k[0] == index[nid]]:
                    del store[key]
                for i, q in enumerate(clusters):
                    store[(index[nid], int(q))] = (version, {
                        name: Array(mrec[name].numpy()[i:i + 1]) for name in mrec})
            h = _hist(content)
            if h is not None:
                hists[nid] = h
        if t == 1 and evaluate:
            _check_evaluation(ex.replies, hists, mode)
        if t == 1 and evaluate and hists:
            acc_start = mean_accuracy(_pad([hists[n] for n in sorted(hists)]))
        responding = [n for n in nodes if n in ex.replies]
        graph_nodes: list[Node] = [key for key in store if nodes[key[0]] in ex.replies]
        # clusters below fedcref.min-cluster-size (or emptied by refinement) have no model, so
        # they are not graph nodes: they are left out of every cluster count, isolated_start
        # included, and reported on their own
        rec["unmodelled_clusters"] = int(sum(ks[n] for n in responding)) - len(graph_nodes)
        if iso_start is None:
            # the paper's "isolated start" (Tables 3-8, Fig. 4d): before any association every
            # cluster is isolated, i.e. Σ K_i (here: the clusters that have a model)
            iso_start = len(graph_nodes)

        # 2. association on the clients --------------------------------------------------------
        accept: dict[Node, set[Node]] = {n: set() for n in graph_nodes}
        if mode == "mutual":
            keys_all = {key: f"{key[0]}:{key[1]}:{store[key][0]}" for key in graph_nodes}

            def foreign(nid: int, graph_nodes: list[Node] = graph_nodes,
                        index: dict[int, int] = index) -> list[Node]:
                return [key for key in graph_nodes if key[0] != index[nid]]

            def assoc_content(nid: int, only: set[str] | None = None,
                              keys_all: dict[Node, str] = keys_all) -> RecordDict:
                fk = foreign(nid)
                names = [keys_all[k] for k in fk]
                send = [k for k in fk if keys_all[k] not in evaluated[nid]
                        and (only is None or keys_all[k] in only)]
                arrs = {f"{keys_all[k]}/{name}": arr for k in send
                        for name, arr in store[k][1].items()}
                content = RecordDict({"config": ConfigRecord(
                    {"keys": names} if names else {"no-keys": True})})
                if arrs:
                    content["models"] = ArrayRecord(arrs)
                return content

            ex = send_and_collect(grid, responding, assoc_content, "query.fedcref_assoc",
                                  f"assoc-{t}", timeout)
            check_each(ex, lambda nid, c: _check_accept(c, ks[nid], len(foreign(nid))),
                       f"assoc-{t}")
            traffic.add("cross_evaluation", ex)
            retry = {}
            for nid, content in ex.replies.items():
                met = content.metric_records.get("metrics")
                miss = list(met.get("missing", [])) if met is not None else []
                if miss:
                    fk = foreign(nid)
                    retry[nid] = {keys_all[fk[int(i)]] for i in miss}
                    evaluated[nid] -= retry[nid]
            replies = dict(ex.replies)
            failed = dict(ex.failed)
            if retry:
                ex2 = send_and_collect(grid, list(retry),
                                       lambda nid, retry=retry: assoc_content(nid, retry[nid]),
                                       "query.fedcref_assoc", f"assoc-{t}-resend", timeout)
                check_each(ex2, lambda nid, c: _check_accept(c, ks[nid], len(foreign(nid)))
                           or (None if "accept" in c.array_records else "still missing models"),
                           f"assoc-{t}-resend")
                traffic.add("cross_evaluation", ex2)
                replies.update(ex2.replies)
                failed.update(ex2.failed)
            dropped_now["assoc"] = failed
            LOG.info("iteration %d: cross-evaluation %.1fs", t, traffic.seconds["cross_evaluation"])
            for nid, content in replies.items():
                if "accept" not in content.array_records:
                    continue
                fk = foreign(nid)
                evaluated[nid] = {keys_all[k] for k in fk}
                mat = content.array_records["accept"]["accept"].numpy().astype(bool)
                for q in range(mat.shape[0]):
                    src = (index[nid], q)
                    if src in accept:
                        accept[src] = {fk[j] for j in np.flatnonzero(mat[q])}
            alive = {index[n] for n in replies if "accept" in replies[n].array_records}
            graph_nodes = [k for k in graph_nodes if k[0] in alive]
            edges = mutual_edges({k: v for k, v in accept.items() if k[0] in alive})
        elif mode == "perfect":
            node_hist = {(index[n], q): hists[n][q] for n in hists for q in range(len(hists[n]))}
            major = majority_classes({k: node_hist[k] for k in graph_nodes if k in node_hist})
            edges = perfect_edges(major)
        else:
            edges = []

        # 3. communities -----------------------------------------------------------------------
        groups, isolated = communities(graph_nodes, edges) if mode != "none" else ([], graph_nodes)
        rec.update({"communities": len(groups), "isolated": len(isolated),
                    "edges": len(edges), "clusters": len(graph_nodes)})
        if iso_first is None:
            iso_first = len(isolated)
        if evaluate and hists:
            node_hist = {(index[n], q): hists[n][q] for n in hists for q in range(len(hists[n]))}
            w, tot, pct = wrong_associations(groups, node_hist)
            rec.update({"eval_wrong_associations": w, "eval_associated_clusters": tot,
                        "eval_wrong_associations_pct": pct})
            present = _pad([hists[n] for n in sorted(hists)])
            holders = (np.stack([(h.sum(0) > 0) for h in present]).sum(0)
                       if present else np.zeros(0))
            rec["eval_global_k"] = int((holders > 0).sum())
            rec["eval_ideal_communities"] = int((holders >= 2).sum())

        # 4. community models (FedAvg, all communities in parallel) ----------------------------
        comm_params = []
        if groups and layer is not None:
            comm_params = ae.init_params(len(groups), layer, derive_seed(seed, 7, t, 2),
                                         cfg["fedcref.ae-init"])
            by_client: dict[int, list[tuple[int, list[int]]]] = {}
            for g, members in enumerate(groups):
                per: dict[int, list[int]] = {}
                for ci, q in members:
                    per.setdefault(ci, []).append(q)
                for ci, qs in per.items():
                    by_client.setdefault(ci, []).append((g, qs))
            for rnd in range(1, cfg["fedcref.fl-rounds"] + 1):
                np_params = ae.to_numpy(comm_params)

                def comm_content(nid: int, t: int = t, rnd: int = rnd, np_params: dict = np_params,
                                 by_client: dict = by_client,
                                 index: dict[int, int] = index) -> RecordDict:
                    mine = by_client[index[nid]]
                    gs = [g for g, _ in mine]
                    return RecordDict({
                        "models": _arrays({k: v[gs] for k, v in np_params.items()}),
                        "config": ConfigRecord({
                            "communities": gs, "members-len": [len(qs) for _, qs in mine],
                            "members-flat": [q for _, qs in mine for q in qs],
                            "seed": derive_seed(seed, t, 100 + rnd)}),
                        "result": result_record(result_dir)})

                targets = [nodes[ci] for ci in sorted(by_client)]
                ex = send_and_collect(grid, targets, comm_content, "train.fedcref_comm",
                                      f"comm-{t}-{rnd}", timeout)
                sent_shapes = {nid: model_shapes(layer, len(by_client[index[nid]]))
                               for nid in targets}
                check_each(ex, lambda nid, c, shapes=sent_shapes: _check_comm(c, shapes[nid]),
                           f"comm-{t}-{rnd}")
                traffic.add("community_training", ex)
                dropped_now["comm"] = {**ex.failed, **dropped_now.get("comm", {})}
                contributions: dict[int, list[tuple[ae.Params, float]]] = {}
                for nid, content in sorted(ex.replies.items(), key=lambda kv: index[kv[0]]):
                    got = ae.from_numpy({k: v.numpy() for k, v in
                                         content.array_records["models"].items()})
                    counts = content.array_records["counts"]["counts"].numpy()
                    for i, (g, _) in enumerate(by_client[index[nid]]):
                        if counts[i] > 0:
                            contributions.setdefault(g, []).append(
                                ([p[i:i + 1] for p in got], float(counts[i])))
                new = []
                for g in range(len(groups)):
                    if g in contributions:
                        stacks, weights = zip(*contributions[g], strict=False)
                        new.append(ae.fedavg(list(stacks), list(weights)))
                    else:
                        new.append([p[g:g + 1] for p in comm_params])
                comm_params = ae.concat(new)

        LOG.info("iteration %d: %d communities trained", t, len(groups))

        # 5. refinement on the active clients ------------------------------------------------
        refine_targets = [n for n in nodes if n in active]
        content = RecordDict({"config": ConfigRecord({"iteration": t}),
                              "result": result_record(result_dir)})
        if ae.n_models(comm_params):
            content["models"] = _arrays(ae.to_numpy(comm_params))
        ex = send_and_collect(grid, refine_targets, content, "train.fedcref_refine",
                              f"refine-{t}", timeout, validate=_check_refine)
        traffic.add("refinement", ex)
        dropped_now["refine"] = dict(ex.failed)
        agreements = {}
        for nid, rep in ex.replies.items():
            agreements[nid] = float(rep.metric_records["metrics"]["agreement"])
            if agreements[nid] >= cfg["fedcref.tau"]:
                active.discard(nid)
            h = _hist(rep)
            if h is not None:
                hists[nid] = h
        if evaluate and hists:
            rec["eval_acc"] = mean_accuracy(_pad([hists[n] for n in sorted(hists)]))
        rec["active_after"] = len(active)
        rec["mean_agreement"] = float(np.mean(list(agreements.values()))) if agreements else None
        rec["dropped_nodes"] = {k: v for k, v in dropped_now.items() if v}
        for v in dropped_now.values():
            dropped |= set(v)
        # bytes_* and *seconds are running totals since the start of the run; *_iter are this
        # iteration's share
        rec["bytes_sent"], rec["bytes_received"] = traffic.sent, traffic.received
        rec["seconds"] = dict(traffic.seconds)
        rec["client_seconds"] = dict(traffic.client_seconds)
        rec.update(traffic.since_mark())
        rec["sizes"] = [len(g) for g in groups]
        recorder.log_round(rec)
        last = rec
        progress.step(t, f"communities {len(groups)} isolated {len(isolated)} active "
                         f"{len(active)}" + (f" acc {rec['eval_acc']:.3f}"
                                             if "eval_acc" in rec else ""))

        # a client that no longer answers cannot become stable: it does not keep the run going
        reason = stopper.update(len(groups), len(isolated),
                                len(active & set(responding)))   # §4.5
        if reason is not None:
            stop_reason = reason
            break

    # what `fedclust predict RUN_DIR` applies: the last iteration's community models
    from fedclust.fedcref.predict import COMMUNITY_MODELS, save_models

    if ae.n_models(comm_params):
        save_models(recorder.path(COMMUNITY_MODELS), comm_params,
                    np.arange(ae.n_models(comm_params)))
    else:   # no community at the end (and none left from an earlier run in this folder)
        recorder.path(COMMUNITY_MODELS).unlink(missing_ok=True)
    if cfg["plots"]:
        try:
            from fedclust.fedcref.plots import figure4

            start = {"communities": 0, "isolated": iso_start, "active_clients": len(nodes),
                     "eval_acc": acc_start}
            figure4(recorder.path("fedcref_figure4.png"), [recorder.history],
                    global_k=last.get("eval_global_k"), starts=[start])
        except Exception as exc:  # plots never fail a run
            LOG.warning("plot failed: %s", exc)
    out: dict[str, Any] = {
        "iterations": t, "stop_reason": stop_reason,
        "communities": last.get("communities"), "isolated_start": iso_start,
        "isolated_first": iso_first, "isolated_end": last.get("isolated"),
        "active_clients": len(active & set(responding)),
        "active_unresponsive": sorted(active - set(responding)),
        "bytes_sent": traffic.sent, "bytes_received": traffic.received,
        "seconds": traffic.seconds, "client_seconds": traffic.client_seconds,
        "dropped_nodes": sorted(dropped), "association": mode,
    }
    if evaluate:
        out.update({"eval_acc_start": acc_start, "eval_acc_end": last.get("eval_acc"),
                    "eval_wrong_associations_pct": last.get("eval_wrong_associations_pct"),
                    "eval_global_k": last.get("eval_global_k"),
                    "eval_ideal_communities": last.get("eval_ideal_communities"),
                    "eval_nodes": len(hists)})
    return out
