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

The receiver decodes to float32. Both ends round the same way, so a simulation in one process
(:mod:`fedclust.fedcref.inmemory`, which applies :func:`roundtrip` where a message would
travel) follows the same trajectory as a Flower run.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

FORMATS = ("float32", "float16", "int8")
_Q, _S = ".q", ".s"       # suffixes of an int8 matrix and its scales


def encode(named: dict[str, NDArray], fmt: str) -> dict[str, NDArray]:
    """Model arrays (``W0, b0, …``, stacked over models) in the wire format ``fmt``."""
    if fmt == "float32":
        return {k: np.asarray(v, dtype=np.float32) for k, v in named.items()}
    if fmt == "float16":
        return {k: np.asarray(v, dtype=np.float16) for k, v in named.items()}
    if fmt != "int8":
        raise ValueError(f"unknown wire format {fmt!r}; allowed: {', '.join(FORMATS)}")
    out: dict[str, NDArray] = {}
    for k, v in named.items():
        v = np.asarray(v, dtype=np.float32)
        if k.startswith("W") and v.ndim == 3:
            scale = np.abs(v).max(axis=1, keepdims=True) / 127.0          # (M, 1, out)
            scale = np.where(scale > 0, scale, 1.0).astype(np.float32)
            out[k + _Q] = np.clip(np.rint(v / scale), -127, 127).astype(np.int8)
            out[k + _S] = scale
        else:
            out[k] = v.astype(np.float16)
    return out


def decode(arrays: dict[str, NDArray]) -> dict[str, NDArray[np.float32]]:
    """Float32 model arrays from any wire format (:func:`encode`)."""
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
    """What the receiver of ``named`` gets: ``decode(encode(named, fmt))``."""
    return decode(encode(named, fmt)) if fmt != "float32" else {
        k: np.asarray(v, dtype=np.float32) for k, v in named.items()}


def roundtrip_params(params: list[Any], fmt: str) -> list[Any]:
    """:func:`roundtrip` of stacked torch parameters ``[W0, b0, W1, b1, …]``, computed with
    torch where they are (the same operations, so the same numbers as the numpy path, in
    one pass per tensor, on every torch thread or on the GPU)."""
    import torch

    if fmt == "float32":
        return [p.float() for p in params]
    if fmt not in FORMATS:
        raise ValueError(f"unknown wire format {fmt!r}; allowed: {', '.join(FORMATS)}")
    out = []
    for i, p in enumerate(params):
        p = p.detach().float()
        if fmt == "int8" and i % 2 == 0 and p.dim() == 3:
            scale = p.abs().amax(dim=1, keepdim=True) / 127.0
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))
            out.append(torch.clamp(torch.round(p / scale), -127, 127) * scale)
        else:
            out.append(p.half().float())
    return out


def problem(arrays: dict[str, NDArray]) -> str | None:
    """What is wrong with an encoded model record (names that pair up, dtypes, finite scales),
    or None. Shapes are checked on the decoded arrays."""
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
