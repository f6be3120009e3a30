"""Data an edge device owns: load a node's local table from ``data-path`` (deployment).

Formats (inferred from the suffix or given as ``data-format``): a folder of images
(``images``; ``<class>/`` subfolders give evaluation labels), ``.npz`` with array ``x``
(and optional ``y`` for evaluation), ``.npy`` (features only), ``.csv``/``.tsv``/``.txt``
(numeric, with or without a header; ``label-column`` names/indexes an optional ground-truth
column that is removed from the features), ``.parquet``/``.pq`` (numeric columns and an optional
``label-column`` of any type; needs pyarrow). The separator of a delimited file is detected
(comma, semicolon, tab or spaces; the suffix's own separator wins a tie), and so is a decimal
comma (``1,5`` in a ``;``- or tab-separated file).

Everything is checked at the door and refused with a :class:`LocalDataError` whose message is
**data-free and path-free**: messages end up in the server's logs, so they name the place by
its kind (``data-path (a .csv file)``, ``image 3 of 12``), row and column numbers (1-based),
counts and the fix, and never quote a cell, a label, a header name the user did not configure,
a line or bytes of the file (nor the text of a numpy/zipfile/Pillow exception, which may quote
them), nor the file's path or name. The exception's ``detail`` adds the path for the node's own
log. Refused: paths that are not regular files (devices, FIFOs, sockets, links to them,
symbolic link loops) and files over ``max_bytes`` (default :data:`MAX_BYTES`); malformed or
pickled ``.npz``/``.npy``; empty tables (no rows or no feature columns); duplicate header
names; ragged rows; non-numeric cells; non-finite values and values with ``|x| > MAX_ABS``
(their squares overflow); ``y`` of another length than ``x``; image modes other than
1/L/LA/P/PA/RGB/RGBA/RGBX/CMYK/YCbCr (8-bit, divided by 255) and 16-bit greyscale (``I;16*``,
and ``I`` with values in 0..65535: divided by 65535).

Image-like node data (FedCRef, EMD-CFL) goes through the same door: :func:`load_pixel_table`
(any format above, pixel values in [0, 1] or [0, 255]) and :func:`load_image_arrays` (named
arrays of an ``.npz``: images of given shapes, class labels in a given range).

Evaluation labels: :func:`label_codes` gives every label the same code on every node
(``stable_labels=True``); the default still returns the former small per-node indices until the
evaluation path compacts stable codes (:func:`compact_codes`).
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import stat
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.errors import BadInputError

MAX_BYTES = 2 * 1024 ** 3
"""Default size limit of a node's data (a file, or all images of a folder together)."""

MAX_ABS = 1e150
"""Largest magnitude accepted for a feature value (squares and sums of squares stay finite)."""

TEXT_CODE_BASE = 2 ** 30
"""Label codes below this are the labels' own non-negative integers; codes in
``[TEXT_CODE_BASE, 2 * TEXT_CODE_BASE)`` are hashes of text labels (see :func:`label_codes`)."""

PIXEL_MAX = 255.0
"""Largest pixel value of image-like data (8-bit scale; data in [0, 1] is taken as is)."""

MAX_CLASS = 65_535
"""Largest class number of image-like data's labels (they index per-class tables)."""

SUFFIXES = (".csv", ".tsv", ".txt", ".npz", ".npy", ".parquet", ".pq")
"""File suffixes of the formats :func:`load_local_table` reads (besides image folders)."""


FORMATS = ("npz", "npy", "csv", "tsv", "txt", "parquet")
"""The file formats of ``data-format`` (``pq`` is ``parquet``; a folder is ``images``)."""


class LocalDataError(BadInputError, ValueError):
    """A node's local data is missing, unreadable or invalid.

    ``str(exc)`` is data-free and path-free (it may reach the server, see the module
    docstring); ``detail`` is the same problem with the file's path, for the node's own log.
    """

    data_free = True

    def __init__(self, message: str, detail: str | None = None) -> None:
        super().__init__(message)
        self.detail = message if detail is None else detail


def _public(p: Path) -> str:
    """How a public message names the node's data: by its kind, never by its path or name."""
    suffix = p.suffix.lower()
    return f"data-path (a {suffix} file)" if suffix in SUFFIXES else "data-path"


def _fail(p: Path, problem: str, name: str | None = None) -> LocalDataError:
    """A refusal: ``name`` (default :func:`_public` of ``p``) and ``problem`` in public; the
    path of ``p`` instead of ``name`` in the detail for the node's log."""
    return LocalDataError(f"{name or _public(p)}: {problem}", f"{p}: {problem}")


def load_local_table(path: str, data_format: str = "", label_column: str = "",
                     max_bytes: int = MAX_BYTES, stable_labels: bool = False
                     ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """Return ``(x, y_eval_or_None)`` from a node's own file, validated (module docstring).

    ``x`` is float64 of shape ``(rows ≥ 1, features ≥ 1)``, all finite with ``|x| ≤ MAX_ABS``;
    ``y`` (one label per row, or None) is validated by :func:`label_codes` in every case and is

    - with ``stable_labels=True``: :func:`label_codes` — the same code for a label on every
      node, but sparse (text labels get codes ≥ 2**30): the caller must compact them
      (:func:`compact_codes`) before sizing any table by them;
    - by default: small per-node indices, as before (non-negative integer labels kept, other
      labels: their index among this node's sorted distinct values; image classes: index of
      the class folder). These are NOT comparable across nodes that hold different label
      sets; they are kept until the evaluation path compacts stable codes, because tables
      sized ``y.max() + 1`` with stable codes would need ~2**31 rows.

    Raises
    ------
    LocalDataError
        Data-free and path-free message; ``detail`` names the path.
    """
    p = Path(path).expanduser()
    _check_not_a_loop(p)
    if not p.exists() and not p.is_symlink():
        raise LocalDataError(
            "node config 'data-path' does not exist on this node (no file or folder at that "
            "path). Fix: flower-supernode --node-config 'data-path=\"/abs/file.csv\"'.",
            f"node config 'data-path' = {path!r} does not exist on this node")
    fmt = (data_format or ("images" if p.is_dir() else p.suffix.lstrip("."))).lower()
    if fmt == "images":
        if not p.is_dir():
            raise _fail(p, "is not a folder; data-format 'images' needs a folder of image "
                           "files. Fix: point 'data-path' at the image folder")
        return load_image_folder(p, max_bytes, stable_labels)
    fmt = "parquet" if fmt == "pq" else fmt
    if fmt not in FORMATS:
        given = (f"node config 'data-format' = {data_format!r} is not a known format" if
                 data_format else "its name ends in no known suffix")
        raise _fail(p, f"unsupported data format: {given}. Allowed: {', '.join(FORMATS)}, "
                       f"images (a folder). Fix: rename the file or set node config "
                       f"'data-format'")
    _check_regular_file(p, max_bytes)
    if fmt == "parquet":
        return _load_parquet(p, label_column, max_bytes, stable_labels)
    if fmt == "npz":
        return _load_npz(p, max_bytes, stable_labels)
    if fmt == "npy":
        return _check_features(_load_npy(p, max_bytes), p), None
    return _load_delimited(p, "\t" if fmt == "tsv" else ",", label_column, stable_labels)


# --------------------------------------------------------------------------- file checks

def feature_names(path: str, data_format: str = "", label_column: str = "") -> list[str] | None:
    """The feature column names of a node's table, in file order, without the label column
    (None: the file has no header row, or is no table: ``.npz``, ``.npy``, images). Call it
    after :func:`load_local_table` accepted the file."""
    p = Path(path).expanduser()
    fmt = (data_format or ("images" if p.is_dir() else p.suffix.lstrip("."))).lower()
    if fmt in ("parquet", "pq"):
        schema = _parquet_file(p).schema_arrow
        index, names = set(_pandas_index(schema)), list(schema.names)
        col = (None if label_column == "" else
               _label_index(p, names, len(names), True, label_column))
        return [n for i, n in enumerate(names) if i != col and n not in index]
    if fmt not in ("csv", "tsv", "txt"):
        return None
    delim, comma = _sniff(p, "\t" if fmt == "tsv" else ",")
    _, first = _first_data_line(p, delim)
    if not first or not _unquote(first[0]) or _number(first[0], comma):
        return None
    names = [_unquote(c) for c in first]
    if label_column != "":
        del names[_label_index(p, names, len(names), True, label_column)]
    return names


def names_digest(names: Sequence[str] | None) -> int:
    """A 62-bit digest of column names in order (0: no names), compared across nodes: the
    names themselves never leave a node."""
    if not names:
        return 0
    joined = "\x1f".join(n.strip().casefold() for n in names)
    return 1 + int.from_bytes(hashlib.blake2b(joined.encode("utf-8", "surrogatepass"),
                                              digest_size=8).digest(), "big") % (2**62 - 1)


def _is_loop(p: Path) -> bool:
    """Whether resolving ``p`` runs into a symbolic link loop."""
    try:
        os.stat(p)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


def _check_not_a_loop(p: Path, name: str | None = None) -> None:
    if _is_loop(p):
        raise _fail(p, "is a symbolic link loop (following its links comes back to a link "
                       "already seen; it names no file). Fix: point 'data-path' at the data "
                       "file or folder itself", name)


def _check_regular_file(p: Path, max_bytes: int, name: str | None = None) -> int:
    """The size of ``p`` if it is a regular file (after links) of at most ``max_bytes``."""
    link = " (a symbolic link)" if p.is_symlink() else ""
    _check_not_a_loop(p, name)
    try:
        st = os.stat(p)
    except OSError:
        raise _fail(p, f"cannot be opened{link}: it is a broken link or not accessible. Fix: "
                       f"point 'data-path' at a readable file", name) from None
    if stat.S_ISDIR(st.st_mode):
        raise _fail(p, f"is a folder{link}, not a data file. Allowed: a csv/tsv/txt/npz/npy/"
                       f"parquet file, or data-format 'images' for a folder of images", name)
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "not a regular file")
        target = "is a symbolic link that points to" if link else "is"
        raise _fail(p, f"{target} {kind}, not a regular file. Allowed: a regular file. Fix: "
                       f"copy the data into a regular file", name)
    if st.st_size > max_bytes:
        raise _fail(p, f"is {st.st_size} bytes, over the limit of {max_bytes} bytes. Fix: "
                       f"split the data or raise the limit (max_bytes)", name)
    return int(st.st_size)


def _check_features(x: np.ndarray, p: Path, rows: list[int] | None = None,
                    what: str = "x") -> NDArray[np.float64]:
    """``x`` as a float64 table ``(n ≥ 1, f ≥ 1)``, finite, ``|x| ≤ MAX_ABS``.

    ``rows`` (csv): the 1-based file line of every data row, to name the line at fault.
    """
    kind = x.dtype.kind
    if kind not in "biuf":
        raise _fail(p, f"{what} has dtype {x.dtype}, not a real number type. Fix: save the "
                       f"features as a numeric (int or float) array")
    if x.ndim == 0:
        raise _fail(p, f"{what} is a single number, not a table. Fix: save an array of shape "
                       f"(rows, features)")
    if x.shape[0] == 0:
        raise _fail(p, f"no data rows ({what} has shape {x.shape}). Fix: give this node at "
                       f"least one row")
    x = x.reshape(x.shape[0], -1)
    if x.shape[1] == 0:
        raise _fail(p, f"no feature columns ({what} has shape {x.shape}). Fix: give every row "
                       f"at least one feature")
    x = x.astype(np.float64)
    if kind == "f":
        with np.errstate(invalid="ignore"):
            bad = ~(np.abs(x) <= MAX_ABS)     # NaN, ±inf and huge values
        if bad.any():
            r, c = (int(i) for i in np.argwhere(bad)[0])
            nonfinite = not np.isfinite(x[r, c])
            where = (f"line {rows[r]} (data row {r + 1}), column {c + 1}" if rows is not None
                     else f"{what} row {r + 1}, column {c + 1}")
            problem = ("is not a finite number (NaN or infinite)" if nonfinite else
                       f"has a magnitude above {MAX_ABS:g} (its square overflows)")
            raise _fail(p, f"{where} {problem}; {int(bad.sum())} cell(s) in all (rows and "
                           f"columns are 1-based). Fix: fill or drop missing values and "
                           f"rescale such features before federating")
    return x


# --------------------------------------------------------------------------- parquet

def _parquet_file(p: Path):
    """``pyarrow.parquet.ParquetFile`` of ``p`` (its schema and metadata; nothing read yet)."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise _fail(p, "is a Parquet file, which needs the pyarrow package, not installed "
                       "where this data is read. Fix: pip install pyarrow (or "
                       "'fedclust[hf]'), or save the data as .csv or .npz") from None
    try:
        return pq.ParquetFile(p)
    except Exception:     # noqa: BLE001 - pyarrow's text may quote the bytes
        raise _fail(p, "is not a readable Parquet file (damaged, or another format). Fix: "
                       "write it again with pandas' DataFrame.to_parquet or pyarrow") from None


def _pandas_index(schema) -> list[str]:
    """The columns pandas' ``to_parquet`` stored a DataFrame's index in (not features)."""
    try:
        meta = schema.pandas_metadata or {}
    except Exception:     # noqa: BLE001 - malformed metadata: no index columns
        return []
    return [c for c in meta.get("index_columns", []) if isinstance(c, str)]


def _numeric_arrow(kind: object) -> bool:
    import pyarrow.types as pt

    return bool(pt.is_integer(kind) or pt.is_floating(kind) or pt.is_boolean(kind)
                or pt.is_decimal(kind))


def _load_parquet(p: Path, label_column: str, max_bytes: int, stable_labels: bool
                  ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """A Parquet table: numeric feature columns (nulls refused as missing values), and the
    optional ``label_column`` (a column name or index) of any type. Its uncompressed size is
    checked against ``max_bytes`` before anything is read."""
    pf = _parquet_file(p)
    total = sum(pf.metadata.row_group(i).total_byte_size for i in range(pf.num_row_groups))
    if total > max_bytes:
        raise _fail(p, f"unpacks to {total} bytes, over the limit of {max_bytes} bytes. Fix: "
                       f"split the data or raise the limit (max_bytes)")
    schema = pf.schema_arrow
    names = list(schema.names)
    index = set(_pandas_index(schema))
    _check_unique_names(p, names, label_column)
    col = None if label_column == "" else _label_index(p, names, len(names), True,
                                                         label_column)
    features = [i for i in range(len(names)) if i != col and names[i] not in index]
    if not features:
        raise _fail(p, "no feature columns (only the label column). Fix: give every row at "
                       "least one numeric feature")
    odd = [i for i in features if not _numeric_arrow(schema.field(i).type)]
    if odd:
        hint = ("only the label column may hold text" if col is not None else
                "a text column holding labels must be named in node config 'label-column'")
        raise _fail(p, f"column {odd[0] + 1} is not numeric ({len(odd)} such column(s); "
                       f"{hint}). Allowed: numeric feature columns. Fix: drop or encode them")
    try:
        table = pf.read()
    except Exception:     # noqa: BLE001
        raise _fail(p, "is a damaged Parquet file. Fix: write it again") from None
    gaps = [(i, table.column(i).null_count) for i in range(len(names))
            if table.column(i).null_count]
    if gaps:
        i, n = gaps[0]
        what = "the label column" if i == col else f"column {i + 1}"
        raise _fail(p, f"{what} has {n} missing value(s) (null); {len(gaps)} column(s) with "
                       f"gaps in all. Fix: fill or drop the rows with missing values")
    x = np.column_stack([table.column(i).to_numpy(zero_copy_only=False).astype(np.float64)
                         for i in features]) if table.num_rows else np.zeros((0, len(features)))
    x = _check_features(x, p)
    if col is None:
        return x, None
    return x, _labels(table.column(col).to_pylist(), f"{_public(p)}: label column {col + 1}",
                      stable_labels, p)


# --------------------------------------------------------------------------- npz / npy

def _npz_arrays(p: Path, max_bytes: int, required: Sequence[str], optional: Sequence[str] = ()
                ) -> dict[str, np.ndarray]:
    """The arrays ``required`` (all) and ``optional`` (those present) of the archive ``p``,
    unpacked only after their sizes are checked; no pickles."""
    hint = "numpy.savez(path, " + ", ".join(f"{n}=..." for n in required) + ")"
    if not zipfile.is_zipfile(p):
        raise _fail(p, f"is not a valid .npz archive (not a zip file, or cut short). Fix: "
                       f"write it with {hint}")
    try:
        with zipfile.ZipFile(p) as zf:
            infos = {i.filename: i for i in zf.infolist()}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise _fail(p, "is a damaged .npz archive. Fix: write it again with numpy.savez"
                    ) from None
    names = sorted(n[:-4] for n in infos if n.endswith(".npy"))
    missing = [n for n in required if n not in names]
    if missing:
        known = [n for n in names if n in (*required, *optional)]
        raise _fail(p, f"has {len(names)} array(s){f' (of the expected: {known})' if known else ''}"
                       f" but lacks {missing}. Allowed: arrays {list(required)}"
                       f"{f' and optional {list(optional)}' if optional else ''}. Fix: {hint}")
    wanted = [n for n in (*required, *optional) if n in names]
    total = 0
    for name in wanted:
        size = infos[f"{name}.npy"].file_size
        total += size
        if size > max_bytes or total > max_bytes:
            raise _fail(p, f"array {name!r} unpacks to {size} bytes ({total} with the arrays "
                           f"before it), over the limit of {max_bytes} bytes. Fix: split the "
                           f"data or raise the limit (max_bytes)")
    try:
        with np.load(p, allow_pickle=False) as z:
            return {name: _read_member(z, name, p) for name in wanted}
    except LocalDataError:
        raise
    except Exception:     # noqa: BLE001 - any numpy/zipfile error text may quote the bytes
        raise _fail(p, "is a damaged .npz archive. Fix: write it again with numpy.savez"
                    ) from None


def _load_npz(p: Path, max_bytes: int, stable_labels: bool = False
              ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    arrays = _npz_arrays(p, max_bytes, ("x",), ("y",))
    x = _check_features(arrays["x"], p)
    y = arrays.get("y")
    if y is None:
        return x, None
    _check_label_shape(p, y, "y", x.shape[0], "x")
    return x, _labels(y.reshape(-1), f"{_public(p)}: 'y'", stable_labels, p)


def _check_label_shape(p: Path, y: np.ndarray, name: str, rows: int, of: str) -> None:
    if y.ndim == 0 or y.reshape(y.shape[0], -1).shape[1] != 1:
        raise _fail(p, f"{name!r} has shape {y.shape}; expected one label per row, shape "
                       f"({rows},)")
    if y.shape[0] != rows:
        raise _fail(p, f"{name!r} has {y.shape[0]} labels but {of!r} has {rows} rows. Fix: "
                       f"save one label per row of {of}")


def _read_member(z, name: str, p: Path) -> np.ndarray:
    try:
        return np.asarray(z[name])
    except ValueError as exc:
        if "pickle" in str(exc):
            raise _fail(p, f"array {name!r} holds Python objects (pickled data), which are "
                           f"refused. Fix: save numbers (x) and numbers or strings (y)"
                        ) from None
        raise _fail(p, f"array {name!r} is malformed. Fix: write the file again with "
                       f"numpy.savez") from None


def _load_npy(p: Path, max_bytes: int) -> np.ndarray:
    """The array of an ``.npy`` file (its size already checked), read in one pass: the header
    is parsed by numpy's own reader (once per layout, :mod:`fedclust.npy`), then the values."""
    from fedclust import npy

    with open(p, "rb") as fh:
        data = fh.read()
    if data[:2] == b"PK":
        raise _fail(p, "is an .npz archive, not an .npy array. Fix: rename it to .npz (or "
                       "set data-format 'npz')")
    if data[:6] != b"\x93NUMPY":
        raise _fail(p, "is not an .npy array (no NumPy header). Fix: write it with "
                       "numpy.save(path, features)")
    try:
        found = npy.layout(data)
    except Exception:     # noqa: BLE001 - keep numpy's text (it may quote bytes) out
        raise _fail(p, "has a malformed .npy header. Fix: write it again with numpy.save"
                    ) from None
    if found is not None:
        offset, (dtype, shape, _) = found
        if dtype.hasobject:
            raise _fail(p, "holds Python objects (pickled data), which are refused. Fix: save "
                           "a numeric array")
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if need > max_bytes:
            raise _fail(p, f"the array is {need} bytes, over the limit of {max_bytes} bytes. "
                           f"Fix: split the data or raise the limit (max_bytes)")
        if need > len(data) - offset:
            raise _fail(p, f"is truncated: its header announces shape {shape} but the file is "
                           f"shorter. Fix: write it again with numpy.save")
    try:
        return npy.loads(data)
    except ValueError as exc:
        if "pickle" in str(exc):
            raise _fail(p, "holds Python objects (pickled data), which are refused. Fix: save "
                           "a numeric array") from None
        raise _fail(p, "is a malformed .npy array. Fix: write it again with numpy.save"
                    ) from None
    except Exception:     # noqa: BLE001
        raise _fail(p, "is a malformed .npy array. Fix: write it again with numpy.save"
                    ) from None


# --------------------------------------------------------------------------- images

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".pgm")
MODES_8BIT = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr")
MODES_16BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")
FOLDER = "data-path (an image folder)"


def _image_name(f: Path, i: int, n: int) -> str:
    """Public name of the ``i``-th (0-based) of ``n`` images in sorted order."""
    return f"{FOLDER}, image {i + 1} of {n} (a {f.suffix.lower()} file, in sorted order)"


def load_image_folder(root: Path, max_bytes: int = MAX_BYTES, stable_labels: bool = False
                      ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """Images under ``root`` (recursively): grey-scaled, flattened, scaled to [0, 1].

    8-bit modes (colour through ``convert("L")``, palettes included) are divided by 255;
    16-bit greyscale (``I;16``…, or ``I`` with values in 0..65535) by 65535. Every entry with
    an image suffix must be a regular file (links to one are fine); their total size is at most
    ``max_bytes``.

    ``root/<class>/…/*.png`` gives evaluation labels: the class is the *first* folder under
    ``root`` (deeper sub-folders are part of that class); the label is the index of the class
    folder among the sorted class folders, or with ``stable_labels`` :func:`label_codes` of the
    folder name (the same code on every node; folders ``0``, ``1``, … keep their numbers). If
    any image lies directly in ``root``, there are no labels. All images must have the same
    size.
    """
    from PIL import Image

    files = sorted(f for f in root.rglob("*") if f.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        raise _fail(root, f"no images ({', '.join(IMAGE_SUFFIXES)}) in the folder or its "
                          f"sub-folders. Fix: point 'data-path' at the image folder", FOLDER)
    total = 0
    for i, f in enumerate(files):
        total += _check_regular_file(f, max_bytes, _image_name(f, i, len(files)))
    if total > max_bytes:
        raise _fail(root, f"the {len(files)} images are {total} bytes together, over the limit "
                          f"of {max_bytes} bytes. Fix: split the data or raise the limit "
                          f"(max_bytes)", FOLDER)
    arrays = [_grey_unit(f, Image, _image_name(f, i, len(files))) for i, f in enumerate(files)]
    shapes = sorted({a.shape for a in arrays})
    if len(shapes) > 1:
        first = next(i for i, a in enumerate(arrays) if a.shape != arrays[0].shape)
        raise _fail(root, f"the images have {len(shapes)} different sizes {shapes} (image 1 is "
                          f"{arrays[0].shape}, image {first + 1} is {arrays[first].shape}, in "
                          f"sorted order); resize them to one size first", FOLDER)
    x = np.stack([a.ravel() for a in arrays])
    parts = [f.relative_to(root).parts for f in files]
    if all(len(q) > 1 for q in parts):   # the class is the first folder under root
        names = np.array([q[0] for q in parts])
        codes = _codes(names, f"{FOLDER}: class folders", root)
        if stable_labels:
            return x, codes
        return x, np.unique(names, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return x, None


def _grey_unit(f: Path, Image, name: str) -> NDArray[np.float64]:
    """One image as float64 grey values in [0, 1] (see :func:`load_image_folder`)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(f) as img:
                mode = img.mode
                if mode in MODES_8BIT:
                    return np.asarray(img.convert("L"), dtype=np.float64) / 255.0
                if mode in MODES_16BIT:
                    a = np.asarray(img)
                    a = a.astype(np.float64)
                    if a.size and (a.min() < 0 or a.max() > 65535):
                        raise _fail(f, "32-bit integer image (mode 'I') with values outside "
                                       "0..65535. Allowed: 8-bit or 16-bit images. Fix: save "
                                       "it as 8-bit or 16-bit greyscale", name)
                    return a / 65535.0
    except LocalDataError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise _fail(f, f"the image has too many pixels (over Pillow's limit of "
                       f"{Image.MAX_IMAGE_PIXELS}). Fix: downscale it", name) from None
    except Exception:     # noqa: BLE001 - Pillow's text is not ours to pass on
        raise _fail(f, "cannot be read as an image (damaged or not an image). Fix: re-save "
                       "it, or move it out of the data folder", name) from None
    raise _fail(f, f"image mode {mode!r} is not supported. Allowed: {', '.join(MODES_8BIT)} "
                   f"(8-bit), {', '.join(MODES_16BIT)} (16-bit greyscale). Fix: save it as "
                   f"8-bit or 16-bit greyscale or RGB", name)


# --------------------------------------------------------------------------- image-like data

def _pixel_problem(x: np.ndarray) -> tuple[int, tuple[int, ...]] | None:
    """``(count, first index)`` of the values of ``x`` outside [0, PIXEL_MAX] (NaN included),
    or None."""
    with np.errstate(invalid="ignore"):
        bad = ~((x >= 0) & (x <= PIXEL_MAX))
    if not bad.any():
        return None
    return int(bad.sum()), tuple(int(i) + 1 for i in np.argwhere(bad)[0])


def load_pixel_table(path: str, data_format: str = "", label_column: str = "",
                     max_bytes: int = MAX_BYTES
                     ) -> tuple[NDArray[np.float32], NDArray[np.int64] | None]:
    """A node's image-like data as FedCRef's autoencoders take it, through the checks of
    :func:`load_local_table` (any of its formats) and these:

    - pixel values in [0, 1] or [0, 255] (all finite); the table is divided by 255 when any
      value is above 1;
    - labels (evaluation and the simulated ``dirty`` start only), when present: class numbers
      0..:data:`MAX_CLASS`, equal on every node (they index the per-class tables the server
      adds up).

    Returns
    -------
    x : float32 (rows, features), in [0, 1]
    y : int64 (rows,) or None
    """
    x, y = load_local_table(path, data_format, label_column, max_bytes, stable_labels=True)
    p = Path(path).expanduser()
    bad = _pixel_problem(x)
    if bad is not None:
        count, (r, c) = bad
        raise _fail(p, f"row {r}, column {c} is not a pixel value; {count} value(s) in all "
                       f"are outside [0, {PIXEL_MAX:g}]. Allowed: pixel values in [0, 1] or "
                       f"[0, 255]. Fix: save the images as 8-bit values or scaled to [0, 1]")
    x32 = x.astype(np.float32)
    if x32.size and x32.max() > 1.0:
        x32 = x32 / np.float32(PIXEL_MAX)    # in float32, as the simulated clients' pixels
    if y is not None:
        _check_class_numbers(p, y, "labels", MAX_CLASS + 1)
    return x32, y


def _check_class_numbers(p: Path, y: np.ndarray, name: str, n_classes: int) -> None:
    """``y`` (codes of :func:`label_codes`) are class numbers ``0..n_classes-1``."""
    bad = (y < 0) | (y >= n_classes)
    if bad.any():
        r = int(np.argmax(bad))
        raise _fail(p, f"{name}: the label of row {r + 1} is not a class number in "
                       f"0..{n_classes - 1}; {int(bad.sum())} label(s) in all. Allowed: class "
                       f"numbers 0..{n_classes - 1} (the same on every node). Fix: number the "
                       f"classes 0, 1, 2, … (or leave the labels out)")


def load_image_arrays(path: str, images: Mapping[str, str], image_shapes: Sequence[tuple],
                      n_classes: int, optional: Sequence[str] = (),
                      max_bytes: int = MAX_BYTES) -> dict[str, np.ndarray]:
    """Named image and label arrays of a node's ``.npz`` (EMD-CFL's train/validation/test
    splits), with the door's checks.

    Parameters
    ----------
    path : str
        The node's ``data-path`` (an ``.npz``; the file checks of :func:`load_local_table`).
    images : mapping
        Image array name → the name of its label array (``{"x_train": "y_train", …}``); all
        required.
    image_shapes : sequence of tuple
        Allowed shapes of one image (e.g. ``[(28, 28)]`` or ``[(28, 28, 3)]``).
    n_classes : int
        Labels must be class numbers ``0..n_classes-1``.
    optional : sequence of str
        Other arrays to return when present; each must be a single integer (e.g. a node's
        ground-truth group ``cluster``, evaluation only).

    Returns
    -------
    dict
        Image arrays ``(rows ≥ 1, *shape)`` with values in [0, 255] (uint8 kept, other
        types as float32), label
        arrays ``int64 (rows,)``, and the optional integers present as 0-d int64 arrays.
    """
    p = Path(path).expanduser()
    _check_not_a_loop(p)
    if not p.exists() and not p.is_symlink():
        raise LocalDataError(
            "node config 'data-path' does not exist on this node (no file at that path). Fix: "
            "flower-supernode --node-config 'data-path=\"/abs/client.npz\"'.",
            f"node config 'data-path' = {path!r} does not exist on this node")
    if p.is_dir() or p.suffix.lower() != ".npz":
        raise _fail(p, f"is not an .npz file. Allowed: an .npz with arrays "
                       f"{', '.join(k for pair in images.items() for k in pair)}. Fix: write "
                       f"it with numpy.savez")
    _check_regular_file(p, max_bytes)
    required = [k for pair in images.items() for k in pair]
    arrays = _npz_arrays(p, max_bytes, required, optional)
    shapes = [tuple(int(v) for v in s) for s in image_shapes]
    out: dict[str, np.ndarray] = {}
    for name, label_name in images.items():
        x = arrays[name]
        if x.dtype.kind not in "biuf":
            raise _fail(p, f"{name!r} has dtype {x.dtype}, not a real number type. Fix: save "
                           f"the images as numbers (uint8 0..255, or floats)")
        if x.ndim < 1 or x.shape[0] == 0:
            raise _fail(p, f"{name!r} has shape {x.shape}: no images. Fix: give this node at "
                           f"least one image in every split")
        if tuple(x.shape[1:]) not in shapes:
            raise _fail(p, f"{name!r} has shape {x.shape}: images of shape "
                           f"{tuple(x.shape[1:])}. Allowed: (rows, "
                           f"{' or '.join(str(s)[1:-1] for s in shapes)}) for this run's "
                           f"model. Fix: resize the images, or choose the run's dataset to "
                           f"match them")
        bad = _pixel_problem(x)
        if bad is not None:
            count, index = bad
            raise _fail(p, f"{name!r} image {index[0]} holds a value that is not a pixel value "
                           f"(NaN, infinite, or outside [0, {PIXEL_MAX:g}]); {count} value(s) "
                           f"in all. Allowed: pixel values 0..255. Fix: save 8-bit images")
        y = arrays[label_name]
        _check_label_shape(p, y, label_name, x.shape[0], name)
        codes = _codes(y.reshape(-1), f"{_public(p)}: {label_name!r}", p)
        _check_class_numbers(p, codes, repr(label_name), n_classes)
        out[name] = x if x.dtype == np.uint8 else x.astype(np.float32)
        out[label_name] = codes
    for name in optional:
        if name in arrays:
            v = arrays[name]
            if v.dtype.kind not in "biu" or v.size != 1:
                raise _fail(p, f"{name!r} has dtype {v.dtype} and shape {v.shape}. Allowed: "
                               f"one integer. Fix: numpy.savez(..., {name}=3)")
            out[name] = np.asarray(int(v.reshape(-1)[0]), dtype=np.int64)
    return out


# --------------------------------------------------------------------------- csv / tsv

SEPARATORS: dict[str | None, str] = {",": "commas", ";": "semicolons", "\t": "tabs",
                                     None: "spaces"}
SNIFF_LINES = 200
_DECIMAL_COMMA = re.compile(r"^\s*[-+]?\d*,\d+(?:[eE][-+]?\d+)?\s*$")


def _split(line: str, delim: str | None) -> list[str]:
    return line.split(delim) if delim is not None else line.split()


def _data_lines(p: Path, delim: str | None, skip: int):
    """``(line number, cells)`` of the data lines as ``numpy.loadtxt`` reads them: the first
    ``skip`` lines are skipped, ``#`` starts a comment, lines empty after that are skipped."""
    with open(p, encoding="utf-8-sig", newline=None) as fh:
        for number, line in enumerate(fh, 1):
            if number <= skip:
                continue
            line = line.rstrip("\r\n").split("#", 1)[0]
            if line == "" or (delim is None and line.strip() == ""):
                continue
            yield number, _split(line, delim)


def _line_numbers(p: Path, delim: str | None, skip: int) -> list[int]:
    return [number for number, _ in _data_lines(p, delim, skip)]


def _number(text: str, decimal_comma: bool) -> bool:
    text = _unquote(text)
    return _is_number(text.replace(",", ".") if decimal_comma else text)


def _unquote(cell: str) -> str:
    """A cell without the double quotes a CSV writer may put around any field."""
    cell = cell.strip()
    return cell[1:-1].replace('""', '"') if len(cell) >= 2 and cell[0] == cell[-1] == '"' \
        else cell


def _sniff(p: Path, preferred: str) -> tuple[str | None, bool]:
    """``(separator, decimal comma)`` of a delimited file, from its first data lines.

    Each candidate separator (the suffix's first, then comma, semicolon, tab, spaces) splits
    the lines; it counts if most lines then have one width of at least 2 columns. Its score is
    the share of lines of that width times the share of their cells (below a header) that are
    numbers, with a decimal comma where that reads more of them. The best score wins; the
    suffix's separator wins ties, and a file of one column keeps it.
    """
    lines = []
    with open(p, encoding="utf-8-sig", newline=None) as fh:
        for line in fh:
            line = line.rstrip("\r\n").split("#", 1)[0]
            if line.strip():
                lines.append(line)
                if len(lines) == SNIFF_LINES:
                    break
    best: tuple[float, str | None, bool] = (0.0, preferred, False)
    for delim in dict.fromkeys((preferred, ",", ";", "\t", None)):
        rows = [_split(line, delim) for line in lines]
        widths = [len(r) for r in rows]
        width = max(set(widths), key=widths.count) if widths else 0
        if width < 2:
            continue
        share = widths.count(width) / len(widths)
        comma = delim != "," and any(_DECIMAL_COMMA.match(c) for r in rows for c in r)
        header = not _number(rows[0][0], comma)
        cells = [c for r in rows[int(header):] if len(r) == width for c in r]
        if not cells:
            cells = rows[0]
        numeric = sum(_number(c, comma) for c in cells) / len(cells)
        if share * numeric > best[0]:
            best = (share * numeric, delim, comma)
    return best[1], best[2]


def _read_as(delim: str | None, decimal_comma: bool) -> str:
    """How a file was read, for messages (separators are not data)."""
    return (f"read as separated by {SEPARATORS[delim]}"
            + (" with decimal commas" if decimal_comma else ""))


def _locate(p: Path, delim: str | None, skip: int, label_col: int | None,
            decimal_comma: bool = False) -> LocalDataError:
    """A data-free error for the first ragged line or non-numeric cell of ``p``."""
    width, first_line = None, 0
    how = _read_as(delim, decimal_comma)
    for number, cells in _data_lines(p, delim, skip):
        if width is None:
            width, first_line = len(cells), number
        elif len(cells) != width:
            return _fail(p, f"line {number} has {len(cells)} field(s) but line {first_line} "
                            f"has {width} ({how}). Allowed: the same number of columns on "
                            f"every line. Fix: fill in or remove that line")
        for c, cell in enumerate(cells):
            if c == label_col:
                continue
            if cell.strip() == "":
                return _fail(p, f"line {number}, column {c + 1} is empty ({how}). Fix: fill in "
                                f"missing values (or drop that row)")
            if not _number(cell, decimal_comma):
                hint = ("only the label column may hold text" if label_col is not None else
                        f"a text column holding labels must be named in node config "
                        f"'label-column' (this column is label-column={c})")
                return _fail(p, f"line {number}, column {c + 1} is not a number ({how}). "
                                f"Every feature must be a number; {hint}")
    return _fail(p, f"cannot be read as a numeric table ({how}). Fix: save it as plain numbers "
                    f"separated by commas")


def _load_delimited(p: Path, delim: str, label_column: str, stable_labels: bool = False
                    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """A numeric CSV/TSV (separator and decimal comma detected, :func:`_sniff`; header detected
    when its first cell is not a number); the optional ``label_column`` (header name or
    0-based index) may hold numbers or strings."""
    try:
        return _parse_delimited(p, delim, label_column, stable_labels)
    except UnicodeDecodeError:      # its text quotes the bytes: not passed on
        raise _fail(p, "is not UTF-8 text. Fix: save it as UTF-8 (plain text numbers)"
                    ) from None


def _first_data_line(p: Path, delim: str | None) -> tuple[int, list[str]]:
    """``(line number, cells)`` of the first line that is not empty or a comment (0, [])."""
    lines = _data_lines(p, delim, 0)
    try:
        return next(lines, (0, []))
    finally:
        lines.close()


def _parse_delimited(p: Path, preferred: str, label_column: str, stable_labels: bool
                     ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    if os.stat(p).st_size == 0:
        raise _fail(p, "is empty (no rows, no columns). Fix: give this node data")
    delim, comma = _sniff(p, preferred)
    number, first = _first_data_line(p, delim)
    has_header = bool(first and _unquote(first[0])) and not _number(first[0], comma)
    skip = number if has_header else 0
    names = [_unquote(c) for c in first] if has_header else []
    if has_header:
        _check_unique_names(p, names, label_column)
    col = (None if label_column == "" else
           _label_index(p, names, len(first), has_header, label_column))
    text = col is not None or comma
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # "input contained no data": checked below
            cells = np.loadtxt(p, delimiter=delim, skiprows=skip, ndmin=2, encoding="utf-8-sig",
                               dtype=str if text else np.float64, quotechar='"')
    except UnicodeDecodeError:
        raise
    except ValueError:
        raise _locate(p, delim, skip, col, comma) from None
    if cells.shape[0] == 0:
        raise _fail(p, f"no data rows{' below its header line' if has_header else ''}. Fix: "
                       f"give this node at least one row")
    y = None
    feats = cells
    if col is not None:
        if cells.shape[1] <= col:
            raise _fail(p, f"the data rows have {cells.shape[1]} columns, fewer than the "
                           f"header's {len(first)}; the label column {col} is missing")
        feats = np.delete(cells, col, axis=1)
        y = _labels(cells[:, col], f"{_public(p)}: label column {col + 1}", stable_labels, p)
    if text:
        try:
            x = (np.char.replace(feats, ",", ".") if comma else feats).astype(np.float64)
        except ValueError:
            raise _locate(p, delim, skip, col, comma) from None
    else:
        x = feats
    if x.shape[1] == 0:
        raise _fail(p, "no feature columns (only the label column). Fix: give every row at "
                       "least one feature")
    try:
        x = _check_features(x, p)
    except LocalDataError:
        x = _check_features(x, p, rows=_line_numbers(p, delim, skip))
    return x, y


def _check_unique_names(p: Path, names: list[str], label_column: str) -> None:
    """Refuse a header that gives two columns one name (a label column named twice would
    silently swap a feature and the label). The public message names the columns by number
    and echoes only the configured ``label-column``."""
    seen: dict[str, list[int]] = {}
    for i, name in enumerate(names):
        if name:
            seen.setdefault(name, []).append(i + 1)
    dups = {n: cols for n, cols in seen.items() if len(cols) > 1}
    if not dups:
        return
    shared = [f"columns {', '.join(map(str, cols[:-1]))} and {cols[-1]} share "
              + (f"the name {n!r} (node config 'label-column')" if n == label_column.strip()
                 else "one name") for n, cols in dups.items()]
    problem = (f"duplicate header names: {'; '.join(shared)}. Allowed: a different name for "
               f"every column (a label-column named twice would take one of them and keep the "
               f"other as a feature). Fix: rename the duplicate columns")
    detail = "; ".join(f"{n!r} in columns {cols}" for n, cols in dups.items())
    raise LocalDataError(f"{_public(p)}: {problem}", f"{p}: {problem} ({detail})")


def _label_index(p: Path, names: list[str], width: int, has_header: bool,
                 label_column: str) -> int:
    """0-based index of ``label_column`` (a header name or an index), or a clear error that
    quotes no header name but the configured one."""
    if has_header and label_column.strip() in names:
        return names.index(label_column.strip())
    try:
        col = int(label_column)
    except ValueError:
        where = (f"its header has {width} column(s), none named {label_column!r}" if has_header
                 else "it has no header row (its first cell is a number)")
        fix = ("label-column=<index>, or the header name of the label column" if has_header
               else "label-column=<index> or add a header row")
        raise LocalDataError(
            f"node config 'label-column' = {label_column!r} names no column of {_public(p)}: "
            f"{where}. Allowed: a header name or a 0-based column index (0..{width - 1}). "
            f"Fix: {fix}.",
            f"node config 'label-column' = {label_column!r} names no column of {p}: {where}"
            + (f" (header: {names})" if has_header else "")) from None
    if not -width <= col < width:
        raise LocalDataError(f"node config 'label-column' = {label_column!r} is out of range: "
                             f"{_public(p)} has {width} columns (0..{width - 1})",
                             f"{p} has {width} columns; label-column = {label_column!r}")
    return col % width


# --------------------------------------------------------------------------- labels

def _text_code(text: str) -> int:
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return TEXT_CODE_BASE + int.from_bytes(digest, "big") % TEXT_CODE_BASE


def _number_code(v: int | float, where: str, row: int) -> int:
    """The code of a numeric label (``row``: 0-based, for the message)."""
    if isinstance(v, float):
        if not np.isfinite(v):
            raise LocalDataError(f"{where}: the label of row {row + 1} is not a finite number "
                                 f"(NaN or infinite). Fix: give every row a label, or name no "
                                 f"label column")
        if not v.is_integer():
            return _text_code(repr(v))
        v = int(v)
    v = int(v)
    return v if 0 <= v < TEXT_CODE_BASE else _text_code(str(v))


def _parse_number(text: str) -> int | float | None:
    """``text`` as an exact int, else a float, else None (not a number)."""
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return None


def _missing(e: object) -> bool:
    """None, NaN, pandas' NA/NaT: a label that is not there."""
    if e is None:
        return True
    if isinstance(e, (float, np.floating)):
        return bool(np.isnan(e))
    return type(e).__name__ in ("NAType", "NaTType")


def label_values(values, where: str = "labels") -> np.ndarray:
    """Labels of any type as a plain 1-D numpy array of numbers or text, the form a node's file
    holds them in (what :func:`label_codes` codes, and what an ``.npz`` stores without pickle).

    Accepted: integers, floats, booleans, text (``str``/bytes in UTF-8), and any sequence of
    them — a list, a numpy array (also of Python objects), a pandas Series of any dtype
    (``object``, ``string``, ``category``, ``boolean``, nullable integers), a Hugging Face
    column. Refused, with the first row named: missing labels (None, NaN, ``pd.NA``) and a mix
    of numbers and text. No label is changed: the coding is :func:`label_codes`'s alone.
    """
    if hasattr(values, "dtype") and str(getattr(values, "dtype", "")) == "category" \
            and hasattr(values, "astype"):
        values = values.astype(object)      # a pandas Categorical: its values, not its codes
    if hasattr(values, "to_numpy") and not isinstance(values, np.ndarray):
        values = values.to_numpy(dtype=object)    # pandas: NA stays a visible missing value
    v = np.asarray(values)
    if v.ndim != 1:
        v = v.reshape(-1)
    if v.dtype.kind == "S":
        try:
            v = np.char.decode(v, "utf-8")
        except UnicodeDecodeError:
            raise LocalDataError(f"{where}: labels are bytes that are not UTF-8 text. Fix: save "
                                 f"labels as numbers or text") from None
    if v.dtype.kind == "O":
        items = v.tolist()
        gone = [r for r, e in enumerate(items) if _missing(e)]
        if gone:
            raise LocalDataError(f"{where}: the label of row {gone[0] + 1} is missing (None or "
                                 f"NaN); {len(gone)} missing in all. Fix: give every row a "
                                 f"label (drop or fill those rows), or pass no labels")
        items = [e.decode("utf-8") if isinstance(e, bytes) else e for e in items]
        if all(isinstance(e, str) for e in items):
            v = np.array(items, dtype=str) if items else np.zeros(0, dtype=str)
        elif all(isinstance(e, (bool, np.bool_)) for e in items):
            v = np.array(items, dtype=bool)
        elif all(isinstance(e, (bool, int, float, np.bool_, np.integer, np.floating))
                 for e in items):
            v = np.array([float(e) if isinstance(e, (float, np.floating)) else int(e)
                          for e in items]) if items else np.zeros(0)
        else:
            odd = next((r for r, e in enumerate(items) if not isinstance(
                e, (str, bool, int, float, np.bool_, np.integer, np.floating))), None)
            what = (f"row {odd + 1} holds an object that is neither a number nor text"
                    if odd is not None else "some rows hold numbers, others text")
            raise LocalDataError(f"{where}: labels mix numbers, text or other objects ({what})."
                                 f" Allowed: all numbers or all text. Fix: convert the labels "
                                 f"to one type, e.g. text (df[col].astype(str))")
    if v.dtype.kind not in "biufU":
        raise LocalDataError(f"{where}: labels of dtype {v.dtype} are not supported. Allowed: "
                             f"integers, floats, booleans or text")
    return v


def label_codes(values, where: str = "labels") -> NDArray[np.int64]:
    """Evaluation labels as int64 codes that are the same on every node (no coordination).

    Each value is mapped on its own, so the code of a label never depends on which other
    labels a node holds:

    - a number (or a text that parses as one, surrounding spaces ignored) that is a
      non-negative integer below :data:`TEXT_CODE_BASE` (2**30) is kept: ``3``, ``3.0``,
      ``"3"`` → 3;
    - any other label — text (stripped), or a number such as ``-1``, ``2.5``, ``1e12`` — gets
      ``TEXT_CODE_BASE + blake2b-64(canonical text) mod 2**30``, in ``[2**30, 2**31)``; numbers
      use one canonical text (``-1``, ``"-1"``, ``-1.0`` → the code of ``"-1"``;
      ``2.5``/``"2.50"`` → the code of ``"2.5"``);
    - NaN/infinite labels, and arrays that are neither numbers nor text, are refused.

    Codes are therefore sparse and may be ~2**31: **do not size a table by** ``codes.max() + 1``.
    The evaluation path compacts the codes: it uses only the distinct codes present (see
    :func:`compact_codes`). Two distinct texts of one node that share a code are refused
    (chance ~k²/2**31 for k texts); across nodes such a collision would merge two classes in the
    evaluation only. The hash is not a secret: a code reveals a guessable label as well as the
    label itself would, which is why labels stay on the evaluation path.
    """
    v = label_values(values, where)
    kind = v.dtype.kind
    if v.size == 0:
        return np.zeros(0, dtype=np.int64)
    if kind in "bi" or (kind == "u" and int(v.max()) < 2 ** 63):
        w = v.astype(np.int64)
        if w.min() >= 0 and w.max() < TEXT_CODE_BASE:
            return w
    uniq, inverse = np.unique(v, return_inverse=True)
    inverse = inverse.reshape(-1)
    first_row = np.full(len(uniq), len(v))
    np.minimum.at(first_row, inverse, np.arange(len(v)))
    codes = np.empty(len(uniq), dtype=np.int64)
    texts: dict[int, str] = {}
    for i, value in enumerate(uniq.tolist()):
        row = int(first_row[i])
        if isinstance(value, str):
            value = value.strip()
            number = _parse_number(value)
            if number is None:
                codes[i] = _text_code(value)
                if texts.setdefault(int(codes[i]), value) != value:
                    raise LocalDataError(f"{where}: two different text labels share one code "
                                         f"(a hash collision; one of them first on row "
                                         f"{row + 1}). Fix: rename one of the two labels")
                continue
            value = number
        codes[i] = _number_code(value, where, row)
    return codes[inverse]


def labels_to_int(values: np.ndarray) -> NDArray[np.int64]:
    """The former name of :func:`label_codes` (now the same node-independent codes)."""
    return label_codes(values)


def _labels(values: np.ndarray, where: str, stable: bool, p: Path | None = None
            ) -> NDArray[np.int64]:
    """Validated labels: :func:`label_codes`, or (not ``stable``) per-node indices. A refusal
    names ``p`` in its detail (``where`` is the public name)."""
    codes = _codes(values, where, p)
    return codes if stable else _node_label_index(values)


def _codes(values: np.ndarray, where: str, p: Path | None) -> NDArray[np.int64]:
    """:func:`label_codes`, with the path ``p`` in a refusal's detail."""
    try:
        return label_codes(values, where)
    except LocalDataError as exc:
        if p is None:
            raise
        raise LocalDataError(str(exc), f"{p}: {exc}") from None


def _node_label_index(values: np.ndarray) -> NDArray[np.int64]:
    """The former per-node mapping: non-negative integer-valued numbers are kept; otherwise
    every label is replaced by the index of its value among this node's sorted distinct
    values (small, but not comparable across nodes with different label sets)."""
    values = np.asarray(values).ravel()
    try:
        nums = values.astype(np.float64)
    except ValueError:
        nums = None
    if (nums is not None and np.all(np.isfinite(nums)) and np.all(nums == np.round(nums))
            and (nums.size == 0 or nums.min() >= 0)):
        return nums.astype(np.int64)
    _, index = np.unique(values.astype(str), return_inverse=True)
    return index.reshape(-1).astype(np.int64)


def compact_codes(codes: np.ndarray, vocabulary: np.ndarray) -> NDArray[np.int64]:
    """Row indices ``0..len(vocabulary)-1`` of ``codes`` in ``vocabulary``, the sorted union
    of every node's distinct codes (``np.unique`` of them all): small, dense and equal on every
    node, for a contingency table of ``len(vocabulary)`` rows. Codes absent from the vocabulary
    are refused."""
    vocab = np.asarray(vocabulary, dtype=np.int64)
    codes = np.asarray(codes, dtype=np.int64)
    idx = np.searchsorted(vocab, codes)
    ok = idx < len(vocab)
    ok[ok] = vocab[idx[ok]] == codes[ok]
    if not ok.all():
        raise ValueError(f"{int((~ok).sum())} label code(s) are missing from the vocabulary of "
                         f"{len(vocab)} codes")
    return idx.astype(np.int64)


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def table_reader(cfg: Mapping[str, Any], data_format: str, label_column: str
                 ) -> Callable[[str], NDArray[np.float64]]:
    """``path -> rows``: a site file read as a table node reads it (the FCM family's
    :attr:`~fedclust.registry.MethodSpec.site_reader`)."""
    return lambda path: load_local_table(path, data_format, label_column)[0]


def pixel_reader(cfg: Mapping[str, Any], data_format: str, label_column: str
                 ) -> Callable[[str], NDArray[np.float32]]:
    """``path -> rows``: a site file read as FedCRef's node reads it (:func:`load_pixel_table`)."""
    return lambda path: load_pixel_table(path, data_format, label_column)[0]
