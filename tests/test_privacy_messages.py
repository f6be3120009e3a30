"""Every message a client sends, in every method: no raw samples, no labels.

Each method runs end to end through the real ServerApp loop and ClientApp handlers on the
in-process grid; ``inspect`` sees every reply. A reply fails the test if any array (or bytes
value) contains one of the sending client's samples as a row (float64 or float32), or its
ground-truth label vector (or a 16+-long prefix of it with at least 3 distinct labels).
Exact FCM under SecAgg+ must, in addition, send no plain arrays at all: only SecAgg+ key
material and masked integer vectors.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from tests.fake_grid import run_server


def _values(msg: Message) -> list[np.ndarray]:
    """Every numeric payload of a message as numpy arrays (arrays, bytes, numeric lists)."""
    out: list[np.ndarray] = []
    if not msg.has_content():
        return out
    for rec in msg.content.values():
        if isinstance(rec, ArrayRecord):
            out += [a.numpy() for a in rec.values()]
        elif isinstance(rec, (ConfigRecord, MetricRecord)):
            for v in rec.values():
                items = v if isinstance(v, list) else [v]
                nums = [x for x in items if isinstance(x, (int, float)) and
                        not isinstance(x, bool)]
                if len(nums) > 1:
                    out.append(np.asarray(nums, dtype=np.float64))
                for b in (x for x in items if isinstance(x, bytes) and len(x) >= 8):
                    for dt in (np.float64, np.float32):
                        usable = len(b) // np.dtype(dt).itemsize * np.dtype(dt).itemsize
                        out.append(np.frombuffer(b[:usable], dtype=dt))
    return out


def _row_set(x: np.ndarray) -> tuple[int, set[bytes]]:
    x = x.reshape(len(x), -1)
    rows = {r.tobytes() for r in x.astype(np.float64)} | {r.tobytes() for r in
                                                           x.astype(np.float32)}
    return x.shape[1], rows


def leaks(values: list[np.ndarray], x: np.ndarray, y: np.ndarray | None) -> list[str]:
    """Which of ``values`` contain a sample row of ``x`` or the labels ``y``."""
    d, rows = _row_set(x)
    found = []
    for arr in values:
        flat = np.ascontiguousarray(arr).ravel()
        for dt in (np.float64, np.float32):
            a = flat.astype(dt) if flat.dtype.kind in "fiu" else flat
            if a.size >= d and a.size % d == 0:
                hit = [r for r in a.reshape(-1, d) if r.tobytes() in rows and np.any(r != 0)]
                if hit:
                    found.append(f"sample row in array of shape {arr.shape}")
                    break
        if y is not None and y.size >= 16 and flat.dtype.kind in "fiu" and flat.size >= 16:
            yy = y.astype(np.int64).ravel()
            # a prefix with >= 3 distinct labels (booleans/constant runs match by chance)
            if (flat.size <= yy.size and np.unique(yy[: flat.size]).size >= 3
                    and np.array_equal(flat.astype(np.int64), yy[: flat.size])):
                found.append(f"labels in array of shape {arr.shape}")
    return found


# --- how each method's client data are read (the node's own loader) ------------------------

def _fcm_data(ctx: Context, cfg: dict) -> list[tuple[np.ndarray, np.ndarray | None]]:
    from client_apps.data import load_client_data

    data = load_client_data(ctx, {**cfg, "evaluate": True})
    return [(data.x, data.y_eval)]


def _fedcref_data(ctx: Context, cfg: dict) -> list[tuple[np.ndarray, np.ndarray | None]]:
    from client_apps.fedcref_handlers import _data

    x, y, _ = _data(ctx, {**cfg, "evaluate": True})
    return [(x, y)]


def _emdcfl_data(ctx: Context, cfg: dict) -> list[tuple[np.ndarray, np.ndarray | None]]:
    from client_apps.emdcfl_handlers import client_data

    s = client_data(ctx, cfg)
    return [(s.x_train, s.y_train), (s.x_val, s.y_val), (s.x_test, s.y_test)]


FCM = {"num-clients": 3, "seed": 4, "plots": False}
METHODS: dict[str, tuple[dict[str, Any], Callable, str]] = {
    "exact-fcm": ({**FCM, "method": "exact-fcm", "fcm.max-rounds": 3}, _fcm_data, ""),
    "exact-fcm-secagg": ({**FCM, "method": "exact-fcm", "fcm.max-rounds": 2,
                          "fcm.secure-aggregation": True}, _fcm_data, ""),
    "fedfcm": ({**FCM, "method": "fedfcm", "fedfcm.k-min": 2, "fedfcm.k-max": 3,
                "fedfcm.max-rounds": 2}, _fcm_data, ""),
    "fedcref": ({"method": "fedcref", "dataset": "digits", "num-clients": 3, "seed": 0,
                 "fedcref.split": "all", "fedcref.fl-rounds": 2, "fedcref.fl-local-epochs": 1,
                 "fedcref.batch-size": 16, "fedcref.ae-epochs": 3, "fedcref.ae-patience": 0,
                 "fedcref.max-iterations": 1, "fedcref.k-max": 3,
                 "fedcref.samples-per-cluster": 30, "plots": False},
                _fedcref_data, "client_apps.fedcref_handlers"),
    "emdcfl": ({"method": "emdcfl", "dataset": "rotdigits", "emdcfl.rotation": "two",
                "num-clients": 4, "emdcfl.samples": 120, "emdcfl.test-samples": 30,
                "emdcfl.rounds": 2, "emdcfl.local-epochs": 1, "emdcfl.conv1": 4,
                "emdcfl.conv2": 8, "emdcfl.embed-dim": 16, "emdcfl.workers": 1, "seed": 0,
                "plots": False},
               _emdcfl_data, "client_apps.emdcfl_handlers"),
}


@pytest.mark.parametrize("name", list(METHODS))
def test_no_client_message_contains_samples_or_labels(tmp_path, name):
    cfg, loader, module = METHODS[name]
    if module and importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} not implemented yet")
    replies: list[Message] = []
    summary, grid = run_server({**cfg, "output-dir": str(tmp_path)},
                               inspect=lambda ins, rep: replies.append(rep), keep_sent=True)
    assert replies, "no client message was inspected"
    from fedclust.config import validate

    full = validate({**cfg, "output-dir": str(tmp_path)})
    data = {nid: loader(ctx, full) for nid, ctx in grid.contexts.items()}
    sent_by = {m.metadata.message_id: m.metadata.dst_node_id for m in grid.sent}
    problems = []
    for rep in replies:
        nid = sent_by[rep.metadata.reply_to_message_id]
        values = _values(rep)
        for x, y in data[nid]:
            problems += [f"{rep.metadata.message_type} from {nid}: {p}"
                         for p in leaks(values, x, y)]
    assert not problems, problems[:5]
    if name == "exact-fcm-secagg":
        train = [r for r in replies if r.metadata.message_type == "train"]
        assert len(train) == 4 * 3 * 2      # 4 SecAgg+ stages x 3 clients x 2 rounds
        for r in train:
            assert all(len(rec) == 0 for rec in r.content.array_records.values()), \
                "a plain array left the client under secure aggregation"
        assert not any(r.metadata.message_type == "query.fcm_sums" for r in replies)


def test_the_detector_catches_a_leak():
    """The checks above can fail: a reply carrying a sample row or the labels is flagged."""
    rng = np.random.default_rng(0)
    x, y = rng.random((50, 3)), np.tile(np.arange(5), 10)
    assert leaks([np.vstack([np.zeros((2, 3)), x[7:8]])], x, y)
    assert leaks([x[3].astype(np.float32)], x, y)
    assert leaks([y[:20].astype(np.int32)], x, y)
    assert not leaks([x.mean(axis=0), np.bincount(y)], x, y)
