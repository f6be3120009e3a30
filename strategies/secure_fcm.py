"""Secure sums for exact federated FCM with Flower's SecAgg+ (server side).

The server learns only ``ΣU`` (c,) and ``ΣWS`` (c, f) over the clients of a round, never a
client's own sums; the final phase likewise sums the objective ``J`` and, on the evaluation path,
the label × cluster contingency tables (:func:`secure_final`), so no per-client value of the
clustering itself reaches the server. (The scaling phase stays plain: per-feature min/max, or
count/mean/M2 for standard scaling — see docs/deployment.md.)

Flower 1.41/1.42 implements SecAgg+ only as a *legacy* server workflow
(:class:`flwr.server.workflow.SecAggPlusWorkflow`, which needs a ``LegacyContext``) and a client
mod (``secaggplus_mod``) that only handles the default ``"train"`` message type. This module
drives that workflow for one round between the Message-API phases of
:mod:`strategies.exact_fcm`; the client side is :mod:`client_apps.secagg_handlers`.

Exact sums through a quantizing protocol
----------------------------------------
SecAgg+ clips every value to ``[-clip, clip]`` and stochastically rounds it onto a grid of
``quantization_range`` steps. A client's sums grow with its (secret) number of points, so there
is no range that fits them without knowing ``N``. Instead each value ``v`` is divided by a large
public power of two ``S`` (``r = v / S``, ``|r| ≤ clip``) and written in base ``B = 2^18`` limbs::

    r = l_0 + l_1 / B + l_2 / B^2 + ... + l_{L-1} / B^{L-1}

where ``l_0 .. l_{L-2}`` are multiples of ``1/B`` (= exactly one quantization step with
``clip = 8`` and ``quantization_range = 2^22``, so they pass the quantizer *without error*) and
only the last limb, ``|l_{L-1}| ≤ 1/2``, is rounded. Secure sums are linear, so the server
recombines the summed limbs: ``Σv = S · Σ_j (Σ_i l_ij) / B^j``. With ``S = 2^40 · max|x|`` and
``L = 5`` the quantization error is ``≤ n · S · B^-(L-1) / B ≈ n · 2^-50 · max|x|`` — below
float64 round-off of the sums themselves, so secure and plain runs give the same centers to
~1e-12. Limits: the modular sum needs ``n · 2^22 < 2^32`` → at most 1023 clients per secure
round; at least 2 clients (SecAgg+ needs neighbours).
"""

from __future__ import annotations

import copy
import logging
import math
import time
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid

from strategies.common import Exchange, record_nbytes

LOG = logging.getLogger("fedclust")

CLIP = 8.0
QUANT = 1 << 22                  # quantization_range: step = 2*CLIP/QUANT = 2^-18
BASE = float(1 << 18)            # limb base: one limb unit = one quantization step
LIMBS = 5
MOD = 1 << 32
PHASE_SUMS = "sums"       # fit-config "fedclust.phase": the FCM round's (U, WS)
PHASE_FINAL = "final"     # the objective J and, on the evaluation path, contingency tables


def scale_for(max_abs_x: float) -> float:
    """Public divisor ``S``: a power of two ≥ 2^40 · max(1, max|x|)."""
    return float(2.0 ** (40 + max(0, math.ceil(math.log2(max(1.0, max_abs_x))))))


def to_limbs(values: np.ndarray, scale: float, limbs: int = LIMBS) -> np.ndarray:
    """Split ``values / scale`` into ``limbs`` base-2^18 limbs (shape ``(limbs, *values.shape)``).

    All limbs but the last are exact multiples of 2^-18 in ``[-CLIP, CLIP]``; the last lies in
    ``[-1/2, 1/2]`` (scaled units) and carries the only quantization error.
    """
    r = np.clip(np.asarray(values, dtype=np.float64) / scale, -CLIP + 1.0, CLIP - 1.0)
    out = np.empty((limbs, *r.shape))
    for j in range(limbs - 1):
        hi = np.round(r * BASE) / BASE
        out[j] = hi
        r = (r - hi) * BASE
    out[limbs - 1] = r
    return out


def from_limbs(limb_sums: np.ndarray, scale: float) -> np.ndarray:
    """Inverse of :func:`to_limbs` for *summed* limbs (linearity of the secure sum)."""
    weights = BASE ** -np.arange(limb_sums.shape[0], dtype=np.float64)
    return scale * np.tensordot(weights, limb_sums, axes=1)


def pack(u: np.ndarray, ws: np.ndarray, scale: float, limbs: int = LIMBS,
         scale_u: float | None = None) -> np.ndarray:
    """The vector a client feeds to SecAgg+: limbs of ``U / scale_u`` then of
    ``WS / scale`` (flat float64). ``U = Σu^m ≤ N`` does not grow with the data's units, so it
    gets its own divisor (``scale_for(1)``); one divisor for both would round U away when the
    features are large."""
    scale_u = scale if scale_u is None else scale_u
    return np.concatenate([to_limbs(u.ravel(), scale_u, limbs).ravel(),
                           to_limbs(ws.ravel(), scale, limbs).ravel()])


def unpack(vec: np.ndarray, c: int, f: int, scale: float, limbs: int = LIMBS,
           scale_u: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Summed packed vector → ``(ΣU (c,), ΣWS (c, f))``."""
    scale_u = scale if scale_u is None else scale_u
    vec = np.asarray(vec, dtype=np.float64)
    u = from_limbs(vec[:limbs * c].reshape(limbs, c), scale_u)
    ws = from_limbs(vec[limbs * c:].reshape(limbs, c * f), scale)
    return u, ws.reshape(c, f)


def secure_sums(grid: Grid, sampled_node_ids: list[int], content: RecordDict, c: int, f: int,
                cfg: dict[str, Any], rnd: int, bound: float | None = None
                ) -> tuple[np.ndarray, np.ndarray, Exchange, int]:
    """One SecAgg+ round over ``sampled_node_ids``; return ``(ΣU, ΣWS, exchange, n)``.

    ``content`` is the round's plain payload (``centers`` and ``scaling`` ArrayRecords); it is
    sent to the clients as the legacy ``FitIns`` parameters ``[centers, shift, scale]``.
    Clients that drop out during the protocol are reconstructed away by SecAgg+ (as long as a
    threshold of neighbours survives) and named in ``exchange.failed``; if the protocol halts
    (too few survivors), the round contributes nothing (zero sums, ``n = 0``) and the centers
    stay where they are.
    """
    scale = scale_for(_bound_after_scaling(cfg) if bound is None else bound)
    scale_u = scale_for(1.0)
    total, ex, n = _secure_round(grid, sampled_node_ids, content, cfg, rnd, {
        "fedclust.phase": PHASE_SUMS, "fedclust.secure-scale": scale,
        "fedclust.secure-scale-u": scale_u, "fedclust.limbs": LIMBS})
    if total is None:
        return np.zeros(c), np.zeros((c, f)), ex, 0
    u, ws = unpack(total, c, f, scale, scale_u=scale_u)
    return u, ws, ex, n


def final_scales(f: int, cfg: dict[str, Any], bound: float | None = None
                 ) -> tuple[float, float]:
    """Public divisors of the final phase: ``(S_J, S_table)``.

    ``J = Σ_j Σ_i u_ij^m ‖x_j − v_i‖² ≤ N · F · (2·max|x|)²`` (memberships^m sum to ≤ 1 per point,
    centers lie in the data's box); contingency counts are integers ≤ N.
    """
    bound = _bound_after_scaling(cfg) if bound is None else bound
    return scale_for(f * (2.0 * bound) ** 2), scale_for(1.0)


def pack_final(objective: float, table: np.ndarray, scale_j: float, scale_t: float,
               limbs: int = LIMBS) -> np.ndarray:
    """The final-phase vector: limbs of ``[J]`` then limbs of the contingency table (flat)."""
    return np.concatenate([to_limbs(np.array([objective]), scale_j, limbs).ravel(),
                           to_limbs(np.asarray(table, dtype=np.float64).ravel(), scale_t,
                                    limbs).ravel()])


def unpack_final(vec: np.ndarray, rows: int, cols: int, scale_j: float, scale_t: float,
                 limbs: int = LIMBS) -> tuple[float, np.ndarray]:
    """Summed final-phase vector → ``(ΣJ, Σ contingency (rows, cols) as int64)``."""
    vec = np.asarray(vec, dtype=np.float64)
    j = from_limbs(vec[:limbs].reshape(limbs, 1), scale_j)[0]
    table = from_limbs(vec[limbs:].reshape(limbs, rows * cols), scale_t).reshape(rows, cols)
    return float(j), np.rint(table).astype(np.int64)


def secure_final(grid: Grid, node_ids: list[int], content: RecordDict, c: int, f: int,
                 cfg: dict[str, Any], rnd: int, eval_codes: np.ndarray, run_dir: str = "",
                 bound: float | None = None
                 ) -> tuple[float, np.ndarray | None, Exchange, int]:
    """The final phase under SecAgg+: ``(ΣJ, Σ contingency or None, exchange, n)``.

    Each client feeds ``[J, contingency (len(eval_codes) × c)]`` to one SecAgg+ round, so the
    server learns the objective and (on the evaluation path, ``eval_codes`` not empty: the
    label codes the nodes reported in the scaling phase, one table row each) the label × cluster
    table of the federation only, never a client's own. ``ΣJ`` is NaN if the protocol halted.
    """
    eval_rows = len(eval_codes)
    scale_j, scale_t = final_scales(f, cfg, bound)
    total, ex, n = _secure_round(grid, node_ids, content, cfg, rnd, {
        "fedclust.phase": PHASE_FINAL, "fedclust.secure-scale": scale_j,
        "fedclust.secure-scale-table": scale_t, "fedclust.limbs": LIMBS,
        "fedclust.eval-codes": np.asarray(eval_codes, dtype="<i8").tobytes(),
        "fedclust.run-dir": str(run_dir)})
    if total is None:
        return float("nan"), None, ex, 0
    j, table = unpack_final(total, int(eval_rows), c, scale_j, scale_t)
    return j, (table if eval_rows > 0 else None), ex, n


def _secure_round(grid: Grid, node_ids: list[int], content: RecordDict, cfg: dict[str, Any],
                  rnd: int, fit_config: dict[str, Any]
                  ) -> tuple[np.ndarray | None, Exchange, int]:
    """Drive one SecAgg+ round; return ``(Σ of the clients' vectors or None, exchange, n)``.

    ``None`` means nothing was summed (fewer than 2 clients, or the protocol halted).
    """
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.compat.grid_client_proxy import GridClientProxy
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import SecAggPlusWorkflow
    from flwr.server.workflow.constant import MAIN_CONFIGS_RECORD, MAIN_PARAMS_RECORD
    from flwr.server.workflow.constant import Key as WorkflowKey

    t0 = time.perf_counter()
    ex = Exchange()
    nodes = sorted(int(n) for n in node_ids)
    centers = content.array_records["centers"]["centers"].numpy()
    sc = content.array_records["scaling"]
    shift, sc_scale = sc["shift"].numpy(), sc["scale"].numpy()
    if len(nodes) < 2:
        ex.failed.update({n: "secure aggregation needs at least 2 clients" for n in nodes})
        ex.seconds = time.perf_counter() - t0
        return None, ex, 0
    seen: dict[str, Any] = {}

    class _RoundStrategy(FedAvg):
        """FedAvg that fits exactly the given nodes and counts who contributed."""

        def configure_fit(self, server_round, parameters, client_manager):  # noqa: D102
            from flwr.common import FitIns

            config = {**fit_config, "fedclust.round": rnd}
            proxies = [p for p in client_manager.all().values() if p.node_id in nodes]
            return [(p, FitIns(parameters, config)) for p in proxies]

        def aggregate_fit(self, server_round, results, failures):  # noqa: D102
            seen["n"] = len(results)
            seen["contributors"] = sorted(p.node_id for p, _ in results)
            seen["failures"] = [str(e) for e in failures]
            return super().aggregate_fit(server_round, results, failures)

    strategy = _RoundStrategy(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=len(nodes),
        min_available_clients=len(nodes), min_evaluate_clients=0,
        initial_parameters=ndarrays_to_parameters([centers, shift, sc_scale]))
    base = Context(run_id=getattr(grid.run, "run_id", 0) if grid.run else 0, node_id=0,
                   node_config={}, state=RecordDict(), run_config={})
    lctx = LegacyContext(context=base, config=ServerConfig(num_rounds=1), strategy=strategy)
    run_id = base.run_id
    for nid in nodes:
        lctx.client_manager.register(GridClientProxy(nid, grid, run_id))
    lctx.state.config_records[MAIN_CONFIGS_RECORD] = ConfigRecord(
        {WorkflowKey.CURRENT_ROUND: rnd, WorkflowKey.START_TIME: time.time()})
    workflow = SecAggPlusWorkflow(
        num_shares=1.0 if len(nodes) <= 5 else 0.5, reconstruction_threshold=0.6,
        clipping_range=CLIP, quantization_range=QUANT, modulus_range=MOD, max_weight=1.0,
        timeout=float(cfg["timeout"]))
    # The workflow sends FitIns parameters from the main params record: put the round payload
    # there (centers, shift, scale), and read the summed vector back from the same record.
    lctx.state.array_records[MAIN_PARAMS_RECORD] = _params_record([centers, shift, sc_scale])
    counting = _CountingGrid(grid)
    workflow(counting, lctx)
    ex.bytes_sent, ex.bytes_received = counting.bytes_sent, counting.bytes_received
    after = lctx.state.array_records[MAIN_PARAMS_RECORD]
    n = int(seen.get("n", 0))
    contributors = seen.get("contributors", [])
    label = f"round-{rnd}" if fit_config["fedclust.phase"] == PHASE_SUMS else "final"
    for nid in nodes:
        if nid not in contributors:
            ex.failed[nid] = counting.why.get(nid, "dropped out of secure aggregation")
    if n == 0 or "n" not in seen:
        LOG.warning("[%s] secure aggregation halted; nothing summed (%s)", label,
                    seen.get("failures"))
        ex.failed.update({nid: ex.failed.get(nid, "secure aggregation halted") for nid in nodes})
        ex.seconds = time.perf_counter() - t0
        return None, ex, 0
    mean_vec = parameters_to_ndarrays(_to_parameters(after))[0]
    for nid, why in ex.failed.items():
        LOG.warning("[%s] node %s dropped: %s", label, nid, why)
    ex.seconds = time.perf_counter() - t0
    return np.asarray(mean_vec, dtype=np.float64) * n, ex, n


MAX_SECURE_CLIENTS = MOD // QUANT - 1   # the modular sum of n values < 2^22 must stay < 2^32


def secure_bound(low: np.ndarray, high: np.ndarray) -> float:
    """``max|x|`` after federated scaling, from the federated bounds the server learned in the
    scaling phase: the public divisor ``S`` then fits every client's values, whatever the
    scaling (no clipping, error ``≲ n · 2^-50 · max|x|``)."""
    return float(max(1.0, np.max(np.abs(low)), np.max(np.abs(high))))


def check_secure_round(n_sampled: int) -> None:
    """SecAgg+ needs 2 or more clients per round and at most :data:`MAX_SECURE_CLIENTS`:
    refuse other settings before any round."""
    from fedclust.config import ConfigError

    if n_sampled < 2:
        raise ConfigError(
            f"fcm.secure-aggregation=true with {n_sampled} client(s) per round: SecAgg+ needs "
            f"at least 2 (a lone client's masked sum is its own). Allowed: 2 or more sampled "
            f"clients. Fix: raise fcm.fraction or use more clients")
    if n_sampled > MAX_SECURE_CLIENTS:
        raise ConfigError(
            f"fcm.secure-aggregation=true with {n_sampled} clients per round: the secure sum "
            f"encodes {n_sampled} values of up to 2^22 in 32-bit arithmetic, which holds at "
            f"most {MAX_SECURE_CLIENTS}. Fix: lower fcm.fraction so that at most "
            f"{MAX_SECURE_CLIENTS} clients are sampled per round")


def _bound_after_scaling(cfg: dict[str, Any]) -> float:
    """A bound on ``max|x|`` after federated scaling when the federated bounds are not at hand.

    minmax → 1. Otherwise a generous 1e6 (S = 2^60): the error bound then grows to
    ~n · 2^-30 per summed value, still far below FCM's tolerance.
    """
    return 1.0 if cfg.get("scaling", "minmax") == "minmax" else 1e6


def _params_record(ndarrays: list[np.ndarray]) -> Any:
    import flwr.compat.common.recorddict_compat as compat
    from flwr.common import ndarrays_to_parameters

    return compat.parameters_to_arrayrecord(ndarrays_to_parameters(ndarrays), True)


def _to_parameters(record: Any) -> Any:
    import flwr.compat.common.recorddict_compat as compat

    return compat.arrayrecord_to_parameters(record, keep_input=True)


class _CountingGrid:
    """Grid wrapper that counts payload bytes and remembers error replies per node."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        self.bytes_sent = 0
        self.bytes_received = 0
        self.why: dict[int, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages, *, timeout=None):  # noqa: D102
        # Fresh copies: the workflow shares one RecordDict between messages and the client mod
        # mutates it; engines serialise each message anyway, in-process grids do not.
        messages = [Message(copy.deepcopy(m.content), dst_node_id=m.metadata.dst_node_id,
                            message_type=m.metadata.message_type, group_id=m.metadata.group_id)
                    for m in messages]
        for m in messages:
            self.bytes_sent += record_nbytes(m.content)
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        by_msg = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        answered = set()
        clean = []
        for r in replies:
            nid = by_msg.get(r.metadata.reply_to_message_id)
            if r.has_error():
                # SuperLink-made error replies carry src_node_id 1: never pass them on to the
                # workflow (it keys state by src_node_id); record the reason by destination.
                if nid is not None:
                    self.why[nid] = f"error reply: {r.error.reason}"
                    answered.add(nid)
                continue
            if nid is not None:
                answered.add(nid)
            self.bytes_received += record_nbytes(r.content)
            clean.append(r)
        for m in messages:
            nid = m.metadata.dst_node_id
            if nid not in answered:
                self.why.setdefault(nid, f"no reply within {timeout}s (secure aggregation)")
        return clean
