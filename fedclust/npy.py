"""The ``.npy`` bytes a Flower ``Array`` holds, written and read without the per-call cost of
``numpy.save``/``numpy.load``.

Every array a message carries is the bytes of a ``.npy`` file (``Array.data``, ``stype``
``"numpy.ndarray"``). ``numpy.save`` and ``numpy.load`` write and parse the file's header on
every call (about 35 and 60 µs), which is most of what a small message costs: an exact-FCM
round with 1,000 clients handles about 9,000 such arrays. Here a header is parsed or written
once per dtype and shape and kept; the bytes are the same as ``numpy.save``'s, and
:func:`loads` returns what ``numpy.load(..., allow_pickle=False)`` returns (a new, writable
array) and refuses what it refuses (object arrays, a bad header, too few bytes).
"""

from __future__ import annotations

import io
import math
from typing import Any

import numpy as np

STYPE = "numpy.ndarray"
"""Flower's ``Array.stype`` of ``.npy`` bytes."""

_MAGIC = b"\x93NUMPY"
_HEADERS: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}   # (dtype, shape) -> header
_NAMES: dict[np.dtype, str] = {}        # dtype -> str(dtype)
_PARSED: dict[bytes, tuple[np.dtype, tuple[int, ...], bool]] = {}   # header -> layout
_KEEP = 4096


def dumps(array: np.ndarray) -> bytes:
    """``numpy.save(buffer, array, allow_pickle=False)``'s bytes (C order)."""
    a = np.ascontiguousarray(array)
    key = (a.dtype, a.shape)
    header = _HEADERS.get(key)
    if header is None:
        if a.dtype.hasobject:
            raise ValueError("Object arrays cannot be saved when allow_pickle=False")
        buffer = io.BytesIO()
        np.save(buffer, a, allow_pickle=False)
        full = buffer.getvalue()
        if len(_HEADERS) < _KEEP:
            _HEADERS[key] = full[:len(full) - a.nbytes]
        return full
    return header + a.tobytes()


def array_fields(array: np.ndarray) -> tuple[str, tuple[int, ...], str, bytes]:
    """``(dtype, shape, stype, data)`` of Flower's ``Array(array)`` (C order)."""
    a = np.ascontiguousarray(array)
    name = _NAMES.get(a.dtype)
    if name is None:
        name = _NAMES[a.dtype] = str(a.dtype)
    return name, a.shape, STYPE, dumps(a)


def layout(data: bytes) -> tuple[int, tuple[np.dtype, tuple[int, ...], bool]] | None:
    """``(offset of the values, (dtype, shape, Fortran order))`` of ``.npy`` bytes of format
    1.0 or 2.0 (what ``numpy.save`` writes); None for anything else."""
    if data[:6] != _MAGIC or len(data) < 12 or data[6] not in (1, 2) or data[7] != 0:
        return None
    start = 10 if data[6] == 1 else 12
    end = start + int.from_bytes(data[8:start], "little")
    header = data[:end]
    layout = _PARSED.get(header)
    if layout is None:
        buffer = io.BytesIO(header)
        reader = (np.lib.format.read_array_header_1_0 if data[6] == 1 else
                  np.lib.format.read_array_header_2_0)
        buffer.seek(8)
        shape, fortran, dtype = reader(buffer)    # numpy.load's parser, with its size limit
        if buffer.tell() != end:
            raise ValueError("the .npy header has a wrong length")
        layout = (dtype, tuple(int(n) for n in shape), bool(fortran))
        if len(_PARSED) < _KEEP:
            _PARSED[header] = layout
    return end, layout


def loads(data: bytes) -> np.ndarray:
    """``numpy.load(io.BytesIO(data), allow_pickle=False)`` of ``.npy`` bytes.

    Raises
    ------
    ValueError
        Not ``.npy`` bytes, an object array (it would need pickle), or fewer bytes than the
        header's shape needs.
    """
    found = layout(data)
    if found is None:   # another .npy version, or no .npy at all: numpy says what is wrong
        out = np.load(io.BytesIO(data), allow_pickle=False)
        if not isinstance(out, np.ndarray):
            raise ValueError("the bytes are an .npz archive, not one array")
        return out
    offset, (dtype, shape, fortran) = found
    if dtype.hasobject:
        raise ValueError("Object arrays cannot be loaded when allow_pickle=False")
    count = math.prod(shape)
    if len(data) - offset < count * dtype.itemsize:
        raise ValueError(f"EOF: the .npy bytes hold fewer values than the shape {shape} needs")
    order = "F" if fortran else "C"
    flat = np.frombuffer(data, dtype=dtype, count=count, offset=offset)
    return flat.reshape(shape, order=order).copy(order=order)


def loads_many(datas: list[bytes]) -> np.ndarray | None:
    """``numpy.stack([loads(d) for d in datas])`` when every item is ``.npy`` bytes of one
    header (one dtype and shape, C order), read in one pass; None otherwise (read each)."""
    if not datas:
        return None
    found = layout(datas[0])
    if found is None:
        return None
    offset, (dtype, shape, fortran) = found
    size = math.prod(shape) * dtype.itemsize
    header = datas[0][:offset]
    if dtype.hasobject or fortran or any(
            len(d) != offset + size or d[:offset] != header for d in datas):
        return None
    flat = np.frombuffer(b"".join([d[offset:] for d in datas]), dtype=dtype)
    return flat.reshape((len(datas), *shape)).copy()


def from_array(array: Any) -> np.ndarray:
    """The ndarray of a Flower ``Array`` (what ``array.numpy()`` returns), read with
    :func:`loads`; an ``Array`` of another ``stype`` goes through its own ``numpy()``."""
    if getattr(array, "stype", None) != STYPE:
        return array.numpy()
    return loads(array.data)
