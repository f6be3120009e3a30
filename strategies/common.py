"""Message helpers shared by every server loop.

The server loops speak Flower's Message API directly: one ``send_and_collect`` call per phase,
per-node payloads where needed, and explicit bookkeeping of clients that did not answer
(missing replies, error replies) or whose reply failed a check (:mod:`strategies.replies`),
which are recorded and skipped. A node whose reply fails a check is *excluded* from the phase:
the warning names it and the reason, and the run's :class:`Exclusions` ledger (opened by
:func:`strategies.run.execute`) puts it in ``history.jsonl`` and ``summary.json``
(``excluded_nodes``). When exclusions leave a phase fewer honest contributions than the run
needs (:func:`require_honest`), the run stops with the reasons.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from strategies.wire.records import array_record, to_array, to_numpy  # noqa: F401
from strategies.wire.replies import node_text

if TYPE_CHECKING:
    from fedclust.common import CommonSettings

LOG = logging.getLogger("fedclust")

Content = RecordDict | Callable[[int], RecordDict]
Validator = Callable[[RecordDict], str | None]

# The nodes run the method the server runs even when their own run config says otherwise (a
# Strategy object with its own parameters, or two methods chained in one ServerApp): the
# server's config reaches every node, but once per node and run, not in every message. The
# first message to a node carries the whole config (one JSON text, :data:`CONFIG_JSON`) and
# its digest; the later ones only the digest, and the node takes the config it keeps under
# that digest (:func:`client_apps.base.engine_mod`). A node counts as having the config once it
# answered a message without error; a node that failed or did not answer gets the whole config
# again with its next message, and a node that lost it (a restarted SuperNode) says so and is
# sent it again at once (:func:`send_and_collect`).
CONFIG_RECORD = "fedclust.run-config"
CONFIG_JSON = "json"
CONFIG_DIGEST = "digest"
#: the reason of a node's error reply when a message names a config it does not hold
CONFIG_MISSING = "RunConfigMissing"


def config_digest(text: str) -> str:
    """The digest that names a run config's JSON text (the node computes it too)."""
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class CarriedConfig:
    """The run config that the messages of a run carry, and which nodes already hold it.

    Parameters
    ----------
    run_config : mapping
        The server's run config; its scalar values (bool, int, float, str) travel.
    """

    def __init__(self, run_config: Mapping[str, Any]) -> None:
        values = {k: v for k, v in run_config.items() if isinstance(v, (bool, int, float, str))}
        text = json.dumps(values, sort_keys=True)
        self.digest = config_digest(text)
        # two records made once per run and shared by every message (nothing changes them)
        self.full = ConfigRecord({CONFIG_JSON: text, CONFIG_DIGEST: self.digest})
        self.ref = ConfigRecord({CONFIG_DIGEST: self.digest})
        self.holders: set[int] = set()

    def record(self, node: int | None) -> ConfigRecord:
        """The config record of the next message to ``node`` (None: a node not tracked, which
        gets the whole config)."""
        return self.ref if node is not None and node in self.holders else self.full

    def answered(self, ok: Iterable[int], failed: Iterable[int]) -> None:
        """Nodes in ``ok`` answered (they hold the config); those in ``failed`` may not."""
        self.holders.update(int(n) for n in ok)
        self.holders.difference_update(int(n) for n in failed)


_RUN_CONFIG: ContextVar[CarriedConfig | None] = ContextVar("fedclust_run_config", default=None)


@contextmanager
def messages_carry(run_config: Mapping[str, Any]) -> Iterator[CarriedConfig]:
    """Within this block every message sent carries ``run_config`` (:class:`CarriedConfig`)."""
    carried = CarriedConfig(run_config)
    token = _RUN_CONFIG.set(carried)
    try:
        yield carried
    finally:
        _RUN_CONFIG.reset(token)


def with_run_config(content: RecordDict, node: int | None = None) -> RecordDict:
    """``content`` plus the run config of :func:`messages_carry` for node ``node`` (a shallow
    copy; unchanged outside such a block): the whole config if ``node`` may not hold it yet,
    else its digest."""
    carried = _RUN_CONFIG.get()
    if carried is None or CONFIG_RECORD in content:
        return content
    out = RecordDict(dict(content.items()))
    out[CONFIG_RECORD] = carried.record(node)
    return out


def _holds_config(node: int) -> bool:
    carried = _RUN_CONFIG.get()
    return carried is not None and node in carried.holders


def config_answered(ok: Iterable[int], failed: Iterable[int]) -> None:
    """Tell :func:`messages_carry`'s config which nodes answered (``ok``) and which did not
    (``failed``): see :class:`CarriedConfig`. A no-op outside such a block."""
    carried = _RUN_CONFIG.get()
    if carried is not None:
        carried.answered(ok, failed)


@dataclass
class Exchange:
    """Outcome of one phase: replies by node id, and failures by node id with the reason.

    ``replies`` is in node-id order (:func:`send_and_collect`), never in order of arrival, so
    that what a server computes from it does not depend on which node answered first.

    ``excluded`` holds the failures whose reply arrived but failed a check (a subset of
    ``failed``, same reasons): the nodes that sent something implausible rather than nothing.
    """

    replies: dict[int, RecordDict] = field(default_factory=dict)
    failed: dict[int, str] = field(default_factory=dict)
    seconds: float = 0.0
    bytes_sent: int = 0
    bytes_received: int = 0
    excluded: dict[int, str] = field(default_factory=dict)


class Exclusions:
    """The run's record of excluded nodes: ``{"node", "phase", "reason"}`` per rejected reply.

    :func:`strategies.run.execute` opens one per run (:func:`exclusions_recorded`); every
    rejection of :func:`send_and_collect` and :func:`reject` lands here. ``summary.json`` gets
    :attr:`records` as ``excluded_nodes``; each ``history.jsonl`` record gets the exclusions
    since the previous record (:meth:`since_last`), so those of a phase before the first round
    (e.g. the scaling phase) appear in the first round's record and those of a final phase
    after the last record only in the summary.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._logged = 0
        self.labels: dict[int, str] = {}

    def add(self, nid: int, phase: str, reason: str) -> None:
        rec: dict[str, Any] = {"node": int(nid), "phase": phase, "reason": reason}
        if nid in self.labels:
            rec["client"] = self.labels[nid]
        self.records.append(rec)

    def since_last(self) -> dict[str, Any]:
        """``{"excluded_nodes": [...]}`` of the exclusions not yet in a history record (empty
        dict when there are none)."""
        new, self._logged = self.records[self._logged:], len(self.records)
        return {"excluded_nodes": new} if new else {}


_EXCLUSIONS: ContextVar[Exclusions | None] = ContextVar("fedclust_exclusions", default=None)


@contextmanager
def exclusions_recorded() -> Iterator[Exclusions]:
    """Within this block every rejected reply is recorded in the yielded :class:`Exclusions`."""
    ledger = Exclusions()
    token = _EXCLUSIONS.set(ledger)
    try:
        yield ledger
    finally:
        _EXCLUSIONS.reset(token)


def name_nodes(labels: Mapping[int, str]) -> None:
    """Give nodes a label for warnings and records (e.g. a client key or site the node
    reported), so that an excluded node is named by more than its engine id."""
    ledger = _EXCLUSIONS.get()
    if ledger is not None:
        ledger.labels.update({int(n): str(v) for n, v in labels.items()})


def node_name(nid: int) -> str:
    """``"node <id>"``, with its label when one is known (:func:`name_nodes`)."""
    ledger = _EXCLUSIONS.get()
    label = ledger.labels.get(nid) if ledger is not None else None
    return f"node {nid} ({label})" if label else f"node {nid}"


def _exclude(ex: Exchange, nid: int, problem: str, phase: str) -> None:
    ex.replies.pop(nid, None)
    ex.failed[nid] = ex.excluded[nid] = f"rejected reply: {problem}"
    ledger = _EXCLUSIONS.get()
    if ledger is not None:
        ledger.add(nid, phase, problem)


def record_nbytes(content: RecordDict) -> int:
    """Payload size of a RecordDict in bytes (arrays + scalars), used for traffic accounting."""
    total = 0
    for name in content:        # by key: cheaper than Flower's values() views
        rec = content[name]
        if isinstance(rec, ArrayRecord):
            total += sum(len(rec[k].data) for k in rec)
        else:
            for v in rec.values():
                total += len(v) if isinstance(v, (bytes, str)) else 8 * (
                    len(v) if isinstance(v, list) else 1)
    return total


def wait_for_nodes(grid: Grid, n: int, timeout: float, poll: float = 0.5) -> list[int]:
    """Block until ``n`` nodes are connected (or ``timeout``); return the sorted node ids.

    Returns the nodes present at the deadline if fewer than ``n`` connected, so that a run can
    proceed with the clients it has (and record it). A grid whose nodes all exist from the
    start (``grid.complete``, the in-process grid) is not waited for.
    """
    deadline = time.monotonic() + timeout
    complete = bool(getattr(grid, "complete", False))   # every node there from the start
    while True:
        ids = sorted(grid.get_node_ids())
        if len(ids) >= n or complete or time.monotonic() >= deadline:
            if len(ids) < n and not complete:
                LOG.warning("only %d of %d nodes connected after %.0fs", len(ids), n, timeout)
            return ids
        time.sleep(poll)


def reject(ex: Exchange, nid: int, problem: str | None, phase: str) -> bool:
    """Move node ``nid``'s reply to ``ex.failed`` when ``problem``; True when rejected.

    For checks that need more than one reply (e.g. the feature count the others agree on) or
    the node's own request (e.g. how many models it was sent).
    """
    if not problem:
        return False
    _exclude(ex, nid, problem, phase)
    LOG.warning("[%s] %s dropped: %s", phase, node_name(nid), ex.failed[nid])
    return True


def check_each(ex: Exchange, check: Callable[[int, RecordDict], str | None], phase: str,
               passed: Iterable[int] = ()) -> None:
    """Reject every reply of ``ex`` for which ``check(node, content)`` names a problem.

    For checks that need the node (what it was sent) or the other replies; like the
    ``validate`` of :func:`send_and_collect`, an exception in the check rejects the reply.
    ``passed``: nodes whose replies a check of all replies at once found to pass ``check``
    for sure (e.g. :func:`strategies.wire.fcm.sums_passing`).
    """
    done = set(passed)
    for nid in [n for n in ex.replies if n not in done]:
        try:
            problem = check(nid, ex.replies[nid])
        except Exception as exc:  # a reply malformed beyond what the check anticipated
            problem = f"check raised {type(exc).__name__}: {node_text(exc)}"
        reject(ex, nid, problem, phase)


def engine_clients(grid: Grid, cfg: Mapping[str, object]) -> int:
    """The run's client count as the engine has it (0: every connected node, deployment).

    Asks one node what the engine told it (action ``query.fedclust_node``; not with
    ``dataset="local"``, whose deployed nodes read their own ``data-path``): a simulated node
    is partition ``partition-id`` of ``num-partitions``, so ``num-partitions`` is the engine's
    node count; a deployed node answers 0. A non-zero ``num-clients`` that disagrees with the
    engine, or a ``dataset="files"`` folder with another number of files, stops the run here
    with both numbers and the fix (instead of waiting ``timeout`` for nodes that never come).
    """
    from fedclust.config import ConfigError

    if cfg["dataset"] == "local":   # deployed nodes with their own data-path: nothing to ask
        return int(cfg["num-clients"])  # type: ignore[call-overload]
    timeout = float(cfg["timeout"])  # type: ignore[arg-type]
    first = wait_for_nodes(grid, 1, timeout)
    if not first:
        raise RuntimeError(f"no node connected within timeout={timeout:g}s (run config "
                           "'timeout'): start the SuperNodes, or raise timeout, and run again")
    # up to 3 nodes, more on a tie: one node's word about the engine is not trusted on its own
    ex = send_and_collect(grid, first[:3], RecordDict(), "query.fedclust_node", "engine",
                          timeout, validate=_node_info_ok)
    parts = _engine_majority(grid, ex, first, timeout)
    n = int(cfg["num-clients"])  # type: ignore[call-overload]
    if parts == 0:
        return n
    if cfg["dataset"] == "files":
        from fedclust.data.sites import check_sites

        check_sites(cfg, parts)
    if n and n != parts:
        raise ConfigError(
            f"run config 'num-clients' = {n} but the simulation engine has {parts} nodes "
            f"(every node is one of num-partitions={parts} partitions). Allowed: num-clients=0 "
            f"(as many clients as the engine has) or {parts}. Fix: pass --federation-config "
            f"'num-supernodes={n}' to flwr run, or num-clients=0")
    return parts


def _engine_majority(grid: Grid, ex: Exchange, connected: list[int], timeout: float) -> int:
    """The engine's node count the majority of the asked nodes reports (0: deployment).

    A simulation engine registers all its nodes at the start, so an honest simulated node
    says ``num-partitions`` = the connected nodes, and a deployed node says 0: any other
    answer is outside the possible range and excludes its sender. Of the possible answers,
    the majority decides and the minority is excluded; when the nodes asked disagree, every
    connected node is asked, and a tie that remains stops the run (which nodes are right
    cannot be told).
    """
    from fedclust.config import ConfigError

    possible = (0, len(connected))
    asked = list(ex.replies) + list(ex.failed)
    while True:
        said = {nid: int(r.metric_records["metrics"]["num-partitions"])
                for nid, r in ex.replies.items()}
        for nid, v in said.items():
            reject(ex, nid, None if v in possible else
                   f"it says the engine has num-partitions={v} nodes, but {len(connected)} are "
                   f"connected (possible answers: {len(connected)} in simulation, 0 in "
                   f"deployment)", "engine")
        votes = Counter(v for nid, v in said.items() if nid in ex.replies).most_common()
        tied = len(votes) > 1 and votes[0][1] == votes[1][1]
        more = [n for n in connected if n not in asked]
        if len(votes) < 2 or not more:      # agreement, or nobody left to ask
            break
        extra = send_and_collect(grid, more, RecordDict(), "query.fedclust_node", "engine",
                                 timeout, validate=_node_info_ok)
        asked += more
        ex.replies.update(extra.replies)
        ex.failed.update(extra.failed)
        ex.excluded.update(extra.excluded)
    if not votes:
        raise RuntimeError(
            f"no node said what the engine gave it: "
            f"{'; '.join(f'{node_name(n)}: {w}' for n, w in sorted(ex.failed.items()))}. "
            f"Fix: check the nodes' logs and fedclust versions, then run again")
    if tied:
        raise ConfigError(
            f"the nodes disagree about the engine with no majority: "
            f"{', '.join(f'{c} say num-partitions={v}' for v, c in votes)} ({len(connected)} "
            f"connected). Allowed: every node of a simulation says {len(connected)}, every "
            f"deployed node 0. Fix: check the nodes that answer otherwise (their fedclust "
            f"version, their node config), or remove them from the federation")
    parts = votes[0][0]
    for nid, v in said.items():
        if nid in ex.replies:
            reject(ex, nid, None if v == parts else
                   f"it says the engine has num-partitions={v} nodes, but {len(connected)} "
                   f"are connected and the majority of the nodes asked say {parts}", "engine")
    return parts


def _node_info_ok(content: RecordDict) -> str | None:
    if "metrics" not in content.metric_records or \
            "num-partitions" not in content.metric_records["metrics"]:
        return "no 'num-partitions'"
    value = content.metric_records["metrics"]["num-partitions"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return f"'num-partitions' = {value!r} is not a node count"
    return None


def _preflight(cfg: Mapping[str, Any]) -> bool:
    """EMD-CFL's ``preflight`` (false: a deployment whose nodes all read their data-path)."""
    from fedclust.config import setting
    from fedclust.emdcfl.keys import EMDCFLSettings

    return bool(setting(cfg, EMDCFLSettings.key_of("preflight")))


def connected_clients(grid: Grid, cfg: dict[str, object]) -> list[int]:
    """:func:`wait_for_nodes` for a run, refusing more nodes than a simulated partition has.

    With a shared dataset (any ``dataset`` but ``local``/``files``; for EMD-CFL, unless
    ``emdcfl.preflight=false`` says the nodes bring their own files) node ``i`` holds partition
    ``i`` of ``num-clients``: surplus nodes would hold nothing meaningful, so the run stops
    before any work and says how to match the engine to the run config. (Only nodes connected
    when ``num-clients`` are reached are seen: in deployment, later ones are not counted.)
    ``num-clients = 0`` (deployment): wait for ``min-clients`` nodes (at least one), then
    every connected node takes part, and ``cfg["num-clients"]`` is set to their number.
    A RuntimeError when no node connected within ``timeout``.
    """
    from fedclust.config import ConfigError, own_data

    n = int(cfg["num-clients"])  # type: ignore[call-overload]
    nodes = wait_for_nodes(grid, int(cfg["min-clients"]) or n or 1,  # type: ignore[call-overload]
                           float(cfg["timeout"]))  # type: ignore[arg-type]
    if not nodes:
        raise RuntimeError(f"no node connected within timeout={float(cfg['timeout']):g}s "  # type: ignore[arg-type]
                           "(run config 'timeout'): start the SuperNodes, or raise timeout, "
                           "and run again")
    if n == 0:
        nodes = sorted(grid.get_node_ids())
        cfg["num-clients"] = len(nodes)
        return nodes
    if len(nodes) < n and getattr(grid, "complete", False):
        raise ConfigError(
            f"run config 'num-clients' = {n} but the engine has {len(nodes)} node(s), all there "
            f"from the start: the run would wait 'timeout' for nodes that never come. Allowed: "
            f"num-clients=0 (every node) or {len(nodes)}. Fix: pass num-clients={len(nodes)} "
            f"(or one client array per client to simulate())")
    shared = not own_data(cfg) and not (cfg["method"] == "emdcfl" and not _preflight(cfg))
    if shared and len(nodes) > n:
        raise ConfigError(
            f"{len(nodes)} nodes are connected but run config 'num-clients' = {n}: every node "
            f"holds one of num-clients partitions of dataset {cfg['dataset']!r}. Allowed: at "
            f"most num-clients nodes. Fix: in simulation pass --federation-config "
            f"'num-supernodes={n}' (or num-clients={len(nodes)}); in deployment start {n} "
            f"SuperNodes, or give each node its own data with dataset=\"local\".")
    return nodes


def send_and_collect(
    grid: Grid,
    node_ids: Iterable[int],
    content: Content,
    message_type: str,
    group_id: str,
    timeout: float,
    validate: Validator | None = None,
) -> Exchange:
    """Send one message per node and collect the replies of this phase.

    Parameters
    ----------
    grid : Grid
    node_ids : iterable of int
    content : RecordDict or callable
        The same payload for all nodes, or ``node_id -> RecordDict`` for per-node payloads.
    message_type : str
        ``"<train|evaluate|query>.<action>"``.
    group_id : str
        Phase/round label (appears in Flower logs).
    timeout : float
        Seconds to wait for replies.
    validate : callable, optional
        ``reply_content -> error text | None``; a reply that fails is rejected and logged.

    Returns
    -------
    Exchange
        Replies from nodes that answered correctly; ``failed`` names every other node.
    """
    nodes = list(node_ids)
    t0 = time.perf_counter()
    out = Exchange()
    payloads: dict[int, RecordDict] = {}
    sizes: dict[int, int] = {}      # per payload object: most phases send one to every node
    for nid in nodes:
        payloads[nid] = payload = content(nid) if callable(content) else content
        if id(payload) not in sizes:
            sizes[id(payload)] = record_nbytes(payload)
        out.bytes_sent += sizes[id(payload)]    # the method's traffic, without the config
    answers, unmatched = _exchange(grid, payloads, message_type, group_id, timeout)
    lost = {nid for nid, reply in answers if reply.has_error()
            and reply.error.reason.startswith(CONFIG_MISSING)}
    if lost:   # nodes that lost the run's config (e.g. a restarted SuperNode): once more, whole
        LOG.info("[%s] %d node(s) lost the run config: sending it again", group_id, len(lost))
        again, more = _exchange(grid, {n: payloads[n] for n in nodes if n in lost},
                                message_type, group_id, timeout)
        answers = [(n, r) for n, r in answers if n not in lost] + again
        unmatched += more
        out.bytes_sent += sum(sizes[id(payloads[n])] for n in lost)
    # by node id, whatever the order of arrival: every server loop iterates ``replies`` (sums,
    # averages), and a float sum depends on the order of its terms
    for nid, reply in sorted(answers, key=lambda a: a[0]):
        if reply.has_error():
            out.failed[nid] = f"error reply: {node_text(reply.error.reason)}"
            continue
        try:
            problem = validate(reply.content) if validate is not None else None
        except Exception as exc:  # a reply malformed beyond what the validator anticipated
            problem = f"validator raised {type(exc).__name__}: {node_text(exc)}"
        if problem:
            _exclude(out, nid, problem, group_id)
            continue
        out.replies[nid] = reply.content
        out.bytes_received += record_nbytes(reply.content)
    out.seconds = time.perf_counter() - t0
    for nid in nodes:
        if nid not in out.replies and nid not in out.failed:
            out.failed[nid] = (f"no usable reply; SuperLink reported: {'; '.join(unmatched)}"
                               if unmatched else f"no reply within {timeout:.0f}s")
    for nid, why in out.failed.items():
        LOG.warning("[%s] %s dropped: %s", group_id, node_name(nid), why)
    return out


def _exchange(grid: Grid, payloads: Mapping[int, RecordDict], message_type: str, group_id: str,
              timeout: float) -> tuple[list[tuple[int, Message]], list[str]]:
    """Send ``payloads`` (node → content, with the run config) and return the replies matched
    to their node, in arrival order, and the reasons of error replies matched to no node."""
    # one content per payload and config record, shared by the messages that carry both
    shared: dict[tuple[int, bool], RecordDict] = {}
    messages = []
    for nid, payload in payloads.items():
        key = (id(payload), _holds_config(nid))
        if key not in shared:
            shared[key] = with_run_config(payload, nid)
        messages.append(Message(shared[key], dst_node_id=nid, message_type=message_type,
                                group_id=group_id))
    replies = list(grid.send_and_receive(messages, timeout=timeout)) if messages else []
    by_msg = {m.metadata.message_id: m.metadata.dst_node_id for m in messages}
    answers: list[tuple[int, Message]] = []
    unmatched: list[str] = []
    for reply in replies:
        # SuperLink-generated error replies carry src_node_id 1: map through reply_to instead.
        nid = by_msg.get(reply.metadata.reply_to_message_id)
        if nid is None:
            if reply.has_error():
                unmatched.append(node_text(reply.error.reason))
            continue
        answers.append((nid, reply))
    ok = {nid for nid, reply in answers if not reply.has_error()}
    config_answered(ok, set(payloads) - ok)
    return answers, unmatched


def require_honest(ex: Exchange, phase: str, contributions: int, asked: int,
                   common: CommonSettings) -> None:
    """Stop the run when excluded replies left phase ``phase`` fewer honest contributions than
    it needs: ``common.min_clients`` (run config ``min-clients``; 0: one), at most the
    ``asked`` nodes.

    Only exclusions trigger it: a phase that lost nodes to dropouts alone goes on with the
    others as before (each method says what it does with no reply at all).

    Raises
    ------
    RuntimeError
        Names the phase, the counts and every excluded node with its reason.
    """
    if not ex.excluded:
        return
    floor = max(1, min(common.min_clients or 1, asked))
    if contributions >= floor:
        return
    who = "; ".join(f"{node_name(n)}: {why.removeprefix('rejected reply: ')}"
                    for n, why in sorted(ex.excluded.items()))
    need = (f"run config min-clients = {common.min_clients}" if common.min_clients
            else "at least one")
    raise RuntimeError(
        f"{common.method}: phase '{phase}' kept {contributions} honest "
        f"contribution(s) of the {asked} node(s) asked, fewer than it needs ({need}), after "
        f"excluding replies that failed the server's checks — {who}. The result would rest "
        f"on too few nodes, so the run stops. Fix: check the named node(s) (their data, their "
        f"fedclust version, whether they can be trusted) or remove them from the federation, "
        f"then run again.")


# ----------------------------------------------------------------------------------------------
# Record builders / readers

arrays = array_record


def read_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: to_numpy(v) for k, v in record.items()}


def result_record(run_dir: object) -> ConfigRecord:
    """Config record ``"result"`` of a final message: the run's results folder.

    A simulated client writes its owner's results under ``<run-dir>/clients/<partition-id>/``;
    a deployed node ignores it and uses its own node config (``client_apps.results``).
    """
    return ConfigRecord({"run-dir": str(run_dir)})


def config_record(values: Mapping[str, object]) -> ConfigRecord:
    return ConfigRecord(dict(values))


def metric_record(values: Mapping[str, float | int]) -> MetricRecord:
    return MetricRecord(dict(values))
