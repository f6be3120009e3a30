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
            y = z["y"].astype(np.int64) if "y" in z else None
        return x, y
    if fmt == "npy":
        x = np.load(p)
        return x.reshape(len(x), -1).astype(np.float64), None
    if fmt in ("csv", "tsv", "txt"):
        delim = "\t" if fmt == "tsv" else ","
        with open(p) as fh:
            first = fh.readline().strip().split(delim)
        has_header = not _is_number(first[0]) if first and first[0] else False
        arr = np.loadtxt(p, delimiter=delim, skiprows=int(has_header), ndmin=2)
        if label_column != "":
            col = first.index(label_column) if has_header and label_column in first else int(
                label_column)
            y = arr[:, col].astype(np.int64)
            return np.delete(arr, col, axis=1), y
        return arr, None
    raise LocalDataError(f"unsupported data format {fmt!r} for {p}. Allowed: npz, npy, csv, tsv, "
                         f"images (a folder). Fix: set node config 'data-format'.")


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".pgm")


def load_image_folder(root: Path) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """Images under ``root`` (recursively): grey-scaled, flattened, scaled to [0, 1].

    ``root/<class>/*.png`` gives evaluation labels (class folders sorted by name); images
    directly in ``root`` have none. All images must have the same size.
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
    if all(f.parent != root for f in files):
        classes = sorted({f.parent.name for f in files})
        index = {c: i for i, c in enumerate(classes)}
        return x, np.array([index[f.parent.name] for f in files], dtype=np.int64)
    return x, None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
