"""Corrupting one node's replies, for the hostile-node tests (tests/safety/test_hostile_nodes.py).

A :class:`Hostile` ClientApp wraps the real one: node :data:`BAD` computes its honest reply,
then one field of it (an array of an ArrayRecord or a value of a MetricRecord) is replaced by a
corrupted copy — one of :data:`KINDS` — before the server sees it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flwr.app import Array, Message, RecordDict

from client_apps.app import app as client_app

BAD = 1000                     # node 0 of the in-process grid
KINDS = ("nan", "+inf", "-inf", "1e300", "x1e6", "negative", "shape", "empty")


def corrupt_array(a: np.ndarray, kind: str) -> np.ndarray:
    """``a`` corrupted the way ``kind`` says (a float copy where the value needs one)."""
    a = np.asarray(a)
    real = a.dtype if a.dtype.kind == "f" else np.float64
    if kind in ("nan", "+inf", "-inf", "1e300"):
        value = {"nan": np.nan, "+inf": np.inf, "-inf": -np.inf, "1e300": 1e300}[kind]
        with np.errstate(over="ignore"):
            return np.full(a.shape, value).astype(real)
    if kind == "x1e6":
        with np.errstate(over="ignore"):
            return (a.astype(real) * 1e6).astype(real if a.dtype.kind in "fu" else a.dtype)
    if kind == "negative":
        signed = a.dtype if a.dtype.kind in "fi" else np.float64
        return -(np.abs(a.astype(signed)) + 1).astype(signed)
    if kind == "shape":
        return np.zeros(a.shape + (2,), a.dtype)
    if kind == "empty":
        return np.zeros((0,) + a.shape[1:], a.dtype)
    raise ValueError(kind)


def corrupt_value(value: object, kind: str) -> object:
    """A MetricRecord value corrupted (``shape``: a list; ``empty``: see :func:`corrupt`)."""
    if kind in ("nan", "+inf", "-inf", "1e300"):
        return {"nan": float("nan"), "+inf": float("inf"), "-inf": float("-inf"),
                "1e300": 1e300}[kind]
    if kind == "x1e6":
        return value * 10**6 if isinstance(value, int) else value * 1e6
    if kind == "negative":
        return -(abs(value) + 1)
    if kind == "shape":
        return [value, value]
    raise ValueError(kind)


def corrupt(content: RecordDict, record: str, key: str, kind: str) -> bool | None:
    """Corrupt field ``record.key`` of ``content`` in place (``key`` ``"*"``: the record's
    first key). None when the reply has no such field, False when the corruption left the
    value as it was (``x1e6`` of 0), else True."""
    if record in content.array_records:
        rec = content.array_records[record]
        key = sorted(rec)[0] if key == "*" and len(rec) else key
        if key not in rec:
            return None
        before = rec[key].numpy()
        after = corrupt_array(before, kind)
        rec[key] = Array(np.ascontiguousarray(after))
        return not (after.shape == before.shape and after.dtype == before.dtype
                    and np.array_equal(after, before))
    if record in content.metric_records:
        rec = content.metric_records[record]
        key = sorted(rec)[0] if key == "*" and len(rec) else key
        if key not in rec:
            return None
        if kind == "empty":
            del rec[key]
            return True
        before = rec[key]
        rec[key] = corrupt_value(before, kind)
        return not (type(rec[key]) is type(before) and rec[key] == before)
    return None


@dataclass
class Hostile:
    """ClientApp: the ``nodes`` (default node :data:`BAD`) corrupt field ``record.key`` of
    their ``message_type`` replies with ``kind``; ``hits`` counts the corrupted replies,
    ``changed`` those whose value the corruption actually changed."""

    message_type: str
    record: str
    key: str
    kind: str
    nodes: frozenset[int] = frozenset({BAD})
    hits: int = 0
    changed: int = 0

    def __call__(self, msg: Message, context) -> Message:
        rep = client_app(msg, context)
        if (context.node_id in self.nodes and msg.metadata.message_type == self.message_type
                and not rep.has_error()):
            done = corrupt(rep.content, self.record, self.key, self.kind)
            self.hits += done is not None
            self.changed += bool(done)
        return rep


def silent(message_type: str):
    """``drop`` of an InProcessGrid: node :data:`BAD` never answers ``message_type``."""
    return lambda nid, msg: nid == BAD and msg.metadata.message_type == message_type


__all__ = ["BAD", "KINDS", "Hostile", "corrupt", "silent"]
