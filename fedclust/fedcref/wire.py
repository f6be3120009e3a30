"""How FedCRef's autoencoders travel: the number format of model weights in messages.

``fedcref.wire`` (every model a message carries: the cluster models a client uploads, the
foreign models relayed for cross-evaluation, the community models of each FedAvg round in
both directions, and those sent for refinement):

- ``float32``: the weights as trained (4 bytes per weight).
- ``float16``: half precision (2 bytes).
- ``int8``: each weight matrix ``W_l`` (models × in × out) as 8-bit integers with one float32
  scale per output unit, ``W ≈ s · round(W / s)``, ``s = max|W[:, :, j]| / 127``; biases in
  half precision. About a quarter of the bytes. The rounding moves a sample's log
  reconstruction error by about 0.004 (95th percentile, a trained MNIST cluster model), far
  below the margins the association test works with.
- ``int8-delta`` (the default): the same 8-bit codes and scales as ``int8``, so the receiver
  gets exactly the ``int8`` weights, sent as the differences ``round(W / s) − round(B / s)``
  from a *base* ``B`` that both ends hold, with the scales' and the biases' bits XOR those of
  ``B``. Each weight matrix's differences go through the cheapest of four predictors (none,
  the row above, the column to the left, each column's median over the rows that moved:
  a unit's inputs move by about one step each, neighbouring pixels alike), then one
  compressor per model: LZMA for a fresh model (sent once, decoded by every other client),
  run-length deflate for a model one FedAvg round from the receiver's copy (sent every round).
  A model trained a few epochs from ``B`` differs from it in few codes, and those few by
  little: a fresh cluster model against its seeded initialisation (which the receiver
  regenerates) takes about 0.4 of ``int8``'s bytes, a community model one round on from the
  copy the receiver kept about 0.3 (MNIST, 150 samples per cluster:
  ``bench/bench_fedcref_wire.py``). Without a base (``B = 0``) it is ``int8`` compressed.
  Each model names its base (:data:`NONE`, :data:`INIT`, :data:`HELD`) and carries the
  base's CRC-32: a receiver whose base differs (another torch random stream, a lost copy)
  refuses to decode instead of decoding wrong weights.

The receiver decodes to float32. Both ends round the same way, so a simulation in one process
(:mod:`fedclust.fedcref.inmemory`, which applies :func:`roundtrip` where a message would
travel) follows the same trajectory as a Flower run.
"""

from __future__ import annotations

import functools
import hashlib
import lzma
import threading
import zlib
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.errors import FedclustError

FORMATS = ("int8-delta", "float32", "float16", "int8")
DELTA = "int8-delta"
_Q, _S = ".q", ".s"       # suffixes of an int8 matrix and its scales

# bases of an int8-delta model (column 0 of its ``base`` row: kind, seed, count, index)
NONE = 0    #: no base: the codes themselves
INIT = 1    #: row ``index`` of ``autoencoder.init_params(count, sizes, seed, ae-init)``
HELD = 2    #: the receiver's copy of community ``index``, from the round before
KINDS = (NONE, INIT, HELD)
#: the arrays of an int8-delta record
DELTA_KEYS = frozenset({"z", "zn", "sizes", "base", "digest"})
_CB_LIMIT = 1 << 29       # |round(B / s)| is clipped here (both ends alike)


class BaseMismatch(FedclustError, ValueError):
    """An int8-delta model names a base the receiver does not hold as the sender did."""


def encode(named: dict[str, NDArray], fmt: str, base: Mapping[str, NDArray] | None = None,
           ids: NDArray | None = None) -> dict[str, NDArray]:
    """Model arrays (``W0, b0, …``, stacked over models) in the wire format ``fmt``.

    ``int8-delta`` only: ``base`` (the same names and shapes; None = zeros) is what the
    receiver holds, ``ids`` its (models, 4) descriptors (kind, seed, count, index; None =
    :data:`NONE` for every model, which needs no ``base``).
    """
    if fmt == "float32":
        return {k: np.asarray(v, dtype=np.float32) for k, v in named.items()}
    if fmt == "float16":
        return {k: np.asarray(v, dtype=np.float16) for k, v in named.items()}
    if fmt == DELTA:
        return _encode_delta(named, base, ids)
    if fmt != "int8":
        raise ValueError(f"unknown wire format {fmt!r}; allowed: {', '.join(FORMATS)}")
    out: dict[str, NDArray] = {}
    for k, v in named.items():
        v = np.asarray(v, dtype=np.float32)
        if k.startswith("W") and v.ndim == 3:
            out[k + _Q], out[k + _S] = _int8(v)
        else:
            out[k] = v.astype(np.float16)
    return out


def _int8(v: NDArray[np.float32]) -> tuple[NDArray[np.int8], NDArray[np.float32]]:
    """The int8 codes and per-output-unit scales of a stack of weight matrices."""
    scale = np.abs(v).max(axis=1, keepdims=True) / 127.0          # (M, 1, out)
    scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
    return np.clip(np.rint(v / scale), -127, 127).astype(np.int8), scale


def decode(arrays: Mapping[str, NDArray], base: Mapping[str, NDArray] | None = None
           ) -> dict[str, NDArray[np.float32]]:
    """Float32 model arrays from any wire format (:func:`encode`); ``base``: what the
    int8-delta models name as their base (see :func:`resolve`). Raises :class:`BaseMismatch`
    when ``base`` is not the sender's and ValueError when the record is damaged."""
    if "z" in arrays:
        return _decode_delta(arrays, base)
    out: dict[str, NDArray[np.float32]] = {}
    for k, v in arrays.items():
        if k.endswith(_S):
            continue
        if k.endswith(_Q):
            name = k[: -len(_Q)]
            out[name] = (np.asarray(v, dtype=np.float32)
                         * np.asarray(arrays[name + _S], dtype=np.float32))
        else:
            out[k] = np.asarray(v, dtype=np.float32)
    return out


def roundtrip(named: dict[str, NDArray], fmt: str) -> dict[str, NDArray[np.float32]]:
    """What the receiver of ``named`` gets: ``decode(encode(named, fmt))`` (``int8-delta``
    delivers the ``int8`` weights whatever its base)."""
    if fmt == "float32":
        return {k: np.asarray(v, dtype=np.float32) for k, v in named.items()}
    return decode(encode(named, "int8" if fmt == DELTA else fmt))


def roundtrip_params(params: list[Any], fmt: str) -> list[Any]:
    """:func:`roundtrip` of stacked torch parameters ``[W0, b0, W1, b1, …]``, computed with
    torch where they are (the same operations, so the same numbers as the numpy path, in
    one pass per tensor, on every torch thread or on the GPU; ``int8-delta`` delivers the
    ``int8`` weights)."""
    import torch

    if fmt == "float32":
        return [p.float() for p in params]
    if fmt not in FORMATS:
        raise ValueError(f"unknown wire format {fmt!r}; allowed: {', '.join(FORMATS)}")
    out = []
    for i, p in enumerate(params):
        p = p.detach().float()
        if fmt in ("int8", DELTA) and i % 2 == 0 and p.dim() == 3:
            scale = p.abs().amax(dim=1, keepdim=True) / 127.0
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            # + 0.0: a code of -0 is the int8 code 0, as in the numpy path (+0 weights)
            out.append((torch.clamp(torch.round(p / scale), -127, 127) + 0.0) * scale)
        else:
            out.append(p.half().float())
    return out


def problem(arrays: Mapping[str, NDArray]) -> str | None:
    """What is wrong with an encoded model record (names that pair up, dtypes, finite scales;
    for int8-delta the layout, its bases and digests), or None. Shapes are checked on the
    decoded arrays."""
    if "z" in arrays or DELTA_KEYS & set(arrays):
        return _delta_problem(arrays)
    for k, v in arrays.items():
        if k.endswith(_Q):
            name = k[: -len(_Q)]
            if name + _S not in arrays:
                return f"'{k}' without its scales '{name + _S}'"
            s = np.asarray(arrays[name + _S])
            if v.dtype != np.int8:
                return f"'{k}' is {v.dtype}, expected int8"
            if v.ndim != 3 or s.shape != (v.shape[0], 1, v.shape[2]):
                return f"'{name + _S}' has shape {s.shape} for '{k}' of shape {v.shape}"
            if not np.all(np.isfinite(s)) or np.any(s <= 0):
                return f"'{name + _S}' holds scales that are not finite and positive"
        elif k.endswith(_S):
            if k[: -len(_S)] + _Q not in arrays:
                return f"'{k}' without its matrix"
        elif not np.issubdtype(np.asarray(v).dtype, np.floating):
            return f"'{k}' is {np.asarray(v).dtype}, expected floating-point numbers"
    return None


# -- int8-delta --------------------------------------------------------------------------------

def digest(named: Mapping[str, NDArray], which: NDArray[np.bool_] | None = None
           ) -> NDArray[np.int64]:
    """Per stacked model (those of ``which``; 0 for the others), the CRC-32 of its float32
    weights and biases (layer order): enough to tell a wrong base from the right one (both
    ends build bases from the same seeds and messages; this is no defence against a forger,
    who can only spoil its own reply, which the server decodes against its own bases)."""
    n_layers = sum(1 for k in named if k.startswith("W"))
    m = int(np.asarray(named["W0"]).shape[0])
    out = np.zeros(m, dtype=np.int64)
    for r in range(m):
        if which is not None and not which[r]:
            continue
        crc = 0
        for layer in range(n_layers):
            for name in (f"W{layer}", f"b{layer}"):
                crc = zlib.crc32(np.ascontiguousarray(named[name][r], dtype=np.float32).data,
                                 crc)
        out[r] = crc
    return out


def _sizes(named: Mapping[str, NDArray]) -> list[int]:
    n_layers = sum(1 for k in named if k.startswith("W"))
    w = [np.asarray(named[f"W{i}"]) for i in range(n_layers)]
    return [int(w[0].shape[1])] + [int(a.shape[2]) for a in w]


def _zigzag(d: NDArray[np.int32]) -> NDArray[np.uint32]:
    """0, −1, 1, −2, … → 0, 1, 2, 3, … (|d| < 2^30)."""
    return ((d << 1) ^ (d >> 31)).view(np.uint32)


def _unzigzag(z: NDArray[np.uint32]) -> NDArray[np.int32]:
    z = z.view(np.int32)
    return (z >> 1) ^ -(z & 1)


def _planes(values: NDArray[np.unsignedinteger], width: int) -> bytes:
    """The ``width`` byte planes of unsigned integers, low byte first (one plane holds every
    value's low byte, so that mostly-zero high bytes compress away)."""
    v = np.ascontiguousarray(values.astype({1: np.uint8, 2: np.uint16, 4: np.uint32}[width]))
    return v.view(np.uint8).reshape(-1, width).T.tobytes()


def _from_planes(buf: bytes, n: int, width: int) -> NDArray[np.uint32]:
    raw = np.frombuffer(buf, dtype=np.uint8).reshape(width, n)
    if width == 1:
        return raw[0].astype(np.uint32)
    out = np.zeros((n, width), dtype=np.uint8)
    out.T[:] = raw
    return out.view({2: np.uint16, 4: np.uint32}[width])[:, 0].astype(np.uint32)


def _base_codes(b: NDArray[np.float32], scale: NDArray[np.float32]) -> NDArray[np.int32]:
    return np.clip(np.rint(np.asarray(b, dtype=np.float32) / scale),
                   -_CB_LIMIT, _CB_LIMIT).astype(np.int32)


def _f16_bits(v: NDArray) -> NDArray[np.uint16]:
    return np.asarray(v, dtype=np.float32).astype(np.float16).view(np.uint16)


# A model's stream: one byte naming its compressor, then, compressed: the byte width of the
# values (1, 2 or 4), one predictor per weight matrix (below), the live-row masks of the
# matrices predicted by their column medians, the scales' float32 bits XOR those of the
# base's scales (four planes), the zigzag-coded residuals of every matrix (and those
# medians) as byte planes, and the biases' half-precision bits XOR the base's (two planes).
DEFLATE, LZMA = 0, 1
_LZMA_FILTERS = [{"id": 0x21, "preset": 6, "dict_size": 1 << 20}]    # LZMA2
# Predictors of a matrix of code differences d (in x out): none; the previous row's
# (previous input unit: neighbouring pixels move alike); the previous column's; each
# column's median over the rows that moved at all (the units that train share one step size
# per column, rows that never move are dead inputs).
PLAIN, ROW_ABOVE, COLUMN_LEFT, COLUMN_MEDIAN = 0, 1, 2, 3


def _cost(r: NDArray) -> float:
    """About the bits the values ``r`` take once entropy-coded (for choosing a predictor)."""
    return float(np.log2(1.0 + np.abs(r, dtype=np.float32)).sum())


def _predict(d: NDArray[np.int32]) -> tuple[int, NDArray[np.int32], bytes, NDArray[np.int32]]:
    """The cheapest predictor of ``d``: (its id, the residual, the live-row mask bytes, the
    column medians); the residual, mask and medians give ``d`` back (:func:`_unpredict`)."""
    best = (_cost(d), PLAIN, d, b"", d[:0, 0])
    if np.abs(d).max(initial=0) >= 1 << 20:    # a base far off: no differences of differences
        return PLAIN, d, b"", d[:0, 0]
    for pid, r in ((ROW_ABOVE, np.diff(d, axis=0, prepend=0)),
                   (COLUMN_LEFT, np.diff(d, axis=1, prepend=0))):
        c = _cost(r)
        if c < best[0]:
            best = (c, pid, r, b"", d[:0, 0])
    live = np.any(d != 0, axis=1)
    if live.any():
        med = np.rint(np.median(d[live], axis=0)).astype(np.int32)
        r = np.where(live[:, None], d - med[None], 0).astype(np.int32)
        c = _cost(r) + _cost(med) + len(live) / 8
        if c < best[0]:
            best = (c, COLUMN_MEDIAN, r, np.packbits(live).tobytes(), med)
    _, pid, r, mask, med = best
    return pid, r.astype(np.int32), mask, med


def _unpredict(pid: int, r: NDArray[np.int32], live: NDArray[np.bool_] | None,
               med: NDArray[np.int32] | None) -> NDArray[np.int64]:
    r = r.astype(np.int64)
    if pid == ROW_ABOVE:
        return np.cumsum(r, axis=0)
    if pid == COLUMN_LEFT:
        return np.cumsum(r, axis=1)
    if pid == COLUMN_MEDIAN:
        return r + np.where(live[:, None], med[None].astype(np.int64), 0)
    return r


def _compress(raw: bytes, codec: int) -> bytes:
    if codec == LZMA:
        return bytes([LZMA]) + lzma.compress(raw, format=lzma.FORMAT_RAW, filters=_LZMA_FILTERS)
    co = zlib.compressobj(1, zlib.DEFLATED, 15, 9, zlib.Z_RLE)
    return bytes([DEFLATE]) + co.compress(raw) + co.flush()


def _decompress(z: bytes, limit: int) -> bytes:
    """The bytes of a compressed stream, at most ``limit`` of them (ValueError otherwise)."""
    if not z or z[0] not in (DEFLATE, LZMA):
        raise ValueError("unknown compressor")
    if z[0] == LZMA:
        d = lzma.LZMADecompressor(lzma.FORMAT_RAW, filters=[{"id": 0x21, "dict_size": 1 << 20}])
        try:
            raw = d.decompress(z[1:], limit + 1)
        except lzma.LZMAError as exc:
            raise ValueError(f"its bytes do not inflate ({exc})") from None
        done = d.eof and not d.unused_data
    else:
        d = zlib.decompressobj()
        try:
            raw = d.decompress(z[1:], limit + 1)
        except zlib.error as exc:
            raise ValueError(f"its bytes do not inflate ({exc})") from None
        done = d.eof and not d.unconsumed_tail and not d.unused_data
    if not done or len(raw) > limit:
        raise ValueError("its compressed bytes do not end where they should")
    return raw


def _encode_delta(named: Mapping[str, NDArray], base: Mapping[str, NDArray] | None,
                  ids: NDArray | None) -> dict[str, NDArray]:
    sizes = _sizes(named)
    n_layers = len(sizes) - 1
    m = int(np.asarray(named["W0"]).shape[0])
    ids = np.zeros((m, 4), dtype=np.int64) if ids is None else np.asarray(ids, dtype=np.int64)
    if ids.shape != (m, 4):
        raise ValueError(f"base ids of shape {ids.shape} for {m} models")
    if base is None:
        if np.any(ids[:, 0] != NONE):
            raise ValueError("int8-delta models that name a base need that base")
        base = {k: np.zeros_like(np.asarray(v, dtype=np.float32)) for k, v in named.items()}
    deltas, scales = [], []
    for i in range(n_layers):
        codes, scale = _int8(np.asarray(named[f"W{i}"], dtype=np.float32))
        deltas.append(codes.astype(np.int32) - _base_codes(base[f"W{i}"], scale))
        scales.append((scale.view(np.uint32) ^ _base_scale(base[f"W{i}"])).reshape(m, -1))
    scales = np.concatenate(scales, axis=1)
    bias = np.concatenate([(_f16_bits(named[f"b{i}"]) ^ _f16_bits(base[f"b{i}"])).reshape(m, -1)
                           for i in range(n_layers)], axis=1)
    streams = []
    for r in range(m):
        pids, masks, values, medians = [], [], [], []
        for i in range(n_layers):
            pid, res, mask, med = _predict(deltas[i][r])
            pids.append(pid)
            masks.append(mask)
            values.append(res.ravel())
            medians.append(med)
        u = _zigzag(np.concatenate(values + medians))
        top = int(u.max(initial=0))
        width = 1 if top < 1 << 8 else 2 if top < 1 << 16 else 4
        raw = (bytes([width, *pids]) + b"".join(masks) + _planes(scales[r], 4)
               + _planes(u, width) + _planes(bias[r], 2))
        # a model one FedAvg round from the copy the receiver holds differs in small codes,
        # and one is sent every round: Huffman codes of runs (deflate) are fast and about as
        # small as anything; a fresh model is sent once and decoded by every other client:
        # LZMA takes 15-20 % off it
        streams.append(_compress(raw, DEFLATE if ids[r, 0] == HELD else LZMA))
    dig = digest(base, ids[:, 0] != NONE)
    return {"z": np.frombuffer(b"".join(streams), dtype=np.uint8).copy(),
            "zn": np.array([len(s) for s in streams], dtype=np.int64),
            "sizes": np.asarray(sizes, dtype=np.int64), "base": ids, "digest": dig}


def _base_scale(b: NDArray) -> NDArray[np.uint32]:
    """The float32 bits of the int8 scales of a base (what its own int8 encoding would use)."""
    return _int8(np.asarray(b, dtype=np.float32))[1].view(np.uint32)


def _delta_problem(arrays: Mapping[str, NDArray]) -> str | None:
    if set(arrays) != DELTA_KEYS:
        return f"int8-delta record has arrays {sorted(arrays)}, expected {sorted(DELTA_KEYS)}"
    z, zn = np.asarray(arrays["z"]), np.asarray(arrays["zn"])
    sizes, ids, dig = (np.asarray(arrays[k]) for k in ("sizes", "base", "digest"))
    if z.dtype != np.uint8 or z.ndim != 1:
        return f"'z' is {z.dtype} {z.shape}, expected uint8 bytes"
    if sizes.dtype.kind not in "iu" or sizes.ndim != 1 or len(sizes) < 2 \
            or np.any(sizes < 1) or np.any(sizes > 1 << 20):
        return "'sizes' must list at least two layer widths in 1..2^20"
    m = len(zn)
    if zn.dtype.kind not in "iu" or zn.ndim != 1 or np.any(zn < 1) or int(zn.sum()) != len(z):
        return f"'zn' must hold the positive lengths of the {len(z)} bytes of 'z'"
    if ids.dtype.kind not in "iu" or ids.shape != (m, 4) \
            or not ((ids[:, 0] >= NONE) & (ids[:, 0] <= HELD)).all():
        return f"'base' must be ({m}, 4) descriptors of kinds {KINDS}"
    if dig.dtype.kind not in "iu" or dig.shape != (m,):
        return f"'digest' must hold {m} digests"
    return None


def rows(arrays: Mapping[str, NDArray], index: Sequence[int]) -> dict[str, NDArray]:
    """The int8-delta record of the models at positions ``index`` of ``arrays``."""
    ends = np.cumsum(arrays["zn"])
    starts = ends - arrays["zn"]
    z = arrays["z"]
    idx = [int(i) for i in index]
    return {"z": np.concatenate([z[starts[i]:ends[i]] for i in idx]) if idx
            else np.zeros(0, np.uint8),
            "zn": np.asarray(arrays["zn"])[idx], "sizes": np.asarray(arrays["sizes"]),
            "base": np.asarray(arrays["base"])[idx], "digest": np.asarray(arrays["digest"])[idx]}


def join(records: Sequence[Mapping[str, NDArray]]) -> dict[str, NDArray]:
    """One int8-delta record of the models of ``records`` (same layer sizes), in order."""
    sizes = np.asarray(records[0]["sizes"])
    if any(not np.array_equal(r["sizes"], sizes) for r in records):
        raise ValueError("int8-delta records of different layer sizes")
    return {"z": np.concatenate([r["z"] for r in records]),
            "zn": np.concatenate([r["zn"] for r in records]), "sizes": sizes,
            "base": np.concatenate([r["base"] for r in records]),
            "digest": np.concatenate([r["digest"] for r in records])}


def _decode_delta(arrays: Mapping[str, NDArray], base: Mapping[str, NDArray] | None
                  ) -> dict[str, NDArray[np.float32]]:
    bad = _delta_problem(arrays)
    if bad:
        raise ValueError(bad)
    sizes = [int(v) for v in arrays["sizes"]]
    n_layers = len(sizes) - 1
    ids, m = np.asarray(arrays["base"]), len(arrays["zn"])
    shapes = {f"W{i}": (m, sizes[i], sizes[i + 1]) for i in range(n_layers)}
    shapes.update({f"b{i}": (m, 1, sizes[i + 1]) for i in range(n_layers)})
    named = (ids[:, 0] != NONE)
    if base is None:
        if named.any():
            raise BaseMismatch("the models name a base the receiver was not given")
        base = {k: np.zeros(v, dtype=np.float32) for k, v in shapes.items()}
    else:
        for k, shape in shapes.items():
            if np.asarray(base[k]).shape != shape:
                raise BaseMismatch(f"base '{k}' has shape {np.asarray(base[k]).shape}, "
                                   f"expected {shape}")
        if named.any() and not np.array_equal(digest(base, named)[named],
                                              np.asarray(arrays["digest"])[named]):
            raise BaseMismatch("a model's base differs from the sender's (digest)")
    key = _record_key(arrays)
    hit = _lookup(key)        # the same record, against the same bases (digests checked)
    if hit is not None:
        return hit
    out = _inflate(arrays, base, sizes, shapes)
    _remember(key, out)
    return {k: v.copy() for k, v in out.items()}


# Decoded int8-delta records, by content: in a simulation every client decodes the same
# cross-evaluation models (a deployed node decodes each once, and gains nothing here).
_DECODED: OrderedDict[bytes, dict[str, NDArray[np.float32]]] = OrderedDict()
_DECODED_LIMIT = 64 << 20     # bytes of decoded weights kept
_DECODED_LOCK = threading.Lock()


def _lookup(key: bytes) -> dict[str, NDArray[np.float32]] | None:
    with _DECODED_LOCK:
        hit = _DECODED.get(key)
        if hit is not None:
            _DECODED.move_to_end(key)
    return None if hit is None else {k: v.copy() for k, v in hit.items()}


def cached(arrays: Mapping[str, NDArray]) -> dict[str, NDArray[np.float32]] | None:
    """The weights of an int8-delta record this process decoded before, when its models name
    no kept copy as base (None otherwise): a seeded initialisation, once rebuilt and checked
    against the record's digest here, is the same for every receiver in this process, so
    the record decodes to the same weights without rebuilding it. Not for a reply the
    server checks: it must see the bases a node names."""
    if "z" not in arrays or _delta_problem(arrays) or np.any(np.asarray(arrays["base"])[:, 0]
                                                              == HELD):
        return None
    return _lookup(_record_key(arrays))


def _record_key(arrays: Mapping[str, NDArray]) -> bytes:
    h = hashlib.sha256()
    for k in sorted(DELTA_KEYS):
        a = np.ascontiguousarray(arrays[k])
        h.update(f"{k}:{a.dtype.str}:{a.shape};".encode())
        h.update(a.data)
    return h.digest()


def _remember(key: bytes, decoded: dict[str, NDArray[np.float32]]) -> None:
    with _DECODED_LOCK:
        _DECODED[key] = decoded
        total = sum(v.nbytes for d in _DECODED.values() for v in d.values())
        while total > _DECODED_LIMIT and len(_DECODED) > 1:
            _, old = _DECODED.popitem(last=False)
            total -= sum(v.nbytes for v in old.values())


def _inflate(arrays: Mapping[str, NDArray], base: Mapping[str, NDArray], sizes: list[int],
             shapes: dict[str, tuple[int, ...]]) -> dict[str, NDArray[np.float32]]:
    """The int8 weights of a checked int8-delta record against its (checked) bases."""
    n_layers = len(sizes) - 1
    zn = np.asarray(arrays["zn"])
    m = len(zn)
    dims = [(sizes[i], sizes[i + 1]) for i in range(n_layers)]
    n_w = sum(a * b for a, b in dims)
    n_b = sum(sizes[1:])
    n_mask = sum(-(-a // 8) for a, _ in dims)
    z = np.asarray(arrays["z"]).tobytes()
    limit = 1 + n_layers + n_mask + 4 * n_b + 4 * (n_w + n_b) + 2 * n_b
    scale_bits = np.zeros((m, n_b), dtype=np.uint32)
    codes = [np.zeros((m, a, b), dtype=np.int64) for a, b in dims]
    bias = np.zeros((m, n_b), dtype=np.uint16)
    pos = 0
    for r in range(m):
        try:
            raw = _decompress(z[pos:pos + int(zn[r])], limit)
        except ValueError as exc:
            raise ValueError(f"model {r}: {exc}") from None
        pos += int(zn[r])
        if len(raw) < 1 + n_layers or raw[0] not in (1, 2, 4) \
                or any(p not in (PLAIN, ROW_ABOVE, COLUMN_LEFT, COLUMN_MEDIAN)
                       for p in raw[1:1 + n_layers]):
            raise ValueError(f"model {r}: a damaged stream header")
        width, pids = raw[0], list(raw[1:1 + n_layers])
        masked = [i for i in range(n_layers) if pids[i] == COLUMN_MEDIAN]
        n_val = n_w + sum(dims[i][1] for i in masked)
        at = 1 + n_layers
        want = at + sum(-(-dims[i][0] // 8) for i in masked) + 4 * n_b + width * n_val \
            + 2 * n_b
        if len(raw) != want:
            raise ValueError(f"model {r}: {len(raw)} bytes, expected {want}")
        live = {}
        for i in masked:
            nb = -(-dims[i][0] // 8)
            live[i] = np.unpackbits(np.frombuffer(raw[at:at + nb], dtype=np.uint8),
                                    count=dims[i][0]).astype(bool)
            at += nb
        scale_bits[r] = _from_planes(raw[at:at + 4 * n_b], n_b, 4)
        at += 4 * n_b
        vals = _unzigzag(_from_planes(raw[at:at + width * n_val], n_val, width))
        at += width * n_val
        bias[r] = _from_planes(raw[at:], n_b, 2).astype(np.uint16)
        v0, med0 = 0, n_w
        for i, (a, b) in enumerate(dims):
            res = vals[v0:v0 + a * b].reshape(a, b)
            v0 += a * b
            med = None
            if pids[i] == COLUMN_MEDIAN:
                med, med0 = vals[med0:med0 + b], med0 + b
            codes[i][r] = _unpredict(pids[i], res, live.get(i), med)
    out: dict[str, NDArray[np.float32]] = {}
    b0 = s0 = 0
    for i, (_, b) in enumerate(dims):
        bits = scale_bits[:, s0:s0 + b].reshape(m, 1, b) ^ _base_scale(base[f"W{i}"])
        scale = bits.view(np.float32)
        if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
            raise ValueError(f"'W{i}': scales that are not finite and positive")
        c = codes[i] + _base_codes(base[f"W{i}"], scale)
        if np.any(np.abs(c) > 127):
            raise ValueError(f"'W{i}': codes outside the int8 range")
        out[f"W{i}"] = c.astype(np.float32) * scale
        bits = bias[:, b0:b0 + b].reshape(m, 1, b) ^ _f16_bits(base[f"b{i}"])
        out[f"b{i}"] = bits.view(np.float16).astype(np.float32)
        b0, s0 = b0 + b, s0 + b
    return out


def base_ids(arrays: Mapping[str, NDArray]) -> NDArray[np.int64] | None:
    """The (models, 4) base descriptors of an int8-delta record (None: another format)."""
    return np.asarray(arrays["base"], dtype=np.int64) if "z" in arrays else None


def resolve(ids: NDArray, sizes: Sequence[int], init_kind: str,
            held: Callable[[int], Mapping[str, NDArray]] | None = None
            ) -> dict[str, NDArray[np.float32]]:
    """The bases that descriptors ``ids`` name: zeros (:data:`NONE`), row ``index`` of the
    seeded initialisation of ``count`` models (:data:`INIT`), or ``held(index)`` (one model,
    :data:`HELD`; raises :class:`BaseMismatch` when the receiver holds none)."""
    sizes = [int(v) for v in sizes]
    m = len(ids)
    out = {f"W{i}": np.zeros((m, sizes[i], sizes[i + 1]), np.float32)
           for i in range(len(sizes) - 1)}
    out.update({f"b{i}": np.zeros((m, 1, sizes[i + 1]), np.float32)
                for i in range(len(sizes) - 1)})
    for r, (kind, seed, count, index) in enumerate(np.asarray(ids, dtype=np.int64).tolist()):
        if kind == INIT:
            if not 0 <= index < count:
                raise BaseMismatch(f"initialisation row {index} of {count}")
            init = _init(seed, count, tuple(sizes), init_kind)
            src = {k: v[index:index + 1] for k, v in init.items()}
        elif kind == HELD:
            if held is None:
                raise BaseMismatch("a model is sent against a copy this receiver does not keep")
            src = held(index)
        else:
            continue
        for k in out:
            out[k][r] = np.asarray(src[k], dtype=np.float32).reshape(out[k].shape[1:])
    return out


@functools.lru_cache(maxsize=32)
def _init(seed: int, count: int, sizes: tuple[int, ...], init_kind: str
          ) -> dict[str, NDArray[np.float32]]:
    """``init_params(count, sizes, seed, init_kind)`` as arrays, kept for the next receiver:
    every client of a simulation decodes the same foreign models."""
    from fedclust.fedcref import autoencoder as ae

    out = ae.to_numpy(ae.init_params(count, list(sizes), seed, init_kind))
    for v in out.values():
        v.setflags(write=False)
    return out


def init_check(hidden: Sequence[int], init_kind: str) -> int:
    """A digest of a fixed seeded initialisation (300 inputs, the run's hidden layers): two
    ends with the same value regenerate each other's initialisations (:data:`INIT` bases)."""
    from fedclust.fedcref import autoencoder as ae

    sizes = ae.layer_sizes(300, list(hidden))
    return int(digest(ae.to_numpy(ae.init_params(2, sizes, 0x5EED, init_kind)))[1])
