"""FedCRef's messages, both ends: the builders and readers of every request and reply, and
the server's checks of every reply (what a node declared, what its training can reach).

The server loop (:mod:`strategies.fedcref`) and the ClientApp handlers
(:mod:`client_apps.fedcref_handlers`) only call these; model weights travel in the number
format of :mod:`fedclust.fedcref.wire`. Importing this module does not import torch (the
ClientApp imports it at start).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict

from fedclust.fedcref import wire
from fedclust.fedcref.keys import ClientSettings
from strategies.wire.records import array_record
from strategies.wire.records import content as _content

#: ``resolve(ids, sizes)``: the bases that int8-delta descriptors ``ids`` name, for models of
#: layer sizes ``sizes`` (:func:`fedclust.fedcref.wire.resolve` with the receiver's copies)
Resolver = Callable[[np.ndarray, np.ndarray], dict[str, np.ndarray]]


def arrays(named: dict[str, np.ndarray]) -> ArrayRecord:
    """The ArrayRecord of named model arrays (:func:`strategies.wire.records.array_record`)."""
    return array_record(**named)


def decode(raw: Mapping[str, np.ndarray], resolve: Resolver | None = None
           ) -> dict[str, np.ndarray]:
    """Decoded models of an encoded record (any ``fedcref.wire`` format); the bases its
    int8-delta models name come from ``resolve`` (raises
    :class:`~fedclust.fedcref.wire.BaseMismatch` where they cannot be had, ValueError for a
    damaged record)."""
    problem = wire.problem(raw)
    if problem:
        raise ValueError(problem)
    ids = wire.base_ids(raw)
    base = None
    if ids is not None and np.any(ids[:, 0] != wire.NONE):
        if resolve is None:
            raise wire.BaseMismatch("the models name bases this receiver cannot build")
        base = resolve(ids, np.asarray(raw["sizes"]))
    return wire.decode(raw, base)


# -- requests: server -> node ------------------------------------------------------------------

def models_record(models: Mapping[str, np.ndarray], fmt: str,
                  base: Mapping[str, np.ndarray] | None = None,
                  ids: np.ndarray | None = None) -> ArrayRecord:
    """Stacked autoencoders (``W0`` (m, in, out) …) encoded in the wire format ``fmt``
    (int8-delta: against ``base``, named by the descriptors ``ids``)."""
    return arrays(wire.encode(dict(models), fmt, base, ids))


def members_config(communities: Sequence[int], members: Sequence[Sequence[int]]
                   ) -> dict[str, list[int]]:
    """The config entries naming community ``communities[j]`` and the node's clusters in it,
    ``members[j]`` (flattened, as a ConfigRecord holds flat lists only)."""
    return {"communities": [int(g) for g in communities],
            "members-len": [len(qs) for qs in members],
            "members-flat": [int(q) for qs in members for q in qs]}


def read_members(conf: Mapping[str, Any]) -> tuple[list[int], list[np.ndarray]]:
    """The inverse of :func:`members_config`: community ids and the clusters in each."""
    ids = [int(g) for g in conf.get("communities", [])]
    lens = [int(v) for v in conf.get("members-len", [])]
    flat = np.asarray(conf.get("members-flat", []), dtype=np.int64)
    members = np.split(flat, np.cumsum(lens)[:-1]) if lens else []
    return ids, [np.asarray(qs, dtype=np.int64) for qs in members]


def read_models(rd: RecordDict, name: str = "models", resolve: Resolver | None = None
                ) -> dict[str, np.ndarray] | None:
    """The decoded stacked models of record ``name`` (None: the message has none)."""
    return decoded(rd, name, resolve) if name in rd.array_records else None


def encoded_arrays(model: Mapping[str, np.ndarray], fmt: str) -> dict[str, Array]:
    """One model encoded in the wire format ``fmt`` (int8-delta: without a base), as Flower
    arrays (kept by the server between iterations, so that an unchanged model is encoded
    once)."""
    return flower_arrays(wire.encode(dict(model), fmt))


def flower_arrays(named: Mapping[str, np.ndarray]) -> dict[str, Array]:
    """Encoded arrays as Flower arrays."""
    return {k: Array(np.ascontiguousarray(v)) for k, v in named.items()}


def keyed_record(arrays_by_key: Mapping[str, Mapping[str, Array]]) -> ArrayRecord | None:
    """Cross-evaluation models in one record, named ``"<model key>/<array name>"`` (None:
    no model to send); :func:`keyed_models` reads it."""
    arrs = {f"{key}/{name}": arr for key, named in arrays_by_key.items()
            for name, arr in named.items()}
    return ArrayRecord(arrs) if arrs else None


def keyed_models(rec: ArrayRecord, resolve: Resolver | None = None
                 ) -> tuple[dict[str, dict[str, np.ndarray]], list[str]]:
    """Cross-evaluation models, sent as ``"<model key>/<array name>"``: decoded per key, and
    the keys whose base the receiver cannot build as the sender did (to be sent again)."""
    grouped: dict[str, dict[str, np.ndarray]] = {}
    for name, arr in rec.items():
        key, _, layer = name.rpartition("/")
        grouped.setdefault(key, {})[layer] = arr.numpy()
    out, unreadable = {}, []
    for k, v in grouped.items():
        hit = wire.cached(v)          # a simulation: another client decoded it already
        if hit is not None:
            out[k] = hit
            continue
        try:
            out[k] = decode(v, resolve)
        except wire.BaseMismatch:
            unreadable.append(k)
    return out, unreadable


# -- replies: node -> server -------------------------------------------------------------------

def _hist(hist: np.ndarray | None) -> dict[str, dict[str, np.ndarray]]:
    return {"eval": {"hist": hist}} if hist is not None else {}


def local_reply(models: Mapping[str, np.ndarray] | None, clusters: np.ndarray | None,
                hist: np.ndarray | None, fmt: str, metrics: Mapping[str, Any],
                base: Mapping[str, np.ndarray] | None = None,
                ids: np.ndarray | None = None) -> RecordDict:
    """Lines 6–8: the retrained cluster models (None: unchanged; int8-delta: against
    ``base``, named by ``ids``) and the clusters that have a model (None: unchanged), with
    the evaluation histograms when asked."""
    out: dict[str, dict[str, np.ndarray]] = {}
    if models:
        out["models"] = wire.encode(dict(models), fmt, base, ids)
    if clusters is not None:
        out["clusters"] = {"clusters": np.asarray(clusters, dtype=np.int64)}
    return _content({**out, **_hist(hist)}, metrics)


def accept_reply(accept: np.ndarray, seconds: float) -> RecordDict:
    """Lines 10–15: one accept bit per (local cluster, foreign model)."""
    return _content({"accept": {"accept": np.asarray(accept).astype(np.uint8)}},
                   {"missing": [], "seconds": seconds})


def missing_reply(missing: Sequence[int], seconds: float) -> RecordDict:
    """The positions of the foreign models the node no longer holds: send them again."""
    return _content(None, {"missing": [int(i) for i in missing], "seconds": seconds})


def read_accept(rd: RecordDict) -> np.ndarray:
    return rd.array_records["accept"]["accept"].numpy().astype(bool)


def comm_reply(models: Mapping[str, np.ndarray], counts: np.ndarray, fmt: str,
               seconds: float, base: Mapping[str, np.ndarray] | None = None,
               ids: np.ndarray | None = None) -> RecordDict:
    """Line 22: the node's trained copy of each of its communities (int8-delta: against
    ``base``, the copies it received, named by ``ids``) and its sample counts."""
    return _content({"models": wire.encode(dict(models), fmt, base, ids),
                     "counts": {"counts": counts}}, {"seconds": seconds})


def read_comm(rd: RecordDict, resolve: Resolver | None = None
              ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    return decoded(rd, "models", resolve), rd.array_records["counts"]["counts"].numpy()


def refine_reply(agreement: float, community_share: float, confirmed: np.ndarray | None,
                 hist: np.ndarray | None, seconds: float) -> RecordDict:
    """Lines 26–30: the agreement with the previous labels, the share of the samples that
    community models label, and with ``refine=covered`` one bit per community."""
    out = _hist(hist)
    if confirmed is not None:
        out["confirmed"] = {"confirmed": np.asarray(confirmed).astype(np.uint8)}
    return _content(out, {"agreement": agreement, "community-share": community_share,
                         "seconds": seconds})


def read_refine(rd: RecordDict) -> tuple[float, list[bool] | None, float | None]:
    """Agreement, confirmation bits (None: not asked) and community share of a checked reply."""
    met = rd.metric_records["metrics"]
    confirmed = ([bool(b) for b in rd.array_records["confirmed"]["confirmed"].numpy()]
                 if "confirmed" in rd.array_records else None)
    share = float(met["community-share"]) if "community-share" in met else None
    return float(met["agreement"]), confirmed, share


def metrics_problem(content: RecordDict, *names: str) -> str | None:
    if "metrics" not in content.metric_records:
        return "missing metric record 'metrics'"
    met = content.metric_records["metrics"]
    for name in names:
        if name not in met:
            return f"metrics lack '{name}'"
        value = met[name]
        if isinstance(value, list) or isinstance(value, bool):
            return f"metric '{name}' is not a number"
        if not np.isfinite(float(value)):
            return f"metric '{name}' is not finite"
    return None


def whole_problem(content: RecordDict, name: str, low: int, high: int) -> str | None:
    """Metric ``name`` is a whole number in ``[low, high]``."""
    problem = metrics_problem(content, name)
    if problem:
        return problem
    value = content.metric_records["metrics"][name]
    whole = isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if not whole or not low <= int(value) <= high:
        return f"metric '{name}' = {value} is not a whole number in [{low}, {high}]"
    return None


def model_shapes(sizes: list[int], rows: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of ``rows`` stacked autoencoders with layer sizes ``sizes``."""
    out: dict[str, tuple[int, ...]] = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=False)):
        out[f"W{i}"], out[f"b{i}"] = (rows, fan_in, fan_out), (rows, 1, fan_out)
    return out


def decoded(content: RecordDict, name: str, resolve: Resolver | None = None
            ) -> dict[str, np.ndarray]:
    """The float32 model arrays of array record ``name`` (any ``fedcref.wire`` format)."""
    return decode({k: v.numpy() for k, v in content.array_records[name].items()}, resolve)


def expected_resolver(expect: np.ndarray,
                      base: Mapping[str, np.ndarray] | Callable[[], Mapping[str, np.ndarray]]
                      ) -> Resolver:
    """The server's resolver for a reply: each model may name no base or exactly its row of
    the descriptors ``expect``, whose bases are ``base`` (or what ``base()`` builds, once);
    any other descriptor is refused."""
    expect = np.asarray(expect, dtype=np.int64)
    built: list[Mapping[str, np.ndarray]] = []

    def resolve(ids: np.ndarray, sizes: np.ndarray) -> dict[str, np.ndarray]:
        ids = np.asarray(ids)
        named = ids[:, 0] != wire.NONE
        if ids.shape != expect.shape or not np.array_equal(ids[named], expect[named]):
            raise wire.BaseMismatch(f"the models name bases {ids[named].tolist()}, expected "
                                    f"{expect[named].tolist()} or none")
        if not built:
            built.append(base() if callable(base) else base)
        return {k: np.asarray(v, dtype=np.float32) for k, v in built[0].items()}

    return resolve


def held_ids(communities: Sequence[int]) -> np.ndarray:
    """The descriptors of models sent against the receiver's copies of ``communities``."""
    return np.array([[wire.HELD, 0, 0, int(g)] for g in communities],
                    dtype=np.int64).reshape(-1, 4)


def init_ids(seed: int, count: int) -> np.ndarray:
    """The descriptors of ``count`` models that start from the rows of the seeded
    initialisation ``init_params(count, …, seed)``."""
    return np.array([[wire.INIT, int(seed), int(count), j] for j in range(count)],
                    dtype=np.int64).reshape(-1, 4)


def _delta_sizes_problem(raw: Mapping[str, np.ndarray], shapes: dict[str, tuple[int, ...]]
                         ) -> str | None:
    """An int8-delta record's layer sizes and model count against the expected ``shapes``
    (before anything is inflated)."""
    n_layers = sum(1 for k in shapes if k.startswith("W"))
    want = [shapes["W0"][1]] + [shapes[f"W{i}"][2] for i in range(n_layers)]
    if np.asarray(raw["sizes"]).tolist() != want or len(raw["zn"]) != shapes["W0"][0]:
        return (f"int8-delta models of sizes {np.asarray(raw['sizes']).tolist()} x "
                f"{len(raw['zn'])}, expected {want} x {shapes['W0'][0]}")
    if np.any((np.asarray(raw["base"])[:, 0] == wire.NONE) & (np.asarray(raw["digest"]) != 0)):
        return "a model without a base carries a base digest"
    return None


def models_problem(content: RecordDict, name: str, shapes: dict[str, tuple[int, ...]],
            bound: Callable[[str], float] | None = None,
            near: dict[str, np.ndarray] | None = None, reach: float = 0.0,
            resolve: Resolver | None = None, out: dict[str, np.ndarray] | None = None
            ) -> str | None:
    """Array record ``name`` holds, once decoded (:mod:`fedclust.fedcref.wire`; int8-delta:
    of the layer sizes and count ``shapes`` implies, against the bases ``resolve`` gives and
    no other), exactly the arrays ``shapes`` names, of those shapes, finite; with ``bound``,
    no weight beyond ``bound(array name)`` in absolute value; with ``near``, no weight
    further than ``reach`` (plus two int8 rounding steps) from the same weight of ``near``.
    ``out``, when given, receives the decoded arrays of a record that passes."""
    if name not in content.array_records:
        return f"missing array record '{name}'"
    raw = {k: v.numpy() for k, v in content.array_records[name].items()}
    problem = wire.problem(raw) or ("z" in raw and _delta_sizes_problem(raw, shapes)) or None
    if problem:
        return f"'{name}': {problem}"
    try:
        rec = decode(raw, resolve)
    except ValueError as exc:     # BaseMismatch included
        return f"'{name}': {exc}"
    if set(rec) != set(shapes):
        return f"'{name}' has arrays {sorted(rec)}, expected {sorted(shapes)}"
    for k, shape in shapes.items():
        a = rec[k]
        if a.shape != shape:
            return f"'{name}.{k}' has shape {a.shape}, expected {shape}"
        if not np.all(np.isfinite(a)):
            return f"'{name}.{k}' has non-finite values"
        if bound is not None and np.any(np.abs(a) > bound(k)):
            return (f"'{name}.{k}' has weights up to {float(np.abs(a).max()):.3g}, beyond what "
                    f"its training can reach")
        if near is not None:
            moved = np.abs(a - near[k]) - 2.0 * int8_step(near[k])
            if np.any(moved > reach + 1e-3):
                return (f"'{name}.{k}' moved {float(moved.max()):.3g} from the model it was "
                        f"sent, beyond the {reach:.3g} its local epochs can move it")
    if out is not None:
        out.update(rec)
    return None


# Adam moves a weight by at most lr · (1 − β1) / √(1 − β2) ≈ 3.2 lr per step (β1 0.9, β2
# 0.999); the checks allow 4 lr per step, plus two int8 rounding steps.
ADAM_STEP = 4.0


def steps(epochs: int, rows: int, batch: int) -> int:
    """Optimizer steps of ``epochs`` epochs over ``rows`` samples in batches of ``batch``."""
    return int(epochs) * max(1, -(-int(rows) // int(batch)))


def fresh_bound(s: ClientSettings, sizes: list[int], rows: int) -> Callable[[str], float]:
    """The largest weight a cluster model freshly trained on at most ``rows`` samples can
    hold: its initialisation bound (:func:`fedclust.fedcref.autoencoder.init_params`) plus
    what ``ae-epochs`` epochs of Adam can add."""
    reach = ADAM_STEP * s.lr * steps(s.ae_epochs, rows, s.batch_size)

    def bound(name: str) -> float:
        fan_in, fan_out = sizes[int(name[1:])], sizes[int(name[1:]) + 1]
        if s.ae_init == "torch":
            init = 1.0 / np.sqrt(fan_in)
        else:   # keras: glorot-uniform weights, zero biases
            init = np.sqrt(6.0 / (fan_in + fan_out)) if name[0] == "W" else 0.0
        return 1.01 * init + reach + 1e-3

    return bound


def check_local(content: RecordDict, sizes: list[int] | None, hidden: list[int],
                 s: ClientSettings | None = None, phase_seed: int | None = None,
                 ae_init: str = "keras", out: dict[str, np.ndarray] | None = None
                 ) -> str | None:
    """Reply of ``train.fedcref_local``: k, identity key, version, row count, the list of
    modelled clusters and, after a (re)training, the stacked models (layer sizes ``sizes``
    once known, else those its own input width implies), of weights its training can reach;
    int8-delta models may name as base only their own seeded initialisation (the node's
    seed from ``phase_seed`` and its key, :func:`local_resolver`); ``out`` receives the
    decoded models of a reply that passes."""
    problem = (whole_problem(content, "n", 1, 2**53) or whole_problem(content, "key", 0, 2**63 - 1)
               or whole_problem(content, "version", 0, 2**53))
    if problem is None and "init-ok" in content.metric_records["metrics"]:
        problem = whole_problem(content, "init-ok", 0, 1)
    if problem:
        return problem
    n = int(content.metric_records["metrics"]["n"])
    problem = whole_problem(content, "k", 1, n)
    if problem:
        return problem
    k = int(content.metric_records["metrics"]["k"])
    if "models" in content.array_records and "clusters" not in content.array_records:
        return "models without array record 'clusters'"
    if "clusters" in content.array_records:
        clusters = content.array_records["clusters"]["clusters"].numpy()
        if clusters.ndim != 1 or clusters.dtype.kind not in "iu" or np.any(clusters < 0) \
                or np.any(clusters >= k) or len(np.unique(clusters)) != len(clusters):
            return (f"'clusters' must list distinct local clusters in 0..{k - 1}, got "
                    f"{clusters.dtype} {clusters.shape}")
    if "models" in content.array_records:
        rec = content.array_records["models"]
        width = input_width(rec)
        if width is None:
            return "'models' lacks a 3-D 'W0' (or int8-delta 'sizes')"
        if sizes is None:
            from fedclust.fedcref.autoencoder import layer_sizes  # torch: server side only
            sizes = layer_sizes(width, hidden)
        dims = sizes
        bound = fresh_bound(s, dims, n) if s is not None else None
        resolve = (local_resolver(phase_seed, int(content.metric_records["metrics"]["key"]),
                                  len(clusters), dims, ae_init)
                   if phase_seed is not None else None)
        problem = models_problem(content, "models", model_shapes(dims, len(clusters)), bound,
                                 resolve=resolve, out=out)
    return problem or check_hist(content, k, n)


def input_width(rec: ArrayRecord) -> int | None:
    """The input width of a models record (None: it shows none)."""
    w0 = rec.get("W0", rec.get("W0.q"))
    if w0 is not None:
        a = w0.numpy()
        return int(a.shape[1]) if a.ndim == 3 else None
    if "sizes" in rec:
        sz = rec["sizes"].numpy()
        if sz.ndim == 1 and len(sz) >= 2 and sz.dtype.kind in "iu" and 1 <= sz[0] <= 1 << 20:
            return int(sz[0])
    return None


def local_resolver(phase_seed: int, key: int, count: int, sizes: list[int], ae_init: str
                   ) -> Resolver:
    """The bases a node's fresh cluster models may name: row j of its seeded initialisation
    (the node's training seed is ``derive_seed(phase_seed, key)``, as the client step's)."""
    from fedclust.fedcref.client import derive_seed  # torch: server side only

    expect = init_ids(derive_seed(phase_seed, key), count)
    return expected_resolver(expect, lambda: wire.resolve(expect, sizes, ae_init))


def check_hist(content: RecordDict, k: int | None, n: int | None = None) -> str | None:
    """Evaluation statistics: (k, classes) non-negative whole counts, at most ``n`` in all
    (``k`` None: any number of rows of at least one class)."""
    if "eval" in content.array_records:
        h = content.array_records["eval"]["hist"].numpy()
        if h.ndim != 2 or h.shape[0] != (h.shape[0] if k is None else k) or h.shape[1] < 1:
            return f"'eval.hist' has shape {h.shape}, expected ({k}, classes)"
        if h.dtype.kind not in "iu" or np.any(h < 0):
            return "'eval.hist' must hold non-negative whole counts"
        if n is not None and int(h.sum()) > n:
            return f"'eval.hist' counts {int(h.sum())} rows, more than the node's {n}"
    return None


def check_accept(content: RecordDict, k: int, n_foreign: int) -> str | None:
    """Reply of ``query.fedcref_assoc``: a (k, n_foreign) matrix of bits or missing keys."""
    met = content.metric_records.get("metrics")
    miss = met.get("missing", []) if met is not None else []
    if not isinstance(miss, list):
        return "'missing' must be a list of model positions"
    if miss:
        if any(float(i) != int(i) or not 0 <= int(i) < n_foreign for i in miss):
            return f"'missing' indices outside 0..{n_foreign - 1}"
        return None
    if "accept" not in content.array_records:
        return "neither 'accept' nor 'missing' in the reply"
    bits = content.array_records["accept"]["accept"].numpy()
    if bits.shape != (k, n_foreign):
        return f"'accept' has shape {bits.shape}, expected {(k, n_foreign)}"
    if bits.dtype.kind not in "biu" or not np.isin(bits, (0, 1)).all():
        return "'accept' must hold bits (0 or 1)"
    return None


def check_comm(content: RecordDict, shapes: dict[str, tuple[int, ...]],
                sent: dict[str, np.ndarray] | None = None, rows: int | None = None,
                s: ClientSettings | None = None, resolve: Resolver | None = None,
                out: dict[str, np.ndarray] | None = None) -> str | None:
    """Reply of ``train.fedcref_comm``: the models it was sent (same names and shapes; as
    int8-delta against the bases ``resolve`` allows), trained (no weight further from the one
    sent than ``fl-local-epochs`` epochs of Adam on the node's ``rows`` can move it), and one
    whole sample count per community, at most ``rows``; ``out`` receives the decoded models
    of a reply that passes."""
    problem = models_problem(content, "models", shapes, resolve=resolve)
    if problem:
        return problem
    n_comm = shapes["W0"][0]
    if "counts" not in content.array_records:
        return "missing array record 'counts'"
    counts = content.array_records["counts"]["counts"].numpy()
    whole = counts.dtype.kind in "iuf" and np.all(np.isfinite(counts)) \
        and np.all(counts == np.round(counts))
    if counts.shape != (n_comm,) or not whole or np.any(counts < 0) \
            or (rows is not None and np.any(counts > rows)):
        return (f"'counts' must be {n_comm} whole numbers in [0, {rows}], got "
                f"{counts.dtype} {counts.shape}")
    if sent is None or s is None:
        return models_problem(content, "models", shapes, resolve=resolve, out=out)
    reach = ADAM_STEP * s.lr * steps(s.fl_local_epochs, int(counts.max(initial=0)),
                                     s.batch_size)
    return models_problem(content, "models", shapes, near=sent, reach=reach, resolve=resolve,
                          out=out)


def int8_step(a: np.ndarray) -> np.ndarray:
    """One int8 rounding step of a stack of weight matrices (0 for biases)."""
    if a.ndim == 3 and a.shape[1] > 1:
        return np.abs(a).max(axis=1, keepdims=True) / 127.0
    return np.zeros_like(a)


def check_refine(content: RecordDict, n_confirmed: int | None = None,
                  k: int | None = None, rows: int | None = None) -> str | None:
    """Reply of ``train.fedcref_refine``: the agreement in [0, 1], the community share in
    [0, 1] when sent, and with ``refine=covered`` one confirmation bit per community sent."""
    problem = metrics_problem(content, "agreement")
    if problem:
        return problem
    met = content.metric_records["metrics"]
    if "community-share" in met:
        problem = metrics_problem(content, "community-share")
        if problem:
            return problem
    for name in ("agreement", "community-share"):
        if name in met and not 0.0 <= float(met[name]) <= 1.0:
            return f"metric '{name}' = {met[name]} outside [0, 1]"
    if n_confirmed is not None:
        if "confirmed" not in content.array_records:
            return "missing array record 'confirmed'"
        bits = content.array_records["confirmed"]["confirmed"].numpy()
        if bits.shape != (n_confirmed,) or not np.isin(bits, (0, 1)).all():
            return f"'confirmed' must be {n_confirmed} bits, got shape {bits.shape}"
    return check_hist(content, k, rows)


def read_hist(content: RecordDict) -> np.ndarray | None:
    if "eval" in content.array_records:
        return content.array_records["eval"]["hist"].numpy()
    return None


