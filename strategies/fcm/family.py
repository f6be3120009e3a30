"""The phases both FCM-family methods share, over Flower messages: federated scaling (the
clients' statistics, with the feature-count vote) and the final phase."""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

import numpy as np
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedclust.common import CommonSettings
from fedclust.fcm.keys import FamilySettings
from fedclust.fcm.phases import Client, FinalStats, NodeStats, Replies, Scaling
from fedclust.results import RunRecorder
from strategies.common import (
    Exchange,
    check_each,
    node_name,
    reject,
    require_honest,
    result_record,
    send_and_collect,
)
from strategies.wire import fcm as wire
from strategies.wire.replies import above_others, beyond_others


def replies(ex: Exchange, got: dict[Client, Any], withheld: list[Client]) -> Replies:
    """A phase's :class:`~fedclust.fcm.phases.Replies` from its Flower exchange."""
    return Replies(got=got, withheld=withheld, failed=dict(ex.failed),
                   excluded=dict(ex.excluded), seconds=ex.seconds, bytes_sent=ex.bytes_sent,
                   bytes_received=ex.bytes_received)


class FamilyClients:
    """The clients of an FCM-family run over Flower messages: the phases both methods share.

    Parameters
    ----------
    grid : Grid
    nodes : list of int
        The run's nodes (:func:`strategies.common.connected_clients`), sorted.
    common : CommonSettings
        The run's common settings (``timeout``, ``min_clients``).
    s : FamilySettings
        The method's settings.
    run_dir : str
        The run's folder (the final message names it: a simulated node keeps its owner's
        results below it).
    """

    #: whether the final phase brings the evaluation tables (exact FCM; FedFCM's come with
    #: the index phase)
    final_tables: ClassVar[bool] = True

    def __init__(self, grid: Grid, nodes: list[int], common: CommonSettings,
                 s: FamilySettings, run_dir: str) -> None:
        self.grid, self.ids, self.common, self.s = grid, list(nodes), common, s
        self.timeout = common.timeout
        self.excluded: dict[int, str] = {}     # nodes whose scaling reply the server refused
        self.run_dir = run_dir
        self.column_digest = 0      # the majority's digest of the feature column names

    def name(self, client: Client) -> str:
        return node_name(client)  # type: ignore[arg-type]

    def statistics(self) -> Replies[NodeStats]:
        """Phase 0: clients send bounds (and, for standard scaling, counts/means/M2). A node
        whose feature count differs from the majority's is excluded."""
        check = wire.check_stats(self.s.scaling == "standard", self.s.privacy_guard,
                                 self.s.hides_rows)
        ex = send_and_collect(self.grid, self.ids, wire.stats_request(), wire.STATS, "scaling",
                              self.timeout, validate=check)
        speaking = {nid: c for nid, c in ex.replies.items() if "stats" in c.array_records}
        withheld = [nid for nid in ex.replies if nid not in speaking]
        dims = {nid: wire.n_features(c) for nid, c in speaking.items()}
        votes = Counter(dims.values()).most_common()
        if len(votes) > 1 and votes[0][1] == votes[1][1]:
            raise RuntimeError(f"the clients disagree on the number of features with no "
                               f"majority (features: clients = {dict(votes)}). Fix: check "
                               f"every node's data and give every node the same features")
        if votes:
            common = votes[0][0]
            for nid, d in dims.items():
                if reject(ex, nid, None if d == common else
                          f"{d} features where the other clients have {common}", "scaling"):
                    del speaking[nid]
        # the same column names in the same order (a file with its columns in another order
        # would be summed position by position): the majority's digest decides, and once it
        # names columns, a node that sends none (0) fails the check like one that differs
        digests = {nid: wire.column_digest(speaking[nid]) for nid in speaking}
        names = Counter(g for g in digests.values() if g).most_common()
        if len(names) > 1 and names[0][1] == names[1][1]:
            raise RuntimeError(f"the clients' data files name their columns differently (or "
                               f"in another order) with no majority ({len(digests)} nodes, "
                               f"{len(names)} different headers). Fix: give every node's "
                               f"file the same columns in the same order")
        unnamed = sum(1 for g in digests.values() if not g)
        majority = names[0][0] if names and names[0][1] >= unnamed else 0
        self.column_digest = majority
        for nid, g in digests.items():
            if majority and g != majority:
                why = ("its data file's feature columns differ from the other nodes' (names or "
                       "order): reorder or rename its columns as the others'" if g else
                       "it sent no digest of its feature column names while the majority's "
                       "files name their columns, so its column order cannot be checked: give "
                       "its file the same header row as the others'")
            elif not majority and g and names[0][0] != g:
                why = ("its data file's feature columns differ from the other named nodes' "
                       "(names or order): reorder or rename its columns as the others'")
            else:
                why = None
            if reject(ex, nid, why, "scaling"):
                del speaking[nid]
        got = {nid: wire.read_stats(c) for nid, c in speaking.items()}
        # every value bounded by what the other nodes' values imply, not only by a fixed cap
        across = {**above_others({n: st.rows for n, st in got.items() if st.rows is not None},
                                 "metrics.rows"),
                  **beyond_others({n: st.stats.min for n, st in got.items()},
                                  {n: st.stats.max for n, st in got.items()}, "stats")}
        for nid, why in sorted(across.items()):
            reject(ex, nid, why, "scaling")
            del speaking[nid], got[nid]
        require_honest(ex, "scaling", len(speaking), len(self.ids), self.common)
        self.excluded.update(ex.excluded)
        return replies(ex, got, withheld)

    def send(self, nodes: list[int], content: RecordDict, message_type: str, phase: str
             ) -> Exchange:
        """:func:`send_and_collect` to ``nodes`` but those excluded in the scaling phase: they
        count as failed with that reason, unasked (their later statistics could not be
        checked against a row count, and a node of another width could not use the centers)."""
        skip = [n for n in nodes if n in self.excluded]
        ex = send_and_collect(self.grid, [n for n in nodes if n not in self.excluded], content,
                              message_type, phase, self.timeout)
        for n in skip:
            ex.failed[n] = f"not asked: its scaling reply was excluded ({self.excluded[n]})"
        return ex

    def final(self, centers: np.ndarray, sc: Scaling) -> FinalStats:
        """The final phase: every node's objective share (and, with :attr:`final_tables` on
        the evaluation path, its label × cluster table); each keeps its owner's results."""
        content = wire.centers_request(centers, sc.shift, sc.scale, result_record(self.run_dir))
        ex = self.send(self.ids, content, wire.FINAL, "final")
        with_eval = self.final_tables and self.s.evaluate
        check_each(ex, wire.check_final(centers.shape[0], sc.box, sc.rows,
                                        self.s.guard_bound(sc.n_features), with_eval), "final")
        shares = {nid: j for nid, r in ex.replies.items()
                  if (j := wire.read_objective(r)) is not None}
        require_honest(ex, "final", len(shares), len(self.ids), self.common)
        tables = ([t for r in ex.replies.values() if (t := wire.read_eval(r)) is not None]
                  if with_eval else [])
        withheld = [nid for nid in ex.replies if nid not in shares]
        return FinalStats(float(sum(shares.values())), replies(ex, shares, withheld),
                          withheld=len(withheld), tables=tables, eval_nodes=len(tables),
                          eval_rows=sum(int(t.sum()) for _, t in tables))


def record_features(recorder: RunRecorder, cfg: dict[str, Any], clients: FamilyClients) -> None:
    """``features.json`` of the run's folder: what the run knows of its feature columns, for
    ``fedclust predict`` to match new rows by name — the names where the server holds the files
    (``dataset="files"``), else the digest of the names the majority of the nodes declared (the
    names never leave a deployed node). Nothing is written when the nodes named no columns."""
    digest = clients.column_digest
    if not digest:
        return
    out: dict[str, Any] = {"digest": digest}
    if cfg["dataset"] == "files":
        from fedclust.data.local import feature_names, names_digest
        from fedclust.data.sites import site_files

        for path in site_files(cfg["data-dir"]):
            names = feature_names(str(path), cfg["files.format"], cfg["files.label-column"])
            if names and names_digest(names) == digest:
                out["names"] = names
                break
    recorder.save_json("features", out)
