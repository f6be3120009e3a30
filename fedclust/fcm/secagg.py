"""Packing of the FCM sums for Flower's SecAgg+, shared by the server
(:mod:`strategies.fcm.secure`) and the clients (:mod:`client_apps.secagg_handlers`).

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

import math

import numpy as np

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
         scale_u: float | None = None, n: int | None = None) -> np.ndarray:
    """The vector a client feeds to SecAgg+: limbs of ``U / scale_u`` then of
    ``WS / scale`` (flat float64), then, when ``n`` is given, limbs of the client's row count
    ``n / scale_u`` (the server learns only the round's total, against which it checks ``ΣU``).
    ``U = Σu^m ≤ N`` does not grow with the data's units, so it gets its own divisor
    (``scale_for(1)``); one divisor for both would round U away when the features are large."""
    scale_u = scale if scale_u is None else scale_u
    parts = [to_limbs(u.ravel(), scale_u, limbs).ravel(),
             to_limbs(ws.ravel(), scale, limbs).ravel()]
    if n is not None:
        parts.append(to_limbs(np.array([float(n)]), scale_u, limbs).ravel())
    return np.concatenate(parts)


def sums_length(c: int, f: int, limbs: int = LIMBS, with_n: bool = True) -> int:
    """Length of the vector :func:`pack` makes for ``c`` clusters and ``f`` features."""
    return limbs * (c + c * f + int(with_n))


def unpack(vec: np.ndarray, c: int, f: int, scale: float, limbs: int = LIMBS,
           scale_u: float | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Summed packed vector → ``(ΣU (c,), ΣWS (c, f))`` (a row count after them is ignored:
    :func:`unpack_count`)."""
    scale_u = scale if scale_u is None else scale_u
    vec = np.asarray(vec, dtype=np.float64)
    u = from_limbs(vec[:limbs * c].reshape(limbs, c), scale_u)
    ws = from_limbs(vec[limbs * c:limbs * (c + c * f)].reshape(limbs, c * f), scale)
    return u, ws.reshape(c, f)


def unpack_count(vec: np.ndarray, offset: int, scale: float, limbs: int = LIMBS) -> float:
    """The summed count whose limbs start at ``offset`` of a summed vector."""
    part = np.asarray(vec, dtype=np.float64)[offset:offset + limbs].reshape(limbs, 1)
    return float(from_limbs(part, scale)[0])


def pack_final(objective: float, table: np.ndarray, scale_j: float, scale_t: float,
               limbs: int = LIMBS, n: int | None = None) -> np.ndarray:
    """The final-phase vector: limbs of ``[J]``, limbs of the contingency table (flat) and,
    when ``n`` is given, limbs of the client's row count (divisor ``scale_t``)."""
    parts = [to_limbs(np.array([objective]), scale_j, limbs).ravel(),
             to_limbs(np.asarray(table, dtype=np.float64).ravel(), scale_t, limbs).ravel()]
    if n is not None:
        parts.append(to_limbs(np.array([float(n)]), scale_t, limbs).ravel())
    return np.concatenate(parts)


def final_length(rows: int, cols: int, limbs: int = LIMBS, with_n: bool = True) -> int:
    """Length of the vector :func:`pack_final` makes for a ``rows × cols`` table."""
    return limbs * (1 + rows * cols + int(with_n))


def unpack_final(vec: np.ndarray, rows: int, cols: int, scale_j: float, scale_t: float,
                 limbs: int = LIMBS) -> tuple[float, np.ndarray]:
    """Summed final-phase vector → ``(ΣJ, Σ contingency (rows, cols) as int64)`` (a row count
    after them is ignored: :func:`unpack_count`)."""
    vec = np.asarray(vec, dtype=np.float64)
    j = from_limbs(vec[:limbs].reshape(limbs, 1), scale_j)[0]
    table = from_limbs(vec[limbs:limbs * (1 + rows * cols)].reshape(limbs, rows * cols),
                       scale_t).reshape(rows, cols)
    return float(j), np.rint(table).astype(np.int64)
