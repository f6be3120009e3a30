"""ClientApp handlers of FedCRef (paper 000). Replies carry only models, accept bits, counts and
(when run config ``evaluate`` is true **and** the node allows it, :mod:`client_apps.evaluation`:
always in simulation, node config ``allow-evaluation=true`` on a deployed node) per-cluster
true-class histograms named ``eval``.

The start (``fedcref.init``, default ``auto``) is the paper's ``dirty`` split of the true
classes on a simulated node and label-free k-means on a deployed node (``data-path``); an
explicit ``dirty`` on a deployed node uses the file's ``y`` only where the node allows
evaluation, since its models then carry that ground truth.

Per-node state (labels, own models, the error cache of received models) lives in
``context.state`` so it survives between messages in simulation and in deployment.

Results for the data owner (``client_apps.results``; never sent): every refinement writes the
client's labels (``assignments.csv``), the models that define them (``models.npz``), a
client ``predict.json`` for ``fedclust predict`` and ``result.json``; the local phase and the
community rounds of each later iteration update ``result.json`` with the community each local
cluster is in, so that after the run it describes the last iteration (docs/fedcref.md,
"Results for each data owner").
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord

from client_apps.base import app, batched
from client_apps.common import LazyModule, reply, run_config, run_settings
from client_apps.evaluation import ALLOW_KEY, allows_evaluation, is_simulated
from fedclust.config import ConfigError
from fedclust.fedcref import wire
from fedclust.fedcref.keys import ClientSettings
from strategies.wire import fedcref as fw

# torch and the FedCRef core load on the first FedCRef message, not when the ClientApp starts.
torch = LazyModule("torch")
ae = LazyModule("fedclust.fedcref.autoencoder")
core = LazyModule("fedclust.fedcref.client")
_initial = LazyModule("fedclust.fedcref.initial")


def initial_clustering(*args: Any, **kwargs: Any) -> Any:
    return _initial.initial_clustering(*args, **kwargs)

STATE, CACHE, OWNER = "fedcref.state", "fedcref.cache", "fedcref.owner"
HELD = "fedcref.held"   # the community models received in the last round (int8-delta bases)
NODE = "fedcref.node"   # the client's identity key (and true classes), computed once
LOG = logging.getLogger("fedclust")
ISOLATED, NO_MODEL = -1, -2     # community entries of the owner state


# ---------------------------------------------------------------------------------------------
# data and state

@functools.lru_cache(maxsize=4)
def _deployment_data(path: str, data_format: str = "", label_column: str = ""
                     ) -> tuple[np.ndarray, np.ndarray | None]:
    # the node data door: size limits, finite pixel values, class-number labels, data-free
    # and path-free errors (fedclust.data.local.load_pixel_table); node config 'data-format'
    # and 'label-column' as an FCM node reads them (the label column is never a pixel)
    from fedclust.data.local import load_pixel_table

    return load_pixel_table(path, data_format, label_column)


def _given(cfg: dict[str, Any], s: ClientSettings | None) -> ClientSettings:
    """``s``, or the settings of the validated run config ``cfg`` when None."""
    return s if s is not None else ClientSettings.from_config(cfg)


def _data(context: Context, cfg: dict[str, Any], s: ClientSettings | None = None
          ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(x, y or None, K_i given or 0 = estimate).

    ``y`` (the true classes) only where this node may use them for evaluation
    (:func:`client_apps.evaluation.allows_evaluation`): run config ``evaluate`` and, on a
    deployed node, node config ``allow-evaluation``.
    """
    x, y, k = _node_data(context, _given(cfg, s))
    return x, (y if allows_evaluation(context, cfg) else None), k


def _node_data(context: Context, s: ClientSettings
               ) -> tuple[np.ndarray, np.ndarray | None, int]:
    """(x, y or None = the file has none, K_i given or 0): everything the node holds, before
    any permission check. Use :func:`_data` unless the labels are the simulated start's."""
    node = context.node_config
    if "data-path" in node:
        x, y = _deployment_data(str(node["data-path"]), str(node.get("data-format", "")),
                                str(node.get("label-column", "")))
        return x, y, int(node.get("num-clusters", 0))
    x, y = core.client_data(s.system, int(node["partition-id"]))
    # K_i is given in the paper's experiments (the number of classes the client was dealt)
    return x, y, int(np.unique(y).size)


def start_kind(context: Context, cfg: dict[str, Any], s: ClientSettings | None = None
               ) -> str:
    """The initial clustering this node runs: ``fedcref.init``, with ``auto`` resolved to
    ``dirty`` on a simulated node and ``kmeans`` on a deployed node."""
    from fedclust.fedcref.initial import resolve_init

    return resolve_init(_given(cfg, s).init, is_simulated(context.node_config, cfg))


def _dirty_labels(context: Context, cfg: dict[str, Any], s: ClientSettings
                  ) -> np.ndarray | None:
    """The true classes the ``dirty`` start is built from.

    A simulated node always has them (the paper's protocol). A deployed node's labels are for
    evaluation only, and the dirty start puts them into every model it sends: it may use them
    only where it allows evaluation (run config ``evaluate=true`` and node config
    ``allow-evaluation=true``); else the start is refused with the fix.
    """
    if not is_simulated(context.node_config, cfg) and not allows_evaluation(context, cfg):
        why = ("run config evaluate=false" if not cfg["evaluate"]
               else f"this node does not allow evaluation (node config {ALLOW_KEY} is not true)")
        raise ConfigError(
            "run config 'fedcref.init' = 'dirty' is a simulation protocol: it builds the start "
            "from the node's true classes, which then shape every model the node sends. This "
            f"deployed node (node config data-path) may not use its labels: {why}. Fix: use "
            "fedcref.init='auto' (the default: label-free k-means on deployed nodes) or "
            "'kmeans'/'dec'; or, for a test deployment of simulated data, run with "
            f"evaluate=true and give each node --node-config '... {ALLOW_KEY}=true'.")
    return _node_data(context, s)[1]


def _load_state(context: Context, with_cache: bool = False) -> core.ClientState | None:
    """The client's state; the error cache of received models only with ``with_cache`` (the
    association phase: the other phases neither read nor change it)."""
    if STATE not in context.state:
        return None
    rec = {k: v.numpy() for k, v in context.state[STATE].items()}
    models = ae.from_numpy({k[2:]: v for k, v in rec.items() if k.startswith("m.")})
    st = core.ClientState(labels=rec["labels"].astype(np.int64), k=int(rec["meta"][0]),
                          models=models, model_clusters=rec["model_clusters"].astype(np.int64),
                          version=int(rec["meta"][1]),
                          own_errors=rec.get("own_errors"),
                          held_out=rec["held_out"].astype(bool) if "held_out" in rec else None)
    if with_cache and CACHE in context.state:
        st.cache = {k: v.numpy() for k, v in context.state[CACHE].items()}
    return st


def _save_state(context: Context, st: core.ClientState, with_cache: bool = False) -> None:
    named = {"labels": st.labels, "meta": np.array([st.k, st.version], dtype=np.int64),
             "model_clusters": st.model_clusters}
    if st.own_errors is not None:
        named["own_errors"] = st.own_errors
    if st.held_out is not None:
        named["held_out"] = st.held_out.astype(np.uint8)
    if ae.n_models(st.models):
        named.update({f"m.{k}": v for k, v in ae.to_numpy(st.models).items()})
    context.state[STATE] = ArrayRecord({k: Array(np.ascontiguousarray(v))
                                        for k, v in named.items()})
    if with_cache:
        context.state[CACHE] = ArrayRecord({k: Array(np.ascontiguousarray(v))
                                            for k, v in st.cache.items()})


def _init_state(context: Context, cfg: dict[str, Any], x: np.ndarray, y: np.ndarray | None,
                k: int, seed: int, s: ClientSettings | None = None) -> core.ClientState:
    s = _given(cfg, s)
    kind = start_kind(context, cfg, s)
    estimate = s.estimate_k or k == 0
    if kind == "dirty":
        y = _dirty_labels(context, cfg, s)
        k = dirty_k(y, k, context.node_config.get("data-path"))
    else:
        y = None    # a label-free start: kmeans/dec never see the true classes
    start = {"dirty": _initial.Dirty(s.dirtiness),
             "dec": _initial.DECStart({"pretrain_epochs": s.dec_pretrain_epochs,
                                       "maxiter": s.dec_maxiter})}.get(kind, kind)
    k_i = range(2, s.k_estimate_max + 1) if estimate and kind != "dirty" else max(k, 2)
    labels = initial_clustering(start, x, k_i, y_true=y, random_state=seed)
    return core.ClientState(labels=labels, k=int(labels.max()) + 1 if kind != "dirty" else k)


def dirty_k(y: np.ndarray | None, k: int, where: Any = None) -> int:
    """K_i of the ``dirty`` start: the number of true classes on the client.

    The dirty split is built from the client's true classes (a simulation), so K_i is not
    free: a node-config ``num-clusters`` must agree with it, and a node without classes
    cannot use it.
    """
    src = f"data file {where}" if where else "this client's data"
    if y is None or len(y) == 0:
        raise ValueError(
            f"fedcref.init='dirty' builds the start from the true classes, but {src} has none "
            "(no 'y' array). Fix: use fedcref.init='auto' (the default; k-means on a deployed "
            "node), 'kmeans' or 'dec' (K_i from the node-config key num-clusters, or "
            "estimated by silhouette when it is absent), or give the node's .npz a 'y' array.")
    n_true = int(np.unique(y).size)
    if k and k != n_true:
        raise ValueError(
            f"node-config num-clusters={k} but {src} holds {n_true} classes, which is the "
            "dirty start's K_i. Fix: drop num-clusters from the node config or set it to "
            f"{n_true}.")
    return n_true


def _setup(msg: Message, context: Context, with_cache: bool = False
           ) -> tuple[dict, ClientSettings, np.ndarray, np.ndarray | None, core.ClientState,
                      dict, int]:
    """(run config, its settings, x, y or None, state, message config, identity key) of one
    message."""
    cfg = run_config(context)
    s = run_settings(context, ClientSettings.from_config)
    s.torch_device()    # fedcref.device=cuda without a GPU: an error reply naming the key
    torch.set_num_threads(s.torch_threads)
    x, y, k = _data(context, cfg, s)
    key = node_key(context, x)
    conf = dict(msg.content.config_records["config"]) if "config" in \
        msg.content.config_records else {}
    st = _load_state(context, with_cache)
    if st is None:
        st = _init_state(context, cfg, x, y, k, core.derive_seed(s.seed, key, 0), s)
    return cfg, s, x, y, st, conf, key   # y: None unless allows_evaluation (see _data)


def node_key(context: Context, x: np.ndarray) -> int:
    """This client's identity key (:func:`fedclust.fedcref.client.client_key`), computed on
    the node's first message and kept in ``context.state`` (a digest of all its samples)."""
    if NODE in context.state:
        return int(context.state[NODE]["key"])
    key = core.client_key(x)
    context.state[NODE] = MetricRecord({"key": key})
    return key


def _client_seed(conf: dict, key: int) -> int:
    return core.derive_seed(int(conf["seed"]), key)    # the phase's seed, sent by the server


def _eval(st: core.ClientState, y: np.ndarray | None, s: ClientSettings) -> np.ndarray | None:
    """The (K, classes) true-class histograms of the clusters, evaluation only."""
    if y is None or not s.evaluate:
        return None
    return core.class_histograms(st.labels, y, st.k, int(y.max()) + 1)


def _received(msg: Message, s: ClientSettings, held: dict[int, dict[str, np.ndarray]]
              ) -> dict[str, np.ndarray] | None:
    """The models of a message's ``models`` record, decoded (None: there are none), their
    int8-delta bases built from the seeded initialisations they name and the community
    copies ``held`` (:func:`_load_held`)."""
    return fw.read_models(msg.content, resolve=_resolver(s, held))


def _resolver(s: ClientSettings, held: dict[int, dict[str, np.ndarray]] | None = None
              ) -> fw.Resolver:
    def copy(g: int) -> dict[str, np.ndarray]:
        if g not in held_:
            raise wire.BaseMismatch(f"this node keeps no copy of community {g}")
        return held_[g]

    held_ = held or {}
    return lambda ids, sizes: wire.resolve(ids, sizes, s.ae_init, copy)


def _load_held(context: Context) -> dict[int, dict[str, np.ndarray]]:
    """The community models this node received in the last round, by community."""
    out: dict[int, dict[str, np.ndarray]] = {}
    if HELD in context.state:
        for name, arr in context.state[HELD].items():
            g, _, layer = name.partition("/")
            out.setdefault(int(g), {})[layer] = arr.numpy()
    return out


def _save_held(context: Context, ids: list[int], models: dict[str, np.ndarray] | None) -> None:
    """Keep the community models ``ids`` of this round (and no others) as the bases of the
    next round's int8-delta models."""
    rec = ArrayRecord()
    if models is not None:
        for j, g in enumerate(ids):
            for k, v in models.items():
                rec[f"{int(g)}/{k}"] = Array(np.ascontiguousarray(v[j:j + 1]))
    context.state[HELD] = rec


@functools.lru_cache(maxsize=4)
def _init_check(hidden: tuple[int, ...], init_kind: str) -> int:
    return wire.init_check(hidden, init_kind)


def _local_bases(conf: dict, s: ClientSettings, seed: int, count: int, width: int
                 ) -> tuple[dict[str, np.ndarray] | None, np.ndarray | None, bool | None]:
    """What this node's fresh cluster models are sent against (int8-delta): their seeded
    initialisation, when the server's initialisations match this node's (``init-check``)
    and no model was warm-started; else nothing. Also whether they match (None: not asked)."""
    if "init-check" not in conf:
        return None, None, None
    ok = int(conf["init-check"]) == _init_check(tuple(s.hidden), s.ae_init)
    if not ok or s.wire != wire.DELTA or s.warm_start or not count:
        return None, None, ok
    ids = fw.init_ids(seed, count)
    return wire.resolve(ids, ae.layer_sizes(width, s.hidden), s.ae_init), ids, ok


# ---------------------------------------------------------------------------------------------
# results for the data owner (written on the node, never sent)

def _owner_state(context: Context, k: int) -> dict[str, np.ndarray]:
    """What the owner's ``result.json`` needs between messages: ``community`` (K,) — the
    community of each local cluster in iteration ``meta[0]`` (ISOLATED, NO_MODEL) — and the
    last refinement's selected models (``used_*``, iteration ``meta[1]``; 0 = none yet)."""
    if OWNER in context.state:
        return {k_: v.numpy().copy() for k_, v in context.state[OWNER].items()}
    empty = np.zeros(0, dtype=np.int64)
    return {"community": np.full(k, NO_MODEL, dtype=np.int64),
            "meta": np.zeros(2, dtype=np.int64), "used_clusters": empty,
            "used_kind": empty, "used_ref": empty}


def _save_owner(context: Context, own: dict[str, np.ndarray]) -> None:
    context.state[OWNER] = ArrayRecord({k: Array(np.ascontiguousarray(v, dtype=np.int64))
                                        for k, v in own.items()})


def owner_result(st: core.ClientState, own: dict[str, np.ndarray], n_rows: int,
                 run_id: int) -> dict[str, Any]:
    """``result.json`` of a FedCRef client (schema: docs/fedcref.md)."""
    rows = np.bincount(st.labels, minlength=st.k)
    model_of = {int(q): i for i, q in enumerate(own["used_clusters"])}
    clusters = {}
    for q in range(st.k):
        c = int(own["community"][q]) if q < len(own["community"]) else NO_MODEL
        status = "community" if c >= 0 else "isolated" if c == ISOLATED else "unmodelled"
        clusters[str(q)] = {"rows": int(rows[q]), "community": c if c >= 0 else None,
                            "isolated": c == ISOLATED, "status": status,
                            "model": model_of.get(q)}
    models = []
    for q, kind, ref in zip(own["used_clusters"], own["used_kind"], own["used_ref"],
                            strict=True):
        src = ({"source": "community", "community": int(ref), "iteration": int(own["meta"][1])}
               if kind == core.USED_COMMUNITY else {"source": "own", "own_cluster": int(ref)})
        models.append({"cluster": int(q), **src})
    files = ["assignments.csv", "predict.json"] + (["models.npz"] if models else [])
    return {"method": "fedcref", "run_id": run_id, "rows": int(n_rows), "k": int(st.k),
            "iteration": int(own["meta"][0]), "labels_iteration": int(own["meta"][1]),
            "clusters": clusters, "models": models, "files": files}


def _keep_owner_results(msg: Message, context: Context, s: ClientSettings,
                        st: core.ClientState, own: dict[str, np.ndarray], n_rows: int,
                        refined: bool) -> None:
    """Write the owner's files: after a refinement all of them, else ``result.json`` only
    (and nothing before the first refinement)."""
    from client_apps import results
    from fedclust.fedcref.predict import MODELS, save_models

    if not refined and int(own["meta"][1]) == 0:
        return
    folder = results.owner_dir(msg, context)
    if folder is None:
        return
    if refined:
        results.write_assignments(folder, st.labels)
        if ae.n_models(st.used_models):
            save_models(folder / MODELS, st.used_models, st.used_clusters, st.gate_models,
                        st.gate_allow)
        else:
            (folder / MODELS).unlink(missing_ok=True)
        results.write_predict_info(folder, "fedcref",
                              {"fedcref.torch-threads": s.torch_threads},
                              models=MODELS, label="local cluster",
                              iteration=int(own["meta"][1]))
    results.write_result(folder, owner_result(st, own, n_rows, context.run_id))


# ---------------------------------------------------------------------------------------------
# handlers

@app.train("fedcref_local")
def fedcref_local(msg: Message, context: Context) -> Message:
    """Algorithm 1 lines 6–8: (re)train one autoencoder per local cluster if active."""
    begun = _local_begin(msg, context)
    plan, device = begun[-2], begun[-1]
    return _local_end(msg, context, begun,
                      [c.run(device) for c in plan.calls] if plan is not None else [])


def _local_begin(msg: Message, context: Context) -> tuple:
    """The local phase up to its training: the node's state and, when it retrains, the plan
    (:func:`fedclust.fedcref.client.plan_local`)."""
    _, s, x, y, st, conf, key = _setup(msg, context)
    plan = None
    if bool(conf.get("active", True)) or not ae.n_models(st.models):
        plan = core.plan_local(st, x, s, _client_seed(conf, key))
    return s, x, y, st, conf, key, plan, s.torch_device()


def _local_end(msg: Message, context: Context, begun: tuple, trained: list) -> Message:
    """The local phase after its training (``trained``: the plan's models): state, owner
    results, reply."""
    s, x, y, st, conf, key, plan, device = begun
    models, clusters = None, None
    seconds = 0.0
    seed = _client_seed(conf, key)
    if plan is not None:
        info = core.finish_local(st, x, plan, trained, device)
        seconds = info["seconds"]
        models = ae.to_numpy(st.models) if ae.n_models(st.models) else None
        clusters = st.model_clusters
    elif core.drop_emptied(st, s):   # inactive: the clusters left that still have a model
        clusters = st.model_clusters
    base, ids, init_ok = _local_bases(conf, s, seed, len(models["W0"]) if models else 0,
                                      x.shape[1])
    _save_state(context, st)
    _save_held(context, [], None)       # a new iteration: no community copy is a base
    # a new iteration: every modelled cluster is isolated until a community round names it
    own = _owner_state(context, st.k)
    own["community"] = np.full(st.k, NO_MODEL, dtype=np.int64)
    own["community"][st.model_clusters] = ISOLATED
    own["meta"][0] = int(conf.get("iteration", 0))
    _save_owner(context, own)
    _keep_owner_results(msg, context, s, st, own, len(x), refined=False)
    metrics = {"seconds": seconds, "k": st.k, "version": st.version, "n": len(x), "key": key}
    if init_ok is not None:
        metrics["init-ok"] = int(init_ok)
    return Message(fw.local_reply(models, clusters, _eval(st, y, s), s.wire, metrics, base, ids),
                   reply_to=msg)


@app.query("fedcref_assoc")
def fedcref_assoc(msg: Message, context: Context) -> Message:
    """Algorithm 1 lines 10–15 on the client: evaluate the received models (errors cached per
    model version) and report which foreign clusters each local cluster accepts."""
    _, s, x, _, st, conf, _ = _setup(msg, context, with_cache=True)
    keys = [str(k) for k in conf.get("keys", [])]
    # a model whose base this node cannot build is left out: it is reported missing and sent
    # again without one
    got, _ = (fw.keyed_models(msg.content.array_records["models"], _resolver(s))
              if "models" in msg.content.array_records else ({}, []))
    new = {k: ae.from_numpy(v) for k, v in got.items()}
    acc, missing, seconds = core.associate(st, x, keys, new, s, s.torch_device())
    _save_state(context, st, with_cache=True)
    if missing:
        return Message(fw.missing_reply([keys.index(k) for k in missing], seconds), reply_to=msg)
    return Message(fw.accept_reply(acc, seconds), reply_to=msg)


@app.train("fedcref_comm")
def fedcref_comm(msg: Message, context: Context) -> Message:
    """Algorithm 1 line 22: one FedAvg round of every community this client is in, together."""
    begun = _comm_begin(msg, context)
    return _comm_end(msg, context, begun, begun[-2].run(begun[-1]))


def _comm_begin(msg: Message, context: Context) -> tuple:
    """A community round up to its training: the training call
    (:func:`fedclust.fedcref.client.community_call`) of the node's communities."""
    _, s, x, _, st, conf, key = _setup(msg, context)
    t0 = time.perf_counter()
    got = _received(msg, s, _load_held(context))
    ids, members = fw.read_members(conf)
    _save_held(context, ids, got)
    params = ae.from_numpy(got) if got is not None else []
    call, counts = core.community_call(x, st.labels, params, members, s,
                                       _client_seed(conf, key))
    return s, x, st, ids, members, counts, t0, got, call, s.torch_device()


def _comm_end(msg: Message, context: Context, begun: tuple, out: Any) -> Message:
    """A community round after its training (``out``: the trained models): owner results,
    reply."""
    s, x, st, ids, members, counts, t0, got, _, _ = begun
    own = _owner_state(context, st.k)
    before = own["community"].copy()
    for g, qs in zip(ids, members, strict=True):
        own["community"][qs] = g
    if not np.array_equal(before, own["community"]):   # the first round of an iteration
        _save_owner(context, own)
        _keep_owner_results(msg, context, s, st, own, len(x), refined=False)
    return Message(fw.comm_reply(ae.to_numpy(out), counts, s.wire, time.perf_counter() - t0,
                                 got, fw.held_ids(ids) if s.wire == wire.DELTA else None),
                   reply_to=msg)


@app.query("fedcref_member")
def fedcref_member(msg: Message, context: Context) -> Message:
    """The communities of this client's clusters whose model was kept, not trained, this
    iteration (``fedcref.reuse-communities``): for the data owner's ``result.json`` only."""
    _, s, x, _, st, conf, _ = _setup(msg, context)
    ids, members = fw.read_members(conf)
    own = _owner_state(context, st.k)
    for g, qs in zip(ids, members, strict=True):
        own["community"][qs] = g
    _save_owner(context, own)
    _keep_owner_results(msg, context, s, st, own, len(x), refined=False)
    return reply(msg, metrics={"seconds": 0.0})


@app.train("fedcref_refine")
def fedcref_refine(msg: Message, context: Context) -> Message:
    """Algorithm 1 lines 26–30: Algorithm 2 with own + community models, and the agreement
    with the previous labeling (stability test)."""
    _, s, x, y, st, conf, _ = _setup(msg, context)
    t0 = time.perf_counter()
    got = _received(msg, s, _load_held(context))
    comm = ae.from_numpy(got) if got is not None else []
    ids_given, parts = fw.read_members(conf)
    ids = np.asarray(ids_given if "communities" in conf else range(ae.n_models(comm)),
                     dtype=np.int64)
    members = [[int(q) for q in qs] for qs in parts] or [[] for _ in ids]
    from fedclust.fedcref.rules import Offer

    mode = s.refinement
    outcome = core.refine(st, x, Offer(comm, members, ids), mode, s.torch_device())
    _save_state(context, st)
    own = _owner_state(context, st.k)
    refined = bool(len(st.model_clusters)) or bool(ae.n_models(comm))   # else: no candidates
    if refined:
        own.update({"used_clusters": st.used_clusters, "used_kind": st.used_kind,
                    "used_ref": st.used_ref})
        own["meta"][1] = int(conf.get("iteration", 0)) or max(int(own["meta"][0]), 1)
        _save_owner(context, own)
    if st.used_mismatch:   # only on exact ties of two models' errors
        LOG.warning("fedcref: %d rows' labels differ from the argmin of the models that "
                    "define them (ties)", st.used_mismatch)
    _keep_owner_results(msg, context, s, st, own, len(x), refined=refined)
    return Message(fw.refine_reply(outcome.agreement, outcome.community_share,
                                   outcome.confirmed if mode.confirms else None,
                                   _eval(st, y, s), time.perf_counter() - t0), reply_to=msg)


# ---------------------------------------------------------------------------------------------
# batched forms: an in-process engine answers one phase of many nodes at once
# (client_apps.base.serve_batch): every node's training calls run as one stacked training
# (fedclust.fedcref.autoencoder.train_calls), each node's state and reply as above.

def _batch(items: list[tuple[Message, Context]], begin: Any, end: Any,
           calls: Any) -> list[Any]:
    from fedclust.fedcref import batched as fb

    answers: list[Any] = [None] * len(items)
    begun: dict[int, tuple] = {}
    for k, (msg, context) in enumerate(items):
        try:
            begun[k] = begin(msg, context)
        except Exception as exc:
            answers[k] = exc
    by_device: dict[str, list[int]] = {}
    for k, b in begun.items():
        by_device.setdefault(b[-1], []).append(k)
    for device, ks in by_device.items():
        todo = [calls(begun[k]) for k in ks]
        trained = ae.train_calls([c for cs in todo for c in cs], device,
                                 merge=fb.merged(device))
        for k, cs in zip(ks, todo, strict=True):
            mine, trained = trained[:len(cs)], trained[len(cs):]
            msg, context = items[k]
            try:
                answers[k] = end(msg, context, begun[k], mine)
            except Exception as exc:
                answers[k] = exc
    return answers


@batched("train.fedcref_local")
def fedcref_local_batch(items: list[tuple[Message, Context]]) -> list[Any]:
    return _batch(items, _local_begin, _local_end,
                  lambda b: b[-2].calls if b[-2] is not None else [])


@batched("train.fedcref_comm")
def fedcref_comm_batch(items: list[tuple[Message, Context]]) -> list[Any]:
    return _batch(items, _comm_begin, lambda m, c, b, out: _comm_end(m, c, b, out[0]),
                  lambda b: [b[-2]])
