"""Exact federated FCM with Flower's SecAgg+: :class:`SecureClients`, the
:class:`fedclust.fcm.loop.Clients` whose rounds and final phase the server learns only as sums.

The server learns only ``ΣU`` (c,) and ``ΣWS`` (c, f) over the clients of a round, never a
client's own sums; the final phase likewise sums the objective ``J`` and, on the evaluation path,
the label × cluster contingency tables (:func:`secure_final`), so no per-client value of the
clustering itself reaches the server. (The scaling phase stays plain: per-feature min/max, or
count/mean/M2 for standard scaling — see docs/deployment.md.)

Flower 1.41/1.42 implements SecAgg+ only as a *legacy* server workflow
(:class:`flwr.server.workflow.SecAggPlusWorkflow`, which needs a ``LegacyContext``) and a client
mod (``secaggplus_mod``) that only handles the default ``"train"`` message type. This module
drives that workflow for one round between the Message-API phases of the loop; the client side
is :mod:`client_apps.secagg_handlers`, the messages :mod:`strategies.wire.fcm`.

The encoding of the sums (exact through SecAgg+'s quantizer) is :mod:`fedclust.fcm.secagg`.
"""

from __future__ import annotations

import copy
import logging
import time
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.serverapp import Grid

from fedclust.errors import FedclustError
from fedclust.fcm.keys import FCMSettings
from fedclust.fcm.loop import RoundSums
from fedclust.fcm.phases import FinalStats, Replies, Scaling, check_pooled_rows
from fedclust.fcm.secagg import (
    CLIP,
    LIMBS,
    MOD,
    QUANT,
    final_length,
    scale_for,
    sums_length,
    unpack,
    unpack_count,
    unpack_final,
)
from strategies.common import (
    Exchange,
    config_answered,
    node_name,
    record_nbytes,
    reject,
    with_run_config,
)
from strategies.fcm.family import FamilyClients
from strategies.wire import fcm as wire
from strategies.wire.replies import node_text

LOG = logging.getLogger("fedclust")


class SecureClients(FamilyClients):
    """:class:`fedclust.fcm.loop.Clients` with SecAgg+ sums: each round's ``(ΣU, ΣWS)`` and the
    final ``ΣJ`` (and summed evaluation table) come out of one SecAgg+ round each; the server
    checks the totals (:func:`strategies.wire.fcm.secure_sums_problem`) and stops on an
    implausible one, naming the round's contributors. The scaling phase is plain (without the
    nodes' row counts)."""

    s: FCMSettings

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bound: float | None = None   # max|x| after scaling: fixes the public divisors
        self.last_round = 0

    def sums(self, rnd: int, sampled: list[int], centers: np.ndarray, sc: Scaling
             ) -> RoundSums:
        c, f = centers.shape
        if self.bound is None:   # before the first round
            check_secure_round(len(sampled))
            self.bound = secure_bound(sc.low, sc.high)
        self.last_round = rnd
        u, ws, ex, n_contrib, rows = secure_sums(self.grid, sampled, centers, sc, self.timeout,
                                                 rnd, self.bound)
        if n_contrib:
            _check_secure_total(wire.secure_sums_problem(u, ws, rows, sc.box, c, self.s.m),
                                f"round-{rnd}", sampled, ex)
            if not ex.failed and len(sampled) == len(self.ids):
                check_pooled_rows(self.s, {}, len(sampled), 0, int(round(rows)))
        return RoundSums(u, ws, n_contrib, _replies(ex), totals_only=True)

    def final(self, centers: np.ndarray, sc: Scaling) -> FinalStats:
        c, f = centers.shape
        codes = sc.eval_codes if self.s.evaluate else sc.eval_codes[:0]
        objective, table, ex, n_final, rows = secure_final(
            self.grid, self.ids, centers, sc, self.timeout, self.last_round + 1, codes,
            self.run_dir, self.bound)
        if n_final:
            _check_secure_total(wire.secure_final_problem(objective, table, rows, sc.box),
                                "final", self.ids, ex)
        covered = [n for n in self.ids if n not in ex.failed]
        if table is None:
            return FinalStats(objective, _replies(ex), covered=covered)
        return FinalStats(objective, _replies(ex), tables=[(codes, table)],
                          eval_nodes=len(sc.eval_nodes - set(ex.failed)),
                          eval_rows=int(round(float(table.sum()))), covered=covered)


def _replies(ex: Exchange) -> Replies:
    return Replies(failed=dict(ex.failed), excluded=dict(ex.excluded), seconds=ex.seconds,
                   bytes_sent=ex.bytes_sent, bytes_received=ex.bytes_received)


def _check_secure_total(problem: str | None, phase: str, asked: list[int], ex: Exchange
                        ) -> None:
    """Stop on an implausible SecAgg+ total: one of the round's contributors sent bad sums,
    and SecAgg+ hides which one."""
    if not problem:
        return
    who = sorted(set(asked) - set(ex.failed))
    raise RuntimeError(
        f"exact FCM with SecAgg+: the securely summed statistics of phase '{phase}' are "
        f"implausible ({problem}). One of the {len(who)} contributing nodes "
        f"({', '.join(node_name(n) for n in who)}) sent bad sums; secure aggregation hides "
        f"each node's own sums, so the server cannot tell which one. Fix: check those nodes "
        f"(their data, their fedclust version), or run once with "
        f"fcm.secure-aggregation=false, whose per-node checks name the node.")


def secure_sums(grid: Grid, sampled_node_ids: list[int], centers: np.ndarray, sc: Scaling,
                timeout: float, rnd: int, bound: float
                ) -> tuple[np.ndarray, np.ndarray, Exchange, int, float]:
    """One SecAgg+ round over ``sampled_node_ids``; return ``(ΣU, ΣWS, exchange, n, ΣN)``
    (``ΣN``: the contributors' rows together, against which the server checks ``ΣU``).

    The round's payload is the legacy ``FitIns`` parameters ``[centers, shift, scale]``.
    Clients that drop out during the protocol are reconstructed away by SecAgg+ (as long as a
    threshold of neighbours survives) and named in ``exchange.failed``; if the protocol halts
    (too few survivors), the round contributes nothing (zero sums, ``n = 0``) and the centers
    stay where they are.
    """
    c, f = centers.shape
    scale = scale_for(bound)
    scale_u = scale_for(1.0)
    total, ex, n = _secure_round(grid, sampled_node_ids, centers, sc, timeout, rnd,
                                 wire.secure_sums_config(scale, scale_u, LIMBS),
                                 sums_length(c, f))
    if total is None:
        return np.zeros(c), np.zeros((c, f)), ex, 0, 0.0
    u, ws = unpack(total, c, f, scale, scale_u=scale_u)
    return u, ws, ex, n, unpack_count(total, LIMBS * (c + c * f), scale_u)


def final_scales(f: int, bound: float) -> tuple[float, float]:
    """Public divisors of the final phase: ``(S_J, S_table)``.

    ``J = Σ_j Σ_i u_ij^m ‖x_j − v_i‖² ≤ N · F · (2·max|x|)²`` (memberships^m sum to ≤ 1 per point,
    centers lie in the data's box; ``bound``: ``max|x|`` after scaling); contingency counts are
    integers ≤ N.
    """
    return scale_for(f * (2.0 * bound) ** 2), scale_for(1.0)


def secure_final(grid: Grid, node_ids: list[int], centers: np.ndarray, sc: Scaling,
                 timeout: float, rnd: int, eval_codes: np.ndarray, run_dir: str, bound: float
                 ) -> tuple[float, np.ndarray | None, Exchange, int, float]:
    """The final phase under SecAgg+: ``(ΣJ, Σ contingency or None, exchange, n, ΣN)``.

    Each client feeds ``[J, contingency (len(eval_codes) × c)]`` to one SecAgg+ round, so the
    server learns the objective and (on the evaluation path, ``eval_codes`` not empty: the
    label codes the nodes reported in the scaling phase, one table row each) the label × cluster
    table of the federation only, never a client's own. ``ΣJ`` is NaN if the protocol halted.
    """
    c, f = centers.shape
    eval_rows = len(eval_codes)
    scale_j, scale_t = final_scales(f, bound)
    total, ex, n = _secure_round(grid, node_ids, centers, sc, timeout, rnd,
                                 wire.secure_final_config(scale_j, scale_t, LIMBS, eval_codes,
                                                          run_dir),
                                 final_length(int(eval_rows), c))
    if total is None:
        return float("nan"), None, ex, 0, 0.0
    j, table = unpack_final(total, int(eval_rows), c, scale_j, scale_t)
    rows = unpack_count(total, LIMBS * (1 + int(eval_rows) * c), scale_t)
    return j, (table if eval_rows > 0 else None), ex, n, rows


class SecureAggregationFailed(FedclustError, RuntimeError):
    """A SecAgg+ round summed nothing and its recovery failed: the run stops."""


#: SecAgg+'s stages in protocol order (:func:`_culprits`)
STAGE_ORDER = ("setup", "share_keys", "collect_masked_vectors", "unmask")


def _secure_round(grid: Grid, node_ids: list[int], centers: np.ndarray, sc: Scaling,
                  timeout: float, rnd: int, fit_config: dict[str, Any], length: int
                  ) -> tuple[np.ndarray | None, Exchange, int]:
    """Drive one SecAgg+ round; return ``(Σ of the clients' vectors, exchange, n)``.

    ``None`` means nothing was summed: fewer than 2 clients (the caller refuses that before
    any round). ``length``: the size of every client's vector; a reply of the wrong form (a
    masked vector of another size, or a stage reply without what the stage returns) is
    refused before it reaches the workflow, and the node counts as dropped. SecAgg+ recovers
    from a node dropped after it shared its key shares; one dropped before (in the setup or
    share-keys stage), or stale or forged shares, leave the others unable to unmask, so the
    round halts. It is then run once more without the nodes that failed first (those refused
    or silent in the earliest stage in which any node failed).

    Raises
    ------
    SecureAggregationFailed
        The round halted and its second try failed too, or could not be made (no node to
        leave out, or fewer than 2 left): a recovery that fails stops the run, never a round
        that silently contributes nothing.
    """
    total, ex, n, first, halted = _secure_round_once(grid, node_ids, centers, sc, timeout,
                                                     rnd, fit_config, length)
    if total is not None:
        return total, ex, n
    label = "final" if wire.is_final(fit_config) else f"round-{rnd}"
    culprits = _culprits(first) | set(ex.excluded)
    rest = [nid for nid in node_ids if nid not in culprits]
    if not culprits or len(rest) < 2:
        raise SecureAggregationFailed(_failure_message(
            label, ex, halted, "no second try was possible: " + (
                "no node failed before the protocol broke, so none can be left out"
                if not culprits else f"only {len(rest)} node(s) would remain, and SecAgg+ "
                                     f"needs 2")))
    LOG.warning("[%s] secure aggregation halted; again without the node(s) that failed "
                "first: %s", label, "; ".join(f"{node_name(c)}: {ex.failed.get(c, '?')}"
                                              for c in sorted(culprits)))
    total, again, n, _, halted = _secure_round_once(grid, rest, centers, sc, timeout, rnd,
                                                    fit_config, length)
    if total is None:
        left_out = ", ".join(node_name(c) for c in sorted(culprits))
        raise SecureAggregationFailed(_failure_message(
            label, again, halted, f"the second try without {left_out} halted too"))
    for nid in culprits:
        again.failed[nid] = ex.failed.get(nid, "secure aggregation halted")
    again.excluded.update(ex.excluded)
    again.bytes_sent += ex.bytes_sent
    again.bytes_received += ex.bytes_received
    again.seconds += ex.seconds
    return total, again, n


def _culprits(first: dict[int, str]) -> set[int]:
    """The nodes that failed in the earliest stage in which any node failed (``first``: node →
    the stage of its first failure)."""
    if not first:
        return set()
    earliest = min(first.values(), key=lambda st: STAGE_ORDER.index(st)
                   if st in STAGE_ORDER else len(STAGE_ORDER))
    return {nid for nid, st in first.items() if st == earliest}


def _failure_message(label: str, ex: Exchange, halted: str, why: str) -> str:
    reasons = "; ".join(f"{node_name(n)}: {r}" for n, r in sorted(ex.failed.items())) or \
        "no node named a reason"
    return (f"exact FCM with SecAgg+: the secure aggregation of phase '{label}' summed nothing "
            f"({halted}; {reasons}), and {why}. The run stops rather than go on without this "
            f"phase's sums. Fix: check the named nodes (their logs, their fedclust version; "
            f"stale or forged SecAgg+ replies break the protocol for every node), raise run config "
            f"'timeout' if they are only slow, or run once with fcm.secure-aggregation=false, "
            f"whose per-node checks name a node that sends bad values.")


def _secure_round_once(grid: Grid, node_ids: list[int], centers: np.ndarray, sc: Scaling,
                       timeout: float, rnd: int, fit_config: dict[str, Any], length: int
                       ) -> tuple[np.ndarray | None, Exchange, int, dict[int, str], str]:
    """One run of the SecAgg+ workflow over ``node_ids`` (:func:`_secure_round`); the last
    items map each node that failed to the stage of its first failure, and say why the round
    halted ("" when it did not)."""
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
    params = wire.secure_parameters(centers, sc.shift, sc.scale)
    if len(nodes) < 2:
        ex.failed.update({n: "secure aggregation needs at least 2 clients" for n in nodes})
        ex.seconds = time.perf_counter() - t0
        return None, ex, 0, {}, "fewer than 2 clients"
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
            seen["failures"] = [node_text(e) for e in failures]
            return super().aggregate_fit(server_round, results, failures)

    strategy = _RoundStrategy(
        fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=len(nodes),
        min_available_clients=len(nodes), min_evaluate_clients=0,
        initial_parameters=ndarrays_to_parameters(params))
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
        timeout=float(timeout))
    # The workflow sends FitIns parameters from the main params record: put the round payload
    # there (centers, shift, scale), and read the summed vector back from the same record.
    lctx.state.array_records[MAIN_PARAMS_RECORD] = _params_record(params)
    counting = _CountingGrid(grid, length)
    try:
        workflow(counting, lctx)
    except Exception as exc:  # Flower's workflow on replies it cannot use (e.g. stale shares)
        seen.pop("n", None)
        seen["failures"] = [f"SecAgg+ workflow: {type(exc).__name__} {node_text(exc)}"]
    ex.bytes_sent, ex.bytes_received = counting.bytes_sent, counting.bytes_received
    after = lctx.state.array_records[MAIN_PARAMS_RECORD]
    n = int(seen.get("n", 0))
    contributors = seen.get("contributors", [])
    label = "final" if wire.is_final(fit_config) else f"round-{rnd}"
    for nid, problem in counting.rejected.items():
        reject(ex, nid, problem, label)
    for nid in nodes:
        if nid not in contributors and nid not in ex.failed:
            ex.failed[nid] = counting.why.get(nid, "dropped out of secure aggregation")
    if n == 0 or "n" not in seen:
        halted = "; ".join(seen.get("failures") or []) or "the protocol halted"
        LOG.warning("[%s] secure aggregation halted; nothing summed (%s)", label, halted)
        ex.failed.update({nid: ex.failed.get(nid, "secure aggregation halted") for nid in nodes})
        ex.seconds = time.perf_counter() - t0
        return None, ex, 0, dict(counting.first_stage), halted
    mean_vec = parameters_to_ndarrays(_to_parameters(after))[0]
    for nid, why in ex.failed.items():
        LOG.warning("[%s] node %s dropped: %s", label, nid, why)
    ex.seconds = time.perf_counter() - t0
    return np.asarray(mean_vec, dtype=np.float64) * n, ex, n, dict(counting.first_stage), ""


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


def _params_record(ndarrays: list[np.ndarray]) -> Any:
    import flwr.compat.common.recorddict_compat as compat
    from flwr.common import ndarrays_to_parameters

    return compat.parameters_to_arrayrecord(ndarrays_to_parameters(ndarrays), True)


def _to_parameters(record: Any) -> Any:
    import flwr.compat.common.recorddict_compat as compat

    return compat.arrayrecord_to_parameters(record, keep_input=True)


def _stage(content: RecordDict) -> str | None:
    """The SecAgg+ stage a message of the workflow asks for (None: not a stage message)."""
    rec = content.get("secaggplus_configs")
    return str(rec["stage"]) if isinstance(rec, ConfigRecord) and "stage" in rec else None


class _CountingGrid:
    """Grid wrapper that counts payload bytes, remembers error replies per node and refuses
    masked vectors of the wrong size (``rejected``: node → reason)."""

    def __init__(self, grid: Grid, length: int) -> None:
        self._grid = grid
        self.length = length
        self.bytes_sent = 0
        self.bytes_received = 0
        self.why: dict[int, str] = {}
        self.rejected: dict[int, str] = {}
        self.seen: set[int] = set()     # every node sent a message in this secure round
        self.first_stage: dict[int, str] = {}   # node -> the stage it first failed in

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
        messages = [Message(with_run_config(m.content, m.metadata.dst_node_id),
                            dst_node_id=m.metadata.dst_node_id,
                            message_type=m.metadata.message_type, group_id=m.metadata.group_id)
                    for m in messages]
        # before sending: an in-process node's mod consumes the stage record
        stages = {m.metadata.dst_node_id: _stage(m.content) for m in messages}
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        by_msg = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
        round_nodes = set(by_msg.values())
        self.seen |= round_nodes
        answered = set()
        clean = []
        for r in replies:
            nid = by_msg.get(r.metadata.reply_to_message_id)
            if r.has_error():
                # SuperLink-made error replies carry src_node_id 1: never pass them on to the
                # workflow (it keys state by src_node_id); record the reason by destination.
                if nid is not None:
                    self.why[nid] = f"error reply: {node_text(r.error.reason)}"
                    self.first_stage.setdefault(nid, stages.get(nid) or "")
                    answered.add(nid)
                continue
            if nid is not None:
                answered.add(nid)
            self.bytes_received += record_nbytes(r.content)
            stage = stages.get(nid) if nid is not None else None
            problem = (wire.secagg_reply_problem(r.content, stage, round_nodes | self.seen)
                       if stage else None) or wire.masked_size_problem(r.content, self.length)
            if problem and nid is None:
                continue        # a reply to no message of this exchange: never passed on
            if problem:
                # kept from the sum: SecAgg+ treats the node as dropped and removes its masks
                self.rejected[nid] = problem
                self.first_stage.setdefault(nid, stages.get(nid) or "")
                continue
            clean.append(r)
        for m in messages:
            nid = m.metadata.dst_node_id
            if nid not in answered:
                self.why.setdefault(nid, f"no reply within {timeout}s (secure aggregation)")
                self.first_stage.setdefault(nid, stages.get(nid) or "")
        ok = {by_msg.get(r.metadata.reply_to_message_id) for r in replies if not r.has_error()}
        config_answered(ok - {None}, set(by_msg.values()) - ok)
        return clean
