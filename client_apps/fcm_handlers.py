"""ClientApp handlers of exact federated FCM (paper 004) and FedFCM/FedFuzzDB (paper 003).

Every reply carries statistics only: per-feature min/max (and, for standard scaling, count,
mean, centred sum of squares) with the node's row count (not under SecAgg+), FCM local sums,
local centers, DB sums. The messages, both ends, are :mod:`strategies.wire.fcm` and
:mod:`strategies.wire.fedfcm`; what the server accepts in each reply is checked there.
Evaluation statistics (label × cluster contingency tables, with the node's label codes naming
their rows) are sent only when run config ``evaluate`` is true and the node allows it
(:func:`client_apps.evaluation.allows_evaluation`).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import numpy as np
from flwr.app import Context, Message

from client_apps.base import Answer, app, batched
from client_apps.common import run_config, run_settings
from client_apps.data import ClientData, load_client_data
from fedclust import fcm
from fedclust.data import scaling
from fedclust.data.capacity import Capacity, check_rows
from fedclust.data.local import compact_codes
from fedclust.fcm.client import eval_codes, eval_table
from fedclust.fcm.keys import FamilySettings, FCMSettings
from fedclust.fedfcm.client import index_stats, local_centers
from fedclust.fedfcm.keys import FedFCMSettings
from fedclust.metrics import contingency
from strategies.wire import fcm as wire
from strategies.wire import fedfcm as fedfcm_wire
from strategies.wire.fcm import SecureRequest


def settings(cfg: dict[str, Any]) -> FCMSettings | FedFCMSettings:
    """The typed settings of the run's method (``cfg``: the validated run config)."""
    if cfg["method"] == FedFCMSettings.method:
        return FedFCMSettings.from_config(cfg)
    return FCMSettings.from_config(cfg)


def _scaled_data(msg: Message, context: Context
                 ) -> tuple[ClientData, dict[str, Any], np.ndarray]:
    cfg = run_config(context)
    data = load_client_data(context, cfg)
    sc = wire.read_scaling(msg.content)
    x = _scaled(data.x, *sc) if sc is not None else data.x
    return data, cfg, x


# (id of the node's data, shift, scale) -> (the data, its scaled copy): every message after the
# scaling phase carries the same scaling, so a node scales its rows once per run, not per round
_SCALED: OrderedDict[tuple[int, bytes, bytes], tuple[weakref.ref, np.ndarray]] = OrderedDict()
_SCALED_BYTES = [0]


def _scaled(x: np.ndarray, shift: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``scaling.apply(x, shift, scale)`` (read-only), kept while ``x`` is the node's data
    array (read-only, cached by :mod:`client_apps.data`) and the scaling is the same."""
    key = (id(x), shift.tobytes(), scale.tobytes())
    hit = _SCALED.get(key)
    if hit is not None and hit[0]() is x:
        _SCALED.move_to_end(key)
        return hit[1]
    out = scaling.apply(x, shift, scale)
    if x.flags.writeable:          # not the cached data: another message may change it
        return out
    out.flags.writeable = False
    if hit is not None:
        _SCALED_BYTES[0] -= hit[1].nbytes
    _SCALED[key] = (weakref.ref(x), out)
    _SCALED_BYTES[0] += out.nbytes
    while _SCALED_BYTES[0] > SCALED_CACHE_BYTES and len(_SCALED) > 1:
        _SCALED_BYTES[0] -= _SCALED.popitem(last=False)[1][1].nbytes
    return out


SCALED_CACHE_BYTES = 256 * 1024 ** 2      # most bytes of scaled node data kept per process


def guard_withholds(s: FamilySettings, x: np.ndarray) -> bool:
    """Paper 004 §4.2's privacy guard, one rule for every reply of the FCM family: a node with
    ``N ≤ C(F+1)/F`` rows (C the most clusters the run fits: ``fcm.n-clusters``, or
    ``fedfcm.k-max``) sends no statistic of its rows in any phase — bounds, sums, local
    centers, index sums, objective, evaluation table. It still receives the final centers and
    keeps its own results."""
    return s.withholds(*x.shape)


def refuse_too_few_rows(cfg: dict[str, Any], s: FamilySettings, x: np.ndarray) -> None:
    """Before any work: a run whose only node (``num-clients = 1``) holds fewer rows than the
    clusters it fits is degenerate (a center on every row, objective 0), so the node refuses
    it with a ConfigError (data-free: the key, the row count, the fix). With the privacy guard
    on, such a node withholds everything instead (its row count is not sent); with several
    nodes only the server knows the pooled row count."""
    if int(cfg["num-clients"]) == 1 and not s.privacy_guard:
        check_rows(Capacity(s.method, s.clusters_key, s.clusters), int(x.shape[0]),
                   "this run's only node")


@app.query("fcm_stats")
def fcm_stats(msg: Message, context: Context) -> Message:
    """Per-feature statistics for federated scaling and the server's initial-center box."""
    cfg = run_config(context)
    s = run_settings(context, settings)
    data = load_client_data(context, cfg)
    refuse_too_few_rows(cfg, s, data.x)
    if guard_withholds(s, data.x):
        return Message(wire.withheld_reply(), reply_to=msg)
    secure = s.hides_rows
    # the label codes this node holds: the server's union sets the rows of the securely
    # summed contingency table (evaluation path only)
    codes = (eval_codes(data.y_eval)[0] if secure and s.evaluate and data.y_eval is not None
             else None)
    # the row count lets the server check every later statistic of this node against it
    # (sums of memberships add up to N); under SecAgg+ N stays hidden (standard scaling
    # reveals it in the statistics anyway); minmax and none reveal only the bounds
    return Message(wire.stats_reply(scaling.column_stats(data.x), s.scaling == "standard",
                                    None if secure else int(data.x.shape[0]), codes,
                                    data.columns),
                   reply_to=msg)


@app.query("fcm_sums")
def fcm_sums(msg: Message, context: Context) -> Message:
    """Paper 004 Algorithm 2: ``U_c = Σ u^m``, ``WS_c = Σ u^m x`` for the received centers."""
    _, cfg, x = _scaled_data(msg, context)
    s = run_settings(context, FCMSettings.from_config)
    centers = wire.read_centers(msg.content)
    if guard_withholds(s, x):
        return Message(wire.withheld_reply(), reply_to=msg)
    return Message(wire.sums_reply(*fcm.local_sums(x, centers, s.m)), reply_to=msg)


def _centers_once(read: dict[int, tuple[np.ndarray, Any]], msg: Message
                  ) -> tuple[np.ndarray, Any]:
    """The centers and scaling of ``msg``, read once per message content of a batch (every
    node of a phase is sent the same one)."""
    got = read.get(id(msg.content))
    if got is None:
        got = read[id(msg.content)] = (wire.read_centers(msg.content),
                                       wire.read_scaling(msg.content))
    return got


@batched("query.fcm_sums")
def fcm_sums_batch(items: list[tuple[Message, Context]]) -> list[Answer]:
    """:func:`fcm_sums` of a round's simulated nodes together (an in-process engine): each
    node's sums from one pass over their stacked rows (:func:`fedclust.fcm.local_sums_many`),
    each node still its own reply. The stacked rows are kept while the nodes' scaled data are
    the same (every round of a run)."""
    answers: list[Answer | None] = [None] * len(items)
    read: dict[int, tuple[np.ndarray, Any]] = {}     # per message content: centers, scaling
    groups: dict[tuple[int, float], list[tuple[int, np.ndarray]]] = {}
    for k, (msg, context) in enumerate(items):
        try:
            got = _centers_once(read, msg)
            cfg = run_config(context)
            s = run_settings(context, FCMSettings.from_config)
            x = load_client_data(context, cfg).x
            x = _scaled(x, *got[1]) if got[1] is not None else x
            if guard_withholds(s, x):
                answers[k] = Message(wire.withheld_reply(), reply_to=msg)
            else:
                groups.setdefault((id(msg.content), s.m), []).append((k, x))
        except Exception as exc:
            answers[k] = exc
    for (content, m), jobs in groups.items():
        centers = read[content][0]
        try:
            u, ws = _sums_many([x for _, x in jobs], centers, m)
        except Exception as exc:
            for k, _ in jobs:
                answers[k] = exc
            continue
        for j, (k, _) in enumerate(jobs):
            answers[k] = Message(wire.sums_reply(u[j], ws[j]), reply_to=items[k][0])
    return answers  # type: ignore[return-value]


# (the nodes' scaled arrays, kept so that their ids stay theirs, and their stacked rows)
_POOLED: list[tuple[tuple[np.ndarray, ...], fcm.Pooled]] = []


def _sums_many(xs: list[np.ndarray], centers: np.ndarray, m: float
               ) -> tuple[np.ndarray, np.ndarray]:
    """Every node's local sums; its rows stacked once while the same arrays come back."""
    if sum(x.nbytes for x in xs) > SCALED_CACHE_BYTES or any(len(x) == 0 for x in xs):
        sums = [fcm.local_sums(x, centers, m) for x in xs]
        return np.stack([u for u, _ in sums]), np.stack([ws for _, ws in sums])
    hit = _POOLED[0] if _POOLED else None
    if hit is None or len(hit[0]) != len(xs) or any(a is not b for a, b in zip(hit[0], xs,
                                                                               strict=True)):
        _POOLED[:] = [(tuple(xs), fcm.Pooled.of(xs))]
    return fcm.local_sums_many(_POOLED[0][1], centers, m)


def keep_owner_results(msg: Message, context: Context, s: FamilySettings, x: np.ndarray,
                       centers: np.ndarray, shift: np.ndarray, scale: np.ndarray,
                       run_dir: str | None = None, u: np.ndarray | None = None) -> None:
    """Write this node's FCM results for its owner (never sent): ``assignments.csv``
    (``row,cluster,u0,…``), ``centers.csv`` in the original feature units, the arrays
    ``fedclust predict`` needs, and ``result.json`` last (``u``: the memberships of ``x`` at
    ``centers``, when already computed)."""
    from client_apps import results

    folder = results.owner_dir(msg, context, run_dir)
    if folder is None:
        return
    if u is None:
        u = fcm.memberships(x, centers, s.m)
    labels = np.argmax(u, axis=1)
    results.write_assignments(folder, labels, u)
    names = _feature_names(context)
    # the same for every node of a simulated batch (same centers, scaling and settings)
    alike = results.alike_bytes(
        (centers, shift, scale, s.method, s.m_key, s.m, tuple(names or ())),
        lambda: _center_files(s, centers, shift, scale, names))
    for name, data in alike:
        results.write_bytes(folder / name, data)
    results.write_result(folder, {
        "method": s.method, "run_id": context.run_id, "rows": int(x.shape[0]),
        "n_clusters": int(centers.shape[0]), "m": s.m,
        "rows_per_cluster": np.bincount(labels, minlength=centers.shape[0]),
        "files": ["assignments.csv", "centers.csv"]})


def _center_files(s: FamilySettings, centers: np.ndarray, shift: np.ndarray, scale: np.ndarray,
                  names: list[str] | None) -> list[tuple[str, bytes]]:
    """The owner files of the final centers: ``centers.csv`` in the original feature units,
    the arrays ``fedclust predict`` needs, and ``predict.json`` (names and bytes)."""
    from client_apps import results

    files = [("centers.csv", results.table_bytes([f"f{i}" for i in range(centers.shape[1])],
                                                 centers * scale + shift, "%.17g"))]
    files += [(f"{name}.npy", results.npy_bytes(arr)) for name, arr in (
        ("centers", centers), ("scaling_shift", shift), ("scaling_scale", scale))]
    files.append(("predict.json", results.predict_info_bytes(
        s.method, {s.m_key: s.m}, **({"feature_names": names} if names else {}))))
    return files


def _feature_names(context: Context) -> list[str] | None:
    """The feature column names of this node's data file (None: no file or no header): kept
    in its owner folder for ``fedclust predict`` to match new rows by name (never sent)."""
    node = context.node_config
    if "data-path" not in node:
        return None
    from fedclust.data.local import feature_names

    try:
        return feature_names(str(node["data-path"]), str(node.get("data-format", "")),
                             str(node.get("label-column", "")))
    except (OSError, ValueError):
        return None


@app.query("fcm_final")
def fcm_final(msg: Message, context: Context) -> Message:
    """Objective share J_m of this client and, on the evaluation path, its contingency table.

    The final centers arrive here: the node also keeps its owner's results
    (:func:`keep_owner_results`); nothing of them is in the reply.
    """
    data, cfg, x = _scaled_data(msg, context)
    return _final_answer(msg, context, data, run_settings(context, settings), x,
                         wire.read_centers(msg.content), wire.read_scaling(msg.content))


@batched("query.fcm_final")
def fcm_final_batch(items: list[tuple[Message, Context]]) -> list[Answer]:
    """:func:`fcm_final` of the run's simulated nodes together (an in-process engine): every
    node's memberships and objective share from one pass over their stacked rows
    (:func:`fedclust.fcm.memberships_many`), each node still its own owner folder and its own
    reply. The owner files that every simulated node holds alike (the centers, the scaling,
    ``predict.json``) are written once and linked into the other folders
    (:func:`client_apps.results.shared_files`)."""
    from client_apps import results

    answers: list[Answer | None] = [None] * len(items)
    read: dict[int, tuple[np.ndarray, Any]] = {}     # per message content: centers, scaling
    nodes: dict[int, tuple[ClientData, dict[str, Any], Any, np.ndarray]] = {}
    groups: dict[tuple[int, float], list[tuple[int, np.ndarray]]] = {}
    for k, (msg, context) in enumerate(items):
        try:
            got = _centers_once(read, msg)
            cfg = run_config(context)
            s = run_settings(context, settings)
            data = load_client_data(context, cfg)
            x = _scaled(data.x, *got[1]) if got[1] is not None else data.x
            nodes[k] = (data, cfg, s, x)
            if len(x):
                groups.setdefault((id(msg.content), s.m), []).append((k, x))
        except Exception as exc:
            answers[k] = exc
    pooled: dict[int, tuple[np.ndarray, float]] = {}      # node -> its memberships, objective
    for (content, m), jobs in groups.items():
        try:
            u, j = _memberships_many([x for _, x in jobs], read[content][0], m)
        except Exception:           # each node meets its own error below
            continue
        stops = np.cumsum([len(x) for _, x in jobs])
        for i, (k, x) in enumerate(jobs):
            pooled[k] = (u[stops[i] - len(x):stops[i]], float(j[i]))
    with results.shared_files():
        for k, (data, _, s, x) in nodes.items():
            msg, context = items[k]
            try:
                answers[k] = _final_answer(msg, context, data, s, x, *read[id(msg.content)],
                                           *pooled.get(k, (None, None)))
            except Exception as exc:
                answers[k] = exc
    return answers  # type: ignore[return-value]


def _memberships_many(xs: list[np.ndarray], centers: np.ndarray, m: float
                      ) -> tuple[np.ndarray, np.ndarray]:
    """Every node's memberships (stacked) and objective share; the stacked rows of the sums
    phase when the same arrays come back."""
    hit = _POOLED[0] if _POOLED else None
    if hit is not None and len(hit[0]) == len(xs) and all(
            a is b for a, b in zip(hit[0], xs, strict=True)):
        return fcm.memberships_many(hit[1], centers, m)
    return fcm.memberships_many(fcm.Pooled.of(xs), centers, m)


def _final_answer(msg: Message, context: Context, data: ClientData, s: FCMSettings |
                  FedFCMSettings, x: np.ndarray, centers: np.ndarray, sc: Any,
                  u: np.ndarray | None = None, objective: float | None = None) -> Message:
    """:func:`fcm_final`'s work and reply for one node (``u``, ``objective``: its memberships
    and objective share, when already computed)."""
    shift, scale = sc if sc is not None else (np.zeros(x.shape[1]), np.ones(x.shape[1]))
    keep_owner_results(msg, context, s, x, centers, shift, scale, u=u)
    if guard_withholds(s, x):
        return Message(wire.withheld_reply(), reply_to=msg)
    if objective is None:
        objective = fcm.objective(x, centers, s.m)
    # FedFCM's evaluation tables of every K already came with the FedFuzzDB statistics.
    if s.evaluate and data.y_eval is not None and isinstance(s, FCMSettings):
        return Message(wire.final_reply(objective, eval_table(data.y_eval, x, centers),
                                        eval_codes(data.y_eval)[0]), reply_to=msg)
    return Message(wire.final_reply(objective), reply_to=msg)


def secure_final_vector(data: ClientData, x: np.ndarray, centers: np.ndarray, m: float,
                        req: SecureRequest) -> np.ndarray:
    """What :func:`fcm_final` reports, limb-packed for one SecAgg+ sum (never sent in plain).

    ``[J]`` then this client's label × cluster table with one row per code of the server's
    ``req.eval_codes`` (the union of the codes the nodes reported in the scaling phase; none:
    no evaluation; a client without labels sends zeros), then (when the server asks for it) its
    row count, so that the server can check the totals.
    """
    from fedclust.fcm.secagg import pack_final

    vocab = req.eval_codes
    c = centers.shape[0]
    table = np.zeros((len(vocab), c))
    if len(vocab) and data.y_eval is not None and data.y_eval.size:
        table = contingency(compact_codes(data.y_eval, vocab),
                            fcm.labels_from_centers(x, centers), len(vocab), c)
    return pack_final(fcm.objective(x, centers, m), table, req.divisor, req.divisor_aux,
                      req.limbs, n=x.shape[0] if req.with_rows else None)


@app.train("fedfcm_local")
def fedfcm_local(msg: Message, context: Context) -> Message:
    """Paper 003 step 3: local FCM to convergence from the global centers, for every active K.

    Returns the local centers; the supports ``Σ_j u_kj`` only for federated averaging (k-means
    averaging needs nothing else).
    """
    _, cfg, x = _scaled_data(msg, context)
    s = FedFCMSettings.from_config(cfg)
    if guard_withholds(s, x):
        return Message(wire.withheld_reply(), reply_to=msg)
    out, iters = local_centers(x, fedfcm_wire.read_centers(msg.content), s)
    return Message(fedfcm_wire.local_reply(out, iters), reply_to=msg)


@app.query("fedfcm_db")
def fedfcm_db(msg: Message, context: Context) -> Message:
    """FedFuzzDB sums (N_l, Σ‖x−c_i‖^q, Σu_i) per K; optionally local index and eval tables."""
    data, cfg, x = _scaled_data(msg, context)
    s = FedFCMSettings.from_config(cfg)
    if guard_withholds(s, x):
        return Message(wire.withheld_reply(), reply_to=msg)
    y = data.y_eval if s.evaluate else None
    stats, local, tables = index_stats(x, fedfcm_wire.read_centers(msg.content), s, y)
    codes = eval_codes(data.y_eval)[0] if tables else None
    return Message(fedfcm_wire.db_reply(stats, local, tables, codes), reply_to=msg)
