"""Client-side steps of FedCRef, Flower-free (the ClientApp handlers are thin wrappers).

A client holds its samples ``x`` (n, d) in [0, 1], its current labels (0..K_i−1), its cluster
autoencoders, and a cache of per-sample reconstruction errors of every received model version
(so that an unchanged model is neither re-sent nor re-evaluated).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.fedcref import autoencoder as ae
from fedclust.fedcref.association import accept_matrix
from fedclust.fedcref.keys import ClientSettings, SystemSettings
from fedclust.fedcref.refine import cluster_refine, label_agreement
from fedclust.fedcref.rules import Offer, PaperRefine, Refinement, RefineView, refinement_of
from fedclust.fedcref.system import ClientSlice, generate_system


def client_key(x: NDArray) -> int:
    """A client's identity: a 63-bit digest of its samples.

    Every client-side random stream is seeded from (server phase seed, this key), and the
    server orders clients by it, so that results do not depend on node ids or on which process
    serves a message (deployment vs simulation vs in-process). The digest reveals nothing
    about the samples beyond equality of whole datasets.
    """
    import hashlib

    digest = hashlib.sha256(np.ascontiguousarray(x, dtype=np.float32).tobytes()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integers (master seed, client, iteration, phase ...)."""
    return int(np.random.SeedSequence([int(p) & 0xFFFF_FFFF for p in parts]).generate_state(
        2, dtype=np.uint32).view(np.uint64)[0] >> 1)


@functools.lru_cache(maxsize=2)
def _labels_and_system(s: SystemSettings) -> tuple[list[ClientSlice], int]:
    _, y = _dataset(s.dataset, s.data_dir, s.split, s.k49_min_count)
    system = generate_system(y, s.num_clients, s.samples, (s.k_min, s.k_max), s.overlap,
                             s.seed)
    return system, int(np.unique(y).size)


@functools.lru_cache(maxsize=2)
def _dataset(name: str, data_dir: str, split: str, k49_min: int) -> tuple[NDArray, NDArray]:
    from fedclust.data.images import keep_frequent_classes, load_image_dataset

    x, y = load_image_dataset(name, data_dir, split)
    if name == "k49":
        _, y_train = load_image_dataset(name, data_dir, "train")
        # the paper keeps the classes with ≥ k49_min *training* samples, whatever the split
        x, y, _ = keep_frequent_classes(x, y, k49_min, reference_y=y_train)
    return x, y


def _system_settings(cfg: Mapping[str, Any] | SystemSettings) -> SystemSettings:
    return cfg if isinstance(cfg, SystemSettings) else SystemSettings.from_config(cfg)


def build_system(cfg: Mapping[str, Any] | SystemSettings) -> tuple[list[ClientSlice], int]:
    """The whole system (indices and true classes only), regenerated from a validated run
    config or its :class:`~fedclust.fedcref.keys.SystemSettings`; and the dataset's number
    of classes."""
    return _labels_and_system(_system_settings(cfg))


@functools.lru_cache(maxsize=4)
def _client_data(s: SystemSettings, client: int) -> tuple[NDArray, NDArray]:
    from fedclust.data.images import flatten_unit

    system, _ = build_system(s)
    x, _ = _dataset(s.dataset, s.data_dir, s.split, s.k49_min_count)
    sl = system[client]
    return flatten_unit(x[sl.indices]), sl.y.copy()


def client_data(cfg: Mapping[str, Any] | SystemSettings, client: int
                ) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Samples (flattened, [0, 1]) and true classes of simulated client ``client`` (cached),
    from a validated run config or its :class:`~fedclust.fedcref.keys.SystemSettings`."""
    return _client_data(_system_settings(cfg), int(client))


# ----------------------------------------------------------------------------------------------

@dataclass
class ClientState:
    """Everything a client keeps between messages (stored in Flower's ``context.state``)."""

    labels: NDArray[np.int64]
    k: int
    models: ae.Params = field(default_factory=list)   # own cluster models, stacked
    model_clusters: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    version: int = 0
    own_errors: NDArray[np.float32] | None = None      # (K, n), NaN rows for clusters w/o model
    # samples left out of the own models' training (assoc-rule=ratio; None: none held out)
    held_out: NDArray[np.bool_] | None = None
    cache: dict[str, NDArray[np.float32]] = field(default_factory=dict)
    # What the last refinement used (Algorithm 2's selected models, in candidate order: own
    # models first, then community models): the local cluster each one defines, its source
    # (USED_OWN: own model of cluster ``used_ref``; USED_COMMUNITY: community ``used_ref``)
    # and the models themselves (not kept between messages; written for the data owner).
    used_clusters: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    used_kind: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    used_ref: NDArray[np.int64] = field(default_factory=lambda: np.zeros(0, np.int64))
    used_models: ae.Params = field(default_factory=list)
    used_mismatch: int = 0     # rows whose label differs from the argmin over the used models
    # the gate of refine modes "gated"/"covered": the own models, and per own-best model which
    # used models a row may go to (empty: every used model, the paper's step)
    gate_models: ae.Params = field(default_factory=list)
    gate_allow: NDArray[np.bool_] = field(default_factory=lambda: np.zeros((0, 0), bool))


USED_OWN, USED_COMMUNITY = 0, 1


def own_error_matrix(state: ClientState, x: NDArray, device: str = "cpu"
                     ) -> NDArray[np.float32]:
    """(K, n) errors of the client's own cluster models (NaN for clusters without a model)."""
    out = np.full((state.k, len(x)), np.nan, dtype=np.float32)
    if ae.n_models(state.models):
        out[state.model_clusters] = ae.errors(state.models, x, device=device)
    return out


@dataclass
class LocalPlan:
    """What :func:`train_local` trains: the clusters that get a model and the training calls
    (fresh models, and warm-started ones), ``rows[c]`` the clusters of call ``c``."""

    clusters: NDArray[np.int64]
    sizes: NDArray[np.int64]
    calls: list[ae.TrainCall]
    rows: list[list[int]]
    t0: float
    init: ae.Params        # the fresh models (the client's models when no cluster has one)


def plan_local(state: ClientState, x: NDArray, s: ClientSettings, seed: int) -> LocalPlan:
    """The first half of :func:`train_local`: the models to train (sets the hold-out)."""
    t0 = time.perf_counter()
    sizes = np.bincount(state.labels, minlength=state.k)
    clusters = np.flatnonzero(sizes >= s.min_cluster_size)
    layer = ae.layer_sizes(x.shape[1], s.hidden)
    params = ae.init_params(len(clusters), layer, seed, s.ae_init)
    train_on = np.ones(len(x), dtype=bool)
    state.held_out = None
    # the baselines (association none / perfect) hold out the same samples, so that they
    # differ from the run only in the cluster graph
    if s.association_rule.held_out:
        state.held_out = hold_out(state.labels, s.holdout, derive_seed(seed, 3))
        train_on = ~state.held_out
    previous = {int(q): r for r, q in enumerate(state.model_clusters)}
    warm = [previous.get(int(q)) if s.warm_start and state.held_out is None
            else None for q in clusters]
    plan = LocalPlan(clusters.astype(np.int64), sizes, [], [], t0, params)
    if len(clusters):
        data = [x[(state.labels == q) & train_on] for q in clusters]
        fresh = [j for j, r in enumerate(warm) if r is None]
        again = [j for j, r in enumerate(warm) if r is not None]
        for rows, start, epochs in (
                (fresh, ae.select(params, fresh), s.ae_epochs),
                (again, ae.select(state.models, [warm[j] for j in again]), s.warm_epochs)):
            if rows:
                plan.calls.append(ae.TrainCall(start, [data[j] for j in rows], epochs,
                                               s.batch_size, s.lr, s.ae_patience, seed))
                plan.rows.append(rows)
    return plan


def finish_local(state: ClientState, x: NDArray, plan: LocalPlan, trained: list[ae.Params],
                 device: str = "cpu") -> dict:
    """The second half of :func:`train_local`: the trained models (one per call of the
    plan) become the client's cluster models."""
    params = plan.init
    if len(plan.clusters):
        parts: dict[int, ae.Params] = {}
        for rows, models in zip(plan.rows, trained, strict=True):
            parts.update({j: ae.select(models, [i]) for i, j in enumerate(rows)})
        params = ae.concat([parts[j] for j in range(len(plan.clusters))])
    state.models, state.model_clusters = params, plan.clusters
    state.version += 1
    state.own_errors = own_error_matrix(state, x, device)
    return {"seconds": time.perf_counter() - plan.t0, "sizes": plan.sizes}


def train_local(state: ClientState, x: NDArray, s: ClientSettings, seed: int,
                device: str = "cpu") -> dict:
    """Algorithm 1 lines 6–8: one fresh autoencoder per local cluster, trained together.

    With ``fedcref.warm-start`` (and a rule that holds out no samples: a warm model has seen
    the samples a new hold-out would take), a cluster that had a model starts from it and
    trains ``warm-epochs`` epochs; the others start fresh as in the paper.
    """
    plan = plan_local(state, x, s, seed)
    return finish_local(state, x, plan, [c.run(device) for c in plan.calls], device)


def hold_out(labels: NDArray[np.int64], share: float, seed: int) -> NDArray[np.bool_]:
    """A random ``share`` of each cluster's samples (at least one of a cluster of two or
    more, never all), held out from the own model's training for the ratio test."""
    rng = np.random.default_rng(seed)
    out = np.zeros(len(labels), dtype=bool)
    for q in np.unique(labels):
        idx = np.flatnonzero(labels == q)
        if len(idx) >= 2:
            m = min(max(int(round(share * len(idx))), 1), len(idx) - 1)
            out[rng.choice(idx, m, replace=False)] = True
    return out


def drop_emptied(state: ClientState, s: ClientSettings) -> bool:
    """An inactive client's clusters that its last refinement left with fewer than
    ``min-cluster-size`` samples lose their model (an active client's retraining already
    skips them). Without this, the stale model stays a graph node that accepts nothing and
    is counted isolated for the rest of the run. Returns whether a model was dropped."""
    if not len(state.model_clusters):
        return False
    sizes = np.bincount(state.labels, minlength=state.k)
    keep = sizes[state.model_clusters] >= s.min_cluster_size
    if keep.all():
        return False
    if state.own_errors is not None:
        state.own_errors[state.model_clusters[~keep]] = np.nan
    state.models = ae.select(state.models, np.flatnonzero(keep)) if keep.any() else []
    state.model_clusters = state.model_clusters[keep]
    return True


def associate(state: ClientState, x: NDArray, keys: list[str], new_models: dict[str, ae.Params],
              s: ClientSettings, device: str = "cpu"
              ) -> tuple[NDArray[np.bool_], list[str], float]:
    """Algorithm 1 lines 10–15, client side.

    Evaluates every newly received model once on all local samples (cached by key), drops
    cached entries no longer current, and tests eq. (2) for each local cluster against each
    current foreign model ``keys``. Returns the (K, F) accept matrix, the keys it lacks (cache
    lost: the server must send them) and the compute seconds.
    """
    t0 = time.perf_counter()
    if new_models:
        names = list(new_models)
        errs = ae.errors([new_models[k] for k in names], x, device=device)
        for i, k in enumerate(names):
            state.cache[k] = errs[i]
    current = set(keys)
    for k in list(state.cache):
        if k not in current:
            del state.cache[k]
    missing = [k for k in keys if k not in state.cache]
    if missing:
        return np.zeros((state.k, 0), dtype=bool), missing, time.perf_counter() - t0
    if state.own_errors is None:
        state.own_errors = own_error_matrix(state, x, device)
    foreign = (np.stack([state.cache[k] for k in keys]) if keys
               else np.zeros((0, len(x)), dtype=np.float32))
    groups = (np.array([int(str(k).split(":")[0]) for k in keys], dtype=np.int64)
              if s.assoc_best_per_client else None)
    rule = s.association_rule
    held_out = state.held_out
    if rule.held_out and held_out is None:  # models trained on every sample: none held out
        held_out = np.zeros(len(x), dtype=bool)
    acc = accept_matrix(state.labels, state.own_errors, foreign, rule, held_out, groups)
    return acc, [], time.perf_counter() - t0


def community_call(x: NDArray, labels: NDArray, params: ae.Params,
                   members: list[NDArray[np.int64]], s: ClientSettings, seed: int
                   ) -> tuple[ae.TrainCall, NDArray[np.int64]]:
    """Line 22 on a client, one FedAvg round for all the communities it takes part in (one
    message): the training call and the sample counts (FedAvg weights).

    ``members[g]`` lists the local clusters in community g (usually one); the community model
    is trained on their union.
    """
    data = [x[np.isin(labels, m)] for m in members]
    return (ae.TrainCall(params, data, s.fl_local_epochs, s.batch_size, s.lr, 0, seed),
            np.array([len(d) for d in data], dtype=np.int64))


def refine(state: ClientState, x: NDArray, offer: Offer | ae.Params,
           mode: Refinement | str = PaperRefine(), device: str = "cpu") -> RefineOutcome:
    """Algorithm 2 with the client's own models and the community models of ``offer``;
    returns ACC between the previous and the new labeling (eq. 4, the stability test) and
    what the client found.

    ``offer`` (:func:`refine_inputs`): the community models, the client's clusters in each
    (empty for a community it is not in) and their numbers in the run, for the record of the
    models used; bare stacked models mean communities ``0..G−1`` the client is in none of.
    ``mode`` (``fedcref.refine``, :mod:`fedclust.fedcref.rules`: :class:`PaperRefine`,
    :class:`GatedRefine`, :class:`CoveredRefine`) chooses which models a sample may go to,
    by the cluster ``q*(x)`` whose *own* model reconstructs x best. Samples are then
    assigned by Algorithm 2's greedy picks among the models each sample may go to
    (:func:`fedclust.fedcref.refine.cluster_refine` on errors masked to +inf).

    Also records the selected models (``state.used_*``) and the gate that masks them (the
    own models and, per own-best cluster, which selected models are allowed): every new label
    is the argmin over the allowed selected models (the greedy picks take exactly the samples
    whose best remaining allowed model is the pick), so applying them to the client's rows
    (:func:`fedclust.fedcref.predict.assign`) gives its labels back.
    """
    mode = refinement_of(mode)
    if not isinstance(offer, Offer):
        n = ae.n_models(offer)
        offer = Offer(offer, [[] for _ in range(n)], np.arange(n, dtype=np.int64))
    community_models = offer.models
    own = (state.own_errors if state.own_errors is not None
           else own_error_matrix(state, x, device))
    n_own = len(state.model_clusters)
    rows = [own[state.model_clusters]] if n_own else []
    n_com = ae.n_models(community_models)
    com = (ae.errors(community_models, x, device=device) if n_com
           else np.zeros((0, len(x)), np.float32))
    if n_com:
        rows.append(com)
    outcome = RefineOutcome(agreement=1.0, confirmed=np.zeros(n_com, dtype=bool))
    if not rows:
        return outcome
    errors = np.concatenate(rows)
    allow_by_own = np.ones((n_own, len(errors)), dtype=bool)   # gate: own-best row -> rows
    if n_own:
        allow_by_own, outcome.confirmed = mode.allow(RefineView(
            state.model_clusters, own, com, state.labels, state.held_out, offer.members))
    gate = np.argmin(own[state.model_clusters], axis=0) if n_own else None
    masked = errors if gate is None else np.where(allow_by_own[gate].T, errors, np.inf)
    raw, sel = cluster_refine(masked, state.k)
    mapping = label_mapping(state.labels, raw, state.k)
    labels = mapping[raw]
    outcome.agreement = label_agreement(state.labels, labels)
    outcome.community_share = float(np.mean(sel[raw] >= n_own)) if sel.size else 0.0
    state.labels = labels
    cand = _record_used(state, offer, sel, mapping)
    if not mode.gates or not n_own:
        state.gate_models, state.gate_allow = [], np.zeros((0, len(cand)), dtype=bool)
    else:
        state.gate_models = state.models
        state.gate_allow = allow_by_own[:, cand]
    check = _gated_argmin(errors[cand], state.gate_allow, gate)
    state.used_mismatch = int(np.sum(state.used_clusters[check] != labels))
    return outcome


def _record_used(state: ClientState, offer: Offer, sel: NDArray[np.int64],
                 mapping: NDArray[np.int64]) -> NDArray[np.int64]:
    """Records the selected models in candidate order (ties in the greedy picks go to the
    lower index): which cluster each labels, whether it is own or a community's, and its
    number. Returns their candidate rows in that order."""
    n_own, n_com = len(state.model_clusters), ae.n_models(offer.models)
    order = np.argsort(sel, kind="stable")
    cand = sel[order]
    state.used_clusters = mapping[order].astype(np.int64)
    state.used_kind = np.where(cand < n_own, USED_OWN, USED_COMMUNITY).astype(np.int64)
    ids = np.asarray(offer.ids, dtype=np.int64)
    state.used_ref = np.where(cand < n_own, state.model_clusters[np.minimum(cand, n_own - 1)]
                              if n_own else 0,
                              ids[np.clip(cand - n_own, 0, max(n_com - 1, 0))]
                              if n_com else 0).astype(np.int64)
    candidates = ae.concat([p for p in (state.models, offer.models) if ae.n_models(p)])
    state.used_models = ae.select(candidates, cand)
    return cand


def refine_inputs(params: ae.Params, members: list[tuple[int, list[int]]], mode: Refinement
                  ) -> Offer:
    """What a client's refinement takes from the run's community models: every model when
    ``mode.offers_all`` (any may win a sample), else only the client's own communities (no
    other may); with the client's clusters in each model and the models' community numbers."""
    mine = {int(g): [int(q) for q in qs] for g, qs in members}
    ids = (np.arange(ae.n_models(params), dtype=np.int64) if mode.offers_all
           else np.array(sorted(mine), dtype=np.int64))
    models = ae.select(params, ids) if len(ids) and ae.n_models(params) else []
    return Offer(models, [mine.get(int(g), []) for g in ids], ids)


def _gated_argmin(errors: NDArray, allow: NDArray[np.bool_], gate: NDArray | None
                  ) -> NDArray[np.int64]:
    """Per sample, the best of the models (rows of ``errors``) that its own-best model's row
    of ``allow`` permits (every model when ``allow`` is empty)."""
    if not len(allow) or gate is None:
        return np.argmin(errors, axis=0)
    return np.argmin(np.where(allow[gate].T, errors, np.inf), axis=0)


@dataclass
class RefineOutcome:
    """What one refinement found on a client (only aggregates leave it)."""

    agreement: float                       # ACC(previous, new labels), eq. (4)
    confirmed: NDArray[np.bool_]           # per community model: confirmed (mode covered)
    community_share: float = 0.0           # share of samples labelled by a community model


def label_mapping(old: NDArray, new: NDArray, k: int) -> NDArray[np.int64]:
    """``mapping[new id] = old id`` of :func:`align_labels` (Hungarian on the overlaps)."""
    from scipy.optimize import linear_sum_assignment

    table = np.zeros((k, k), dtype=np.int64)
    np.add.at(table, (new, old), 1)
    rows, cols = linear_sum_assignment(-table)
    mapping = np.empty(k, dtype=np.int64)
    mapping[rows] = cols
    return mapping


def align_labels(old: NDArray, new: NDArray, k: int) -> NDArray[np.int64]:
    """Rename the new clusters to the old ids they overlap most (Hungarian), so that a client
    that stops retraining keeps model q matched with cluster q. Labels stay in 0..k−1."""
    return label_mapping(old, new, k)[new]


def class_histograms(labels: NDArray, y: NDArray, k: int, n_classes: int) -> NDArray[np.int64]:
    """(K, C) true-class counts per cluster (evaluation path only)."""
    table = np.zeros((k, n_classes), dtype=np.int64)
    np.add.at(table, (labels, y), 1)
    return table
