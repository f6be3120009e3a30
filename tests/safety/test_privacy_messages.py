"""Every message a client sends, in every method: no raw samples, no labels.

Each method runs end to end through the real ServerApp loop and ClientApp handlers on the
in-process grid; ``inspect`` sees every reply. A reply fails the test if any array (or bytes
value) contains one of the sending client's samples as a row (float64 or float32, to a relative
1e-6) — raw, or scaled the way FCM/FedFCM clients scale it (with the exact shift/scale the server
sent, and with the client's own min-max and standard scaling), or divided by 255 (the image input
of the EMD-CFL and FedCRef models) — or any contiguous window of
8 or more of its ground-truth labels (windows with at least 3 distinct labels; shorter or
near-constant runs match counts and accept bits by chance). Numbers written into strings of
a ConfigRecord (e.g. ``"0.1,0.7,…"`` or a JSON list) are parsed and checked too. A method whose
handler module is missing fails the test (it is listed in the registry, so it must exist).
Exact FCM under SecAgg+ must, in addition, send no plain arrays at all: only SecAgg+ key
material and masked integer vectors.
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord

from tests.fake_grid import run_server

NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def _values(msg: Message) -> list[np.ndarray]:
    """Every numeric payload of a message as numpy arrays (see :func:`record_values`)."""
    if not msg.has_content():
        return []
    return [a for rec in msg.content.values() for a in record_values(rec)]


def record_values(rec: ArrayRecord | ConfigRecord | MetricRecord) -> list[np.ndarray]:
    """Numeric payloads of one record: arrays, numeric lists, bytes (as float64/float32), and
    the numbers written in strings (each string, and a list of strings, parsed in order)."""
    out: list[np.ndarray] = []
    if isinstance(rec, ArrayRecord):
        return [a.numpy() for a in rec.values()]
    for v in rec.values():
        items = v if isinstance(v, list) else [v]
        nums = [x for x in items if isinstance(x, (int, float)) and not isinstance(x, bool)]
        if len(nums) > 1:
            out.append(np.asarray(nums, dtype=np.float64))
        texts = [x for x in items if isinstance(x, str)]
        parsed = [float(t) for x in texts for t in NUMBER.findall(x)]
        if len(parsed) > 1:
            out.append(np.asarray(parsed, dtype=np.float64))
        for b in (x for x in items if isinstance(x, bytes) and len(x) >= 8):
            for dt in (np.float64, np.float32):
                usable = len(b) // np.dtype(dt).itemsize * np.dtype(dt).itemsize
                out.append(np.frombuffer(b[:usable], dtype=dt))
    return out


def scaled_views(x: np.ndarray, transforms: Sequence[tuple[np.ndarray, np.ndarray]] = ()
                 ) -> list[np.ndarray]:
    """``x`` as it may exist on the client: raw, divided by 255 (image pixels as the EMD-CFL /
    FedCRef models see them), with each ``(shift, scale)`` the server sent (exactly as the
    FCM/FedFCM handlers apply it), and min-max / standard scaled locally."""
    from fedclust.data import scaling

    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    views = [x, x / 255.0]
    for shift, scale in transforms:
        if np.size(shift) == x.shape[1]:
            views.append(scaling.apply(x, shift, scale))
    st = scaling.column_stats(x)
    views += [scaling.apply(x, *scaling.scaler(st, kind)) for kind in ("minmax", "standard")]
    return views


def _row_hits(rows: np.ndarray, view: np.ndarray, rtol: float = 1e-6) -> bool:
    """Whether any of ``rows`` equals a row of ``view`` to a relative ``rtol`` (float32 copies
    of a row match too). Rows that are constant (e.g. all zeros) are ignored."""
    rows = rows[np.ptp(rows, axis=1) > 0] if rows.shape[1] > 1 else rows[rows[:, 0] != 0]
    if not len(rows):
        return False
    atol = 1e-9 * max(1.0, float(np.abs(view).max(initial=0.0)))
    # pre-filter on the most varied column, then compare whole rows
    col = int(np.argmax([np.unique(view[:, j]).size for j in range(view.shape[1])]))
    order = np.argsort(view[:, col], kind="stable")
    key = view[order, col]
    for r in rows:
        tol = atol + rtol * abs(r[col])
        lo, hi = np.searchsorted(key, r[col] - tol), np.searchsorted(key, r[col] + tol, "right")
        if hi > lo:
            cand = view[order[lo:hi]]
            if np.any(np.all(np.abs(cand - r) <= atol + rtol * np.abs(cand), axis=1)):
                return True
    return False


WINDOW = 8


def _label_windows(y: np.ndarray) -> set[bytes]:
    yy = np.ascontiguousarray(y.astype(np.int64).ravel())
    if yy.size < WINDOW:
        return set()
    win = np.lib.stride_tricks.sliding_window_view(yy, WINDOW)
    return {w.tobytes() for w in win if np.unique(w).size >= 3}


def leaks(values: list[np.ndarray], x: np.ndarray, y: np.ndarray | None,
          transforms: Sequence[tuple[np.ndarray, np.ndarray]] = ()) -> list[str]:
    """Which of ``values`` contain a sample row of ``x`` (raw or scaled, see
    :func:`scaled_views`) or a window of ``WINDOW``+ consecutive labels of ``y``."""
    views = scaled_views(x, transforms)
    d = views[0].shape[1]
    windows = _label_windows(y) if y is not None else set()
    found = []
    for arr in values:
        flat = np.ascontiguousarray(arr).ravel()
        if flat.dtype.kind in "fiu" and flat.size >= d and flat.size % d == 0:
            rows = flat.astype(np.float64).reshape(-1, d)
            finite = rows[np.all(np.isfinite(rows), axis=1)]
            for i, view in enumerate(views):
                if len(finite) and _row_hits(finite, view):
                    found.append(f"sample row ({'raw' if i == 0 else 'scaled'}) in array of "
                                 f"shape {arr.shape}")
                    break
        if windows and flat.dtype.kind in "fiu" and flat.size >= WINDOW:
            ints = flat
            if flat.dtype.kind == "f":
                ok = np.isfinite(flat) & (np.abs(flat) < 2**31)
                ints = flat[ok] if np.all(ok) and np.all(flat == np.round(flat)) else None
            if ints is not None:
                win = np.lib.stride_tricks.sliding_window_view(
                    np.ascontiguousarray(ints.astype(np.int64)), WINDOW)
                if any(w.tobytes() in windows for w in win):
                    found.append(f"labels (a window of {WINDOW}+) in array of shape {arr.shape}")
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
    "exact-fcm-incremental": ({**FCM, "method": "exact-fcm", "fcm.max-rounds": 3,
                               "fcm.fraction": 0.6, "fcm.incremental": True}, _fcm_data, ""),
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
    assert not module or importlib.util.find_spec(module) is not None, \
        f"{name}: handler module {module} is missing"
    replies: list[Message] = []
    summary, grid = run_server({**cfg, "output-dir": str(tmp_path)},
                               inspect=lambda ins, rep: replies.append(rep), keep_sent=True)
    assert replies, "no client message was inspected"
    from fedclust.config import validate

    full = validate({**cfg, "output-dir": str(tmp_path)})
    data = {nid: loader(ctx, full) for nid, ctx in grid.contexts.items()}
    sent_by = {m.metadata.message_id: m.metadata.dst_node_id for m in grid.sent}
    # the exact (shift, scale) FCM/FedFCM clients were told to apply
    transforms = {(rec["shift"].numpy().tobytes(), rec["scale"].numpy().tobytes()):
                  (rec["shift"].numpy(), rec["scale"].numpy())
                  for m in grid.sent if m.has_content()
                  for key, rec in m.content.array_records.items()
                  if key == "scaling" and "shift" in rec and "scale" in rec}
    if name in ("exact-fcm", "fedfcm"):
        assert transforms, "no scaling was sent: the scaled-row check would be vacuous"
    problems = []
    for rep in replies:
        nid = sent_by[rep.metadata.reply_to_message_id]
        values = _values(rep)
        for x, y in data[nid]:
            problems += [f"{rep.metadata.message_type} from {nid}: {p}"
                         for p in leaks(values, x, y, list(transforms.values()))]
    assert not problems, problems[:5]
    if name == "exact-fcm-secagg":
        train = [r for r in replies if r.metadata.message_type == "train"]
        assert len(train) == 4 * 3 * (2 + 1)   # 4 SecAgg+ stages x 3 clients x (2 rounds + final)
        for r in train:
            assert all(len(rec) == 0 for rec in r.content.array_records.values()), \
                "a plain array left the client under secure aggregation"
        assert not any(r.metadata.message_type == "query.fcm_sums" for r in replies)


def test_the_detector_catches_a_leak():
    """The checks above can fail: a reply carrying a sample row (raw, float32, scaled by the
    server's transform or locally) or a window of the labels is flagged; aggregates are not."""
    from fedclust.data import scaling

    rng = np.random.default_rng(0)
    x, y = rng.random((50, 3)) * 40 - 7, rng.permutation(np.tile(np.arange(5), 10))
    shift, scale = x.min(0) - 1.5, x.max(0) - x.min(0) + 3.0     # a federated min-max
    assert leaks([np.vstack([np.zeros((2, 3)), x[7:8]])], x, y)
    assert leaks([x[3].astype(np.float32)], x, y)
    assert leaks([scaling.apply(x[11:12], shift, scale)], x, y, [(shift, scale)])
    assert leaks([scaling.apply(x[11:12], shift, scale).astype(np.float32)], x, y,
                 [(shift, scale)])
    assert not leaks([scaling.apply(x[11:12], shift, scale)], x, y)   # transform unknown
    local_minmax = (x - x.min(0)) / (x.max(0) - x.min(0))
    local_standard = (x - x.mean(0)) / x.std(0)
    assert leaks([local_minmax[20]], x, y)
    assert leaks([local_standard[30:33]], x, y)
    assert leaks([y[:20].astype(np.int32)], x, y)                      # a prefix
    assert leaks([np.concatenate([[7, 7, 7], y[23:31], [9]])], x, y)   # a window of 8 inside
    assert leaks([y[10:30].astype(np.float64)], x, y)                  # labels as floats
    assert not leaks([y[23:30]], x, y)                                 # 7 < 8 labels
    assert not leaks([x.mean(axis=0), np.bincount(y), x[5] + 1e-3], x, y)
    pixels = rng.integers(0, 256, size=(20, 16)).astype(np.float64)
    assert leaks([(pixels[4] / 255.0).astype(np.float32)], pixels, None)     # model input
    assert not leaks([pixels.mean(axis=0) / 255.0], pixels, None)
    text = ConfigRecord({"row": ",".join(f"{v:.17g}" for v in x[9]),
                         "json": [f"[{y[40]}, {y[41]}, {y[42]}]", str(y[43:48].tolist())]})
    values = record_values(text)
    assert leaks(values[:1], x, y)                                           # "0.1,0.7,…"
    assert leaks(values[1:], x, y)                                           # labels in text
    assert not leaks(record_values(ConfigRecord({"note": "round 3 of 10, 2 clients"})), x, y)


def test_what_the_incremental_mode_keeps_on_the_server(tmp_path, monkeypatch):
    """``fcm.incremental`` stores, per client, its latest ``U`` (C) and ``WS`` (C × F) — exactly
    the sums that client sent in the last round it answered, which the plain mode sees too —
    and the round they came from, plus the centers the server itself broadcast; nothing with a
    row per sample, and no sample row or label window of any client."""
    from fedclust.fcm import incremental

    stores: list[incremental.LatestSums] = []

    class Recording(incremental.LatestSums):
        def __init__(self, *args: Any) -> None:
            super().__init__(*args)
            stores.append(self)

    monkeypatch.setattr(incremental, "LatestSums", Recording)
    cfg = {**FCM, "method": "exact-fcm", "num-clients": 4, "fcm.fraction": 0.5,
           "fcm.max-rounds": 6, "fcm.epsilon": 0.0, "fcm.incremental": True,
           "output-dir": str(tmp_path)}
    latest: dict[int, tuple[int, np.ndarray, np.ndarray]] = {}

    def inspect(msg: Message, rep: Message) -> None:
        if msg.metadata.message_type == "query.fcm_sums" and "sums" in rep.content.array_records:
            rnd = int(msg.metadata.group_id.split("-")[1])
            sums = rep.content.array_records["sums"]
            latest[msg.metadata.dst_node_id] = (rnd, sums["U"].numpy(), sums["WS"].numpy())

    _, grid = run_server(cfg, inspect=inspect, keep_sent=True)
    assert len(stores) == 1 and latest
    store = stores[0]
    c, f = 4, 2
    assert set(vars(store)) == {"n_clusters", "n_features", "_u", "_ws", "_round", "_sent"}
    kept = store.arrays()
    assert set(kept) == ({f"{k}/{nid}" for nid in latest for k in ("U", "WS", "round")}
                         | {f"sent/{r}" for r in {rnd for rnd, _, _ in latest.values()}})
    for nid, (rnd, u, ws) in latest.items():
        np.testing.assert_array_equal(kept[f"U/{nid}"], u)      # what the node sent, no more
        np.testing.assert_array_equal(kept[f"WS/{nid}"], ws)
        assert kept[f"round/{nid}"].tolist() == [rnd]
    broadcast = {int(m.metadata.group_id.split("-")[1]): m.content.array_records["centers"][
        "centers"].numpy() for m in grid.sent if m.metadata.message_type == "query.fcm_sums"}
    for key, arr in kept.items():
        if key.startswith("sent/"):
            np.testing.assert_array_equal(arr, broadcast[int(key.split("/")[1])])
        assert arr.shape in {(c,), (c, f), (1,)}, f"{key}: shape {arr.shape} is per row"
    from fedclust.config import validate

    full = validate(cfg)
    transforms = [(rec["shift"].numpy(), rec["scale"].numpy()) for m in grid.sent
                  if m.has_content() and "scaling" in m.content.array_records
                  for rec in [m.content.array_records["scaling"]]]
    assert transforms
    for nid, ctx in grid.contexts.items():
        for x, y in _fcm_data(ctx, full):
            assert not leaks(list(kept.values()), x, y, transforms), nid
