"""Data an edge device owns: load a node's local table from ``data-path`` (deployment).

Formats (inferred from the suffix or given as ``data-format``): a folder of images
(``images``; ``<class>/`` subfolders give evaluation labels), ``.npz`` with array ``x``
(and optional ``y`` for evaluation), ``.npy`` (features only), ``.csv``/``.tsv`` (numeric, with
or without a header; ``label-column`` names/indexes an optional ground-truth column that is
removed from the features).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray


class LocalDataError(ValueError):
    """A node's local data file is missing or unreadable."""


def load_local_table(path: str, data_format: str = "", label_column: str = ""
                     ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """Return ``(x, y_eval_or_None)`` from a node's own file."""
    p = Path(path).expanduser()
    if not p.exists():
        raise LocalDataError(f"node config 'data-path' = {path!r} does not exist on this node. "
                             f"Fix: flower-supernode --node-config 'data-path=\"/abs/file.csv\"'.")
    fmt = (data_format or ("images" if p.is_dir() else p.suffix.lstrip("."))).lower()
    if fmt == "images":
        return load_image_folder(p)
    if fmt == "npz":
        with np.load(p) as z:
            if "x" not in z:
                raise LocalDataError(f"{p} has arrays {list(z)}; expected 'x' (and optional 'y')")
            x = z["x"].reshape(len(z["x"]), -1).astype(np.float64)
            y = labels_to_int(z["y"]) if "y" in z else None
        return x, y
    if fmt == "npy":
        x = np.load(p)
        return x.reshape(len(x), -1).astype(np.float64), None
    if fmt in ("csv", "tsv", "txt"):
        return _load_delimited(p, "\t" if fmt == "tsv" else ",", label_column)
    raise LocalDataError(f"unsupported data format {fmt!r} for {p}. Allowed: npz, npy, csv, tsv, "
                         f"images (a folder). Fix: set node config 'data-format'.")


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".pgm")


def load_image_folder(root: Path) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """Images under ``root`` (recursively): grey-scaled, flattened, scaled to [0, 1].

    ``root/<class>/…/*.png`` gives evaluation labels: the class is the *first* folder under
    ``root`` (deeper sub-folders are part of that class), class folders sorted by name. If any
    image lies directly in ``root``, there are no labels. All images must have the same size.
    """
    from PIL import Image

    files = sorted(f for f in root.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise LocalDataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}")
    arrays = [np.asarray(Image.open(f).convert("L"), dtype=np.float64) for f in files]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise LocalDataError(f"images under {root} have different sizes {sorted(shapes)}; "
                             f"resize them to one size first")
    x = np.stack([a.ravel() for a in arrays]) / 255.0
    parts = [f.relative_to(root).parts for f in files]
    if all(len(q) > 1 for q in parts):   # the class is the first folder under root
        _, index = np.unique(np.array([q[0] for q in parts]), return_inverse=True)
        return x, index.astype(np.int64)
    return x, None


def _load_delimited(p: Path, delim: str, label_column: str
                    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """A numeric CSV/TSV (header detected when its first cell is not a number); the optional
    ``label_column`` (header name or 0-based index) may hold numbers or strings."""
    with open(p) as fh:
        first = fh.readline().rstrip("\r\n").split(delim)
    has_header = bool(first and first[0]) and not _is_number(first[0])
    if label_column == "":
        try:
            return np.loadtxt(p, delimiter=delim, skiprows=int(has_header), ndmin=2), None
        except ValueError as exc:
            raise LocalDataError(f"{p}: non-numeric values ({exc}). Every feature must be a "
                                 f"number; a text column holding labels must be named in node "
                                 f"config 'label-column'") from exc
    col = _label_index(p, first, has_header, label_column)
    try:
        cells = np.loadtxt(p, delimiter=delim, skiprows=int(has_header), ndmin=2, dtype=str)
    except ValueError as exc:
        raise LocalDataError(f"{p}: rows of different lengths ({exc})") from exc
    try:
        x = np.delete(cells, col, axis=1).astype(np.float64)
    except ValueError as exc:
        raise LocalDataError(f"{p}: non-numeric feature values ({exc}); only the label column "
                             f"({label_column!r}) may hold text") from exc
    return x, labels_to_int(cells[:, col])


def _label_index(p: Path, first: list[str], has_header: bool, label_column: str) -> int:
    """0-based index of ``label_column`` (a header name or an index), or a clear error."""
    if has_header and label_column in first:
        return first.index(label_column)
    try:
        col = int(label_column)
    except ValueError:
        where = (f"its header has {first}" if has_header else
                 f"it has no header row (its first cell {first[0]!r} is a number)")
        raise LocalDataError(
            f"node config 'label-column' = {label_column!r} names no column of {p}: {where}. "
            f"Allowed: a header name or a 0-based column index (0..{len(first) - 1}). Fix: "
            f"label-column=<index> or add a header row.") from None
    if not -len(first) <= col < len(first):
        raise LocalDataError(f"node config 'label-column' = {label_column!r} is out of range: "
                             f"{p} has {len(first)} columns (0..{len(first) - 1})")
    return col % len(first)


def labels_to_int(values: np.ndarray) -> NDArray[np.int64]:
    """Evaluation labels as ints: non-negative integer-valued numbers are kept; anything else
    (``'cat'``, ``'2.5'``, ``-1``) is mapped to the index of its value among the sorted distinct
    values (the labels only feed the evaluation's contingency tables)."""
    values = np.asarray(values).ravel()
    try:
        nums = values.astype(np.float64)
    except ValueError:
        nums = None
    if (nums is not None and np.all(np.isfinite(nums)) and np.all(nums == np.round(nums))
            and (nums.size == 0 or nums.min() >= 0)):
        return nums.astype(np.int64)
    _, index = np.unique(values.astype(str), return_inverse=True)
    return index.astype(np.int64)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
