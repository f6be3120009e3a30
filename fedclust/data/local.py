"""Data an edge device owns: load a node's local table from ``data-path`` (deployment).

Formats (inferred from the suffix or given as ``data-format``): a folder of images
(``images``; ``<class>/`` subfolders give evaluation labels), ``.npz`` with array ``x``
(and optional ``y`` for evaluation), ``.npy`` (features only), ``.csv``/``.tsv`` (numeric, with
or without a header; ``label-column`` names/indexes an optional ground-truth column that is
removed from the features).

Everything is checked at the door and refused with a :class:`LocalDataError` that names the
file, the place (row and column numbers, 1-based) and the fix, and is **data-free**: messages
end up in the server's logs, so they never quote a cell, a label, a line or bytes of the file
(nor the text of a numpy/zipfile/Pillow exception, which may quote them). Refused: paths that
are not regular files (devices, FIFOs, sockets, links to them) and files over ``max_bytes``
(default :data:`MAX_BYTES`); malformed or pickled ``.npz``/``.npy``; empty tables (no rows or
no feature columns); ragged rows; non-numeric cells; non-finite values and values with
``|x| > MAX_ABS`` (their squares overflow); ``y`` of another length than ``x``; image modes
other than 1/L/LA/P/PA/RGB/RGBA/RGBX/CMYK/YCbCr (8-bit, divided by 255) and 16-bit greyscale
(``I;16*``, and ``I`` with values in 0..65535: divided by 65535).

Evaluation labels: :func:`label_codes` gives every label the same code on every node
(``stable_labels=True``); the default still returns the former small per-node indices until the
evaluation path compacts stable codes (:func:`compact_codes`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import warnings
import zipfile
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

MAX_BYTES = 2 * 1024 ** 3
"""Default size limit of a node's data (a file, or all images of a folder together)."""

MAX_ABS = 1e150
"""Largest magnitude accepted for a feature value (squares and sums of squares stay finite)."""

TEXT_CODE_BASE = 2 ** 30
"""Label codes below this are the labels' own non-negative integers; codes in
``[TEXT_CODE_BASE, 2 * TEXT_CODE_BASE)`` are hashes of text labels (see :func:`label_codes`)."""


class LocalDataError(ValueError):
    """A node's local data file is missing, unreadable or invalid (data-free message)."""


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
    """
    p = Path(path).expanduser()
    if not p.exists() and not p.is_symlink():
        raise LocalDataError(f"node config 'data-path' = {path!r} does not exist on this node. "
                             f"Fix: flower-supernode --node-config 'data-path=\"/abs/file.csv\"'.")
    fmt = (data_format or ("images" if p.is_dir() else p.suffix.lstrip("."))).lower()
    if fmt == "images":
        if not p.is_dir():
            raise LocalDataError(f"{p} is not a folder; data-format 'images' needs a folder of "
                                 f"image files. Fix: point 'data-path' at the image folder")
        return load_image_folder(p, max_bytes, stable_labels)
    if fmt not in ("npz", "npy", "csv", "tsv", "txt"):
        raise LocalDataError(f"unsupported data format {fmt!r} for {p}. Allowed: npz, npy, csv, "
                             f"tsv, images (a folder). Fix: set node config 'data-format'.")
    _check_regular_file(p, max_bytes)
    if fmt == "npz":
        return _load_npz(p, max_bytes, stable_labels)
    if fmt == "npy":
        return _check_features(_load_npy(p, max_bytes), p), None
    return _load_delimited(p, "\t" if fmt == "tsv" else ",", label_column, stable_labels)


# --------------------------------------------------------------------------- file checks

def _check_regular_file(p: Path, max_bytes: int) -> int:
    """The size of ``p`` if it is a regular file (after links) of at most ``max_bytes``."""
    link = " (a symbolic link)" if p.is_symlink() else ""
    try:
        st = os.stat(p)
    except OSError:
        raise LocalDataError(f"{p}{link} cannot be opened: it is a broken link or not "
                             f"accessible. Fix: point 'data-path' at a readable file") from None
    if stat.S_ISDIR(st.st_mode):
        raise LocalDataError(f"{p}{link} is a folder, not a data file. Allowed: a csv/tsv/npz/"
                             f"npy file, or data-format 'images' for a folder of images")
    if not stat.S_ISREG(st.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(st.st_mode) else
                "a socket" if stat.S_ISSOCK(st.st_mode) else
                "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
                "not a regular file")
        target = "points to" if link else "is"
        raise LocalDataError(f"{p}{link} {target} {kind}, not a regular file. Allowed: a regular "
                             f"file. Fix: copy the data into a regular file")
    if st.st_size > max_bytes:
        raise LocalDataError(f"{p} is {st.st_size} bytes, over the limit of {max_bytes} bytes. "
                             f"Fix: split the data or raise the limit (max_bytes)")
    return int(st.st_size)


def _check_features(x: np.ndarray, p: Path, rows: list[int] | None = None,
                    what: str = "x") -> NDArray[np.float64]:
    """``x`` as a float64 table ``(n ≥ 1, f ≥ 1)``, finite, ``|x| ≤ MAX_ABS``.

    ``rows`` (csv): the 1-based file line of every data row, to name the line at fault.
    """
    kind = x.dtype.kind
    if kind not in "biuf":
        raise LocalDataError(f"{p}: {what} has dtype {x.dtype}, not a real number type. Fix: "
                             f"save the features as a numeric (int or float) array")
    if x.ndim == 0:
        raise LocalDataError(f"{p}: {what} is a single number, not a table. Fix: save an array "
                             f"of shape (rows, features)")
    if x.shape[0] == 0:
        raise LocalDataError(f"{p}: no data rows ({what} has shape {x.shape}). Fix: give this "
                             f"node at least one row")
    x = x.reshape(x.shape[0], -1)
    if x.shape[1] == 0:
        raise LocalDataError(f"{p}: no feature columns ({what} has shape {x.shape}). Fix: give "
                             f"every row at least one feature")
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
            raise LocalDataError(
                f"{p}: {where} {problem}; {int(bad.sum())} cell(s) in all (rows and columns "
                f"are 1-based). Fix: fill or drop missing values and rescale such features "
                f"before federating")
    return x


# --------------------------------------------------------------------------- npz / npy

def _load_npz(p: Path, max_bytes: int, stable_labels: bool = False
              ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    if not zipfile.is_zipfile(p):
        raise LocalDataError(f"{p} is not a valid .npz archive (not a zip file, or cut short). "
                             f"Fix: write it "
                             f"with numpy.savez(path, x=features, y=labels)")
    try:
        with zipfile.ZipFile(p) as zf:
            infos = {i.filename: i for i in zf.infolist()}
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        raise LocalDataError(f"{p} is a damaged .npz archive. Fix: write it again with "
                             f"numpy.savez") from None
    names = sorted(n[:-4] for n in infos if n.endswith(".npy"))
    if "x" not in names:
        raise LocalDataError(f"{p} has arrays {names}; expected 'x' (and optional 'y'). Fix: "
                             f"numpy.savez(path, x=features, y=labels)")
    for name in ("x", "y"):
        info = infos.get(f"{name}.npy")
        if info is not None and info.file_size > max_bytes:
            raise LocalDataError(f"{p}: array {name!r} unpacks to {info.file_size} bytes, over "
                                 f"the limit of {max_bytes} bytes. Fix: split the data or raise "
                                 f"the limit (max_bytes)")
    try:
        with np.load(p, allow_pickle=False) as z:
            x = _read_member(z, "x", p)
            y = _read_member(z, "y", p) if "y" in names else None
    except LocalDataError:
        raise
    except Exception:     # noqa: BLE001 - any numpy/zipfile error text may quote the bytes
        raise LocalDataError(f"{p} is a damaged .npz archive. Fix: write it again with "
                             f"numpy.savez") from None
    x = _check_features(x, p)
    if y is None:
        return x, None
    if y.ndim == 0 or y.reshape(y.shape[0], -1).shape[1] != 1:
        raise LocalDataError(f"{p}: 'y' has shape {y.shape}; expected one label per row, "
                             f"shape ({x.shape[0]},)")
    if y.shape[0] != x.shape[0]:
        raise LocalDataError(f"{p}: 'y' has {y.shape[0]} labels but 'x' has {x.shape[0]} rows. "
                             f"Fix: save one label per row of x")
    return x, _labels(y.reshape(-1), f"{p}: 'y'", stable_labels)


def _read_member(z, name: str, p: Path) -> np.ndarray:
    try:
        return np.asarray(z[name])
    except ValueError as exc:
        if "pickle" in str(exc):
            raise LocalDataError(f"{p}: array {name!r} holds Python objects (pickled data), "
                                 f"which are refused. Fix: save numbers (x) and numbers or "
                                 f"strings (y)") from None
        raise LocalDataError(f"{p}: array {name!r} is malformed. Fix: write the file again "
                             f"with numpy.savez") from None


def _load_npy(p: Path, max_bytes: int) -> np.ndarray:
    with open(p, "rb") as fh:
        head = fh.read(6)
        if head[:2] == b"PK":
            raise LocalDataError(f"{p} is an .npz archive, not an .npy array. Fix: rename it to "
                                 f".npz (or set data-format 'npz')")
        if head != b"\x93NUMPY":
            raise LocalDataError(f"{p} is not an .npy array (no NumPy header). Fix: write it "
                                 f"with numpy.save(path, features)")
        fh.seek(0)
        try:
            version = np.lib.format.read_magic(fh)
            if version == (1, 0):
                shape, _, dtype = np.lib.format.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, _, dtype = np.lib.format.read_array_header_2_0(fh)
            else:
                shape, dtype = None, None
            offset = fh.tell()
        except Exception:     # noqa: BLE001 - keep numpy's text (it may quote bytes) out
            raise LocalDataError(f"{p} has a malformed .npy header. Fix: write it again with "
                                 f"numpy.save") from None
    if shape is not None:
        if dtype.hasobject:
            raise LocalDataError(f"{p} holds Python objects (pickled data), which are refused. "
                                 f"Fix: save a numeric array")
        need = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if need > max_bytes:
            raise LocalDataError(f"{p}: the array is {need} bytes, over the limit of "
                                 f"{max_bytes} bytes. Fix: split the data or raise the limit "
                                 f"(max_bytes)")
        if need > os.stat(p).st_size - offset:
            raise LocalDataError(f"{p} is truncated: its header announces shape {shape} but "
                                 f"the file is shorter. Fix: write it again with numpy.save")
    try:
        return np.asarray(np.load(p, allow_pickle=False))
    except ValueError as exc:
        if "pickle" in str(exc):
            raise LocalDataError(f"{p} holds Python objects (pickled data), which are refused. "
                                 f"Fix: save a numeric array") from None
        raise LocalDataError(f"{p} is a malformed .npy array. Fix: write it again with "
                             f"numpy.save") from None
    except Exception:     # noqa: BLE001
        raise LocalDataError(f"{p} is a malformed .npy array. Fix: write it again with "
                             f"numpy.save") from None


# --------------------------------------------------------------------------- images

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".pgm")
MODES_8BIT = ("1", "L", "LA", "P", "PA", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr")
MODES_16BIT = ("I;16", "I;16L", "I;16B", "I;16N", "I")


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
        raise LocalDataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) under {root}")
    total = 0
    for f in files:
        total += _check_regular_file(f, max_bytes)
    if total > max_bytes:
        raise LocalDataError(f"the images under {root} are {total} bytes together, over the "
                             f"limit of {max_bytes} bytes. Fix: split the data or raise the "
                             f"limit (max_bytes)")
    arrays = [_grey_unit(f, Image) for f in files]
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise LocalDataError(f"images under {root} have different sizes {sorted(shapes)}; "
                             f"resize them to one size first")
    x = np.stack([a.ravel() for a in arrays])
    parts = [f.relative_to(root).parts for f in files]
    if all(len(q) > 1 for q in parts):   # the class is the first folder under root
        names = np.array([q[0] for q in parts])
        codes = label_codes(names, where=f"{root}: class folders")
        if stable_labels:
            return x, codes
        return x, np.unique(names, return_inverse=True)[1].reshape(-1).astype(np.int64)
    return x, None


def _grey_unit(f: Path, Image) -> NDArray[np.float64]:
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
                        raise LocalDataError(
                            f"{f}: 32-bit integer image (mode 'I') with values outside "
                            f"0..65535. Allowed: 8-bit or 16-bit images. Fix: save it as "
                            f"8-bit or 16-bit greyscale")
                    return a / 65535.0
    except LocalDataError:
        raise
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise LocalDataError(f"{f}: the image has too many pixels (over Pillow's limit of "
                             f"{Image.MAX_IMAGE_PIXELS}). Fix: downscale it") from None
    except Exception:     # noqa: BLE001 - Pillow's text is not ours to pass on
        raise LocalDataError(f"{f} cannot be read as an image (damaged or not an image). Fix: "
                             f"re-save it, or move it out of the data folder") from None
    raise LocalDataError(f"{f}: image mode {mode!r} is not supported. Allowed: "
                         f"{', '.join(MODES_8BIT)} (8-bit), {', '.join(MODES_16BIT)} (16-bit "
                         f"greyscale). Fix: save it as 8-bit or 16-bit greyscale or RGB")


# --------------------------------------------------------------------------- csv / tsv

def _data_lines(p: Path, delim: str, skip: int):
    """``(line number, cells)`` of the data lines as ``numpy.loadtxt`` reads them: the first
    ``skip`` lines are skipped, ``#`` starts a comment, lines empty after that are skipped."""
    with open(p, encoding="utf-8-sig", newline=None) as fh:
        for number, line in enumerate(fh, 1):
            if number <= skip:
                continue
            line = line.rstrip("\r\n").split("#", 1)[0]
            if line == "":
                continue
            yield number, line.split(delim)


def _line_numbers(p: Path, delim: str, skip: int) -> list[int]:
    return [number for number, _ in _data_lines(p, delim, skip)]


def _locate(p: Path, delim: str, skip: int, label_col: int | None) -> LocalDataError:
    """A data-free error for the first ragged line or non-numeric cell of ``p``."""
    width, first_line = None, 0
    for number, cells in _data_lines(p, delim, skip):
        if width is None:
            width, first_line = len(cells), number
        elif len(cells) != width:
            return LocalDataError(f"{p}: line {number} has {len(cells)} field(s) but line "
                                  f"{first_line} has {width}. Allowed: the same number of "
                                  f"columns on every line. Fix: fill in or remove that line")
        for c, cell in enumerate(cells):
            if c == label_col:
                continue
            if cell.strip() == "":
                return LocalDataError(f"{p}: line {number}, column {c + 1} is empty. Fix: fill "
                                      f"in missing values (or drop that row)")
            if not _is_number(cell):
                hint = ("only the label column may hold text" if label_col is not None else
                        f"a text column holding labels must be named in node config "
                        f"'label-column' (this column is label-column={c})")
                return LocalDataError(f"{p}: line {number}, column {c + 1} is not a number. "
                                      f"Every feature must be a number; {hint}")
    return LocalDataError(f"{p} cannot be read as a numeric table. Fix: save it as plain "
                          f"numbers separated by {'tabs' if delim == chr(9) else 'commas'}")


def _load_delimited(p: Path, delim: str, label_column: str, stable_labels: bool = False
                    ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    """A numeric CSV/TSV (header detected when its first cell is not a number); the optional
    ``label_column`` (header name or 0-based index) may hold numbers or strings."""
    try:
        return _parse_delimited(p, delim, label_column, stable_labels)
    except UnicodeDecodeError:      # its text quotes the bytes: not passed on
        raise LocalDataError(f"{p} is not UTF-8 text. Fix: save it as UTF-8 (plain text "
                             f"numbers)") from None


def _parse_delimited(p: Path, delim: str, label_column: str, stable_labels: bool
                     ) -> tuple[NDArray[np.float64], NDArray[np.int64] | None]:
    with open(p, encoding="utf-8-sig") as fh:
        first = fh.readline().rstrip("\r\n").split(delim)
    if first == [""] and os.stat(p).st_size == 0:
        raise LocalDataError(f"{p} is empty (no rows, no columns). Fix: give this node data")
    has_header = bool(first and first[0]) and not _is_number(first[0])
    skip = int(has_header)
    col = None if label_column == "" else _label_index(p, first, has_header, label_column)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")           # "input contained no data": checked below
            cells = np.loadtxt(p, delimiter=delim, skiprows=skip, ndmin=2, encoding="utf-8-sig",
                               dtype=np.float64 if col is None else str)
    except UnicodeDecodeError:
        raise
    except ValueError:
        raise _locate(p, delim, skip, col) from None
    if cells.shape[0] == 0:
        raise LocalDataError(f"{p}: no data rows{' below its header line' if has_header else ''}"
                             f". Fix: give this node at least one row")
    y = None
    if col is not None:
        if cells.shape[1] <= col:
            raise LocalDataError(f"{p}: the data rows have {cells.shape[1]} columns, fewer than "
                                 f"the header's {len(first)}; the label column {col} is missing")
        feats = np.delete(cells, col, axis=1)
        try:
            x = feats.astype(np.float64)
        except ValueError:
            raise _locate(p, delim, skip, col) from None
        y = _labels(cells[:, col], f"{p}: label column {col + 1}", stable_labels)
    else:
        x = cells
    if x.shape[1] == 0:
        raise LocalDataError(f"{p}: no feature columns (only the label column). Fix: give every "
                             f"row at least one feature")
    try:
        x = _check_features(x, p)
    except LocalDataError:
        x = _check_features(x, p, rows=_line_numbers(p, delim, skip))
    return x, y


def _label_index(p: Path, first: list[str], has_header: bool, label_column: str) -> int:
    """0-based index of ``label_column`` (a header name or an index), or a clear error."""
    if has_header and label_column in first:
        return first.index(label_column)
    try:
        col = int(label_column)
    except ValueError:
        where = (f"its header has {first}" if has_header else
                 "it has no header row (its first cell is a number)")
        raise LocalDataError(
            f"node config 'label-column' = {label_column!r} names no column of {p}: {where}. "
            f"Allowed: a header name or a 0-based column index (0..{len(first) - 1}). Fix: "
            f"label-column=<index> or add a header row.") from None
    if not -len(first) <= col < len(first):
        raise LocalDataError(f"node config 'label-column' = {label_column!r} is out of range: "
                             f"{p} has {len(first)} columns (0..{len(first) - 1})")
    return col % len(first)


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
        if all(isinstance(e, str) for e in items):
            v = np.array(items, dtype=str)
        elif all(isinstance(e, (bool, int, float, np.integer, np.floating)) for e in items):
            v = np.array([float(e) if isinstance(e, (float, np.floating)) else int(e)
                          for e in items]) if items else np.zeros(0)
        else:
            raise LocalDataError(f"{where}: labels mix numbers, text or other objects. "
                                 f"Allowed: all numbers or all text")
    kind = v.dtype.kind
    if kind not in "biufU":
        raise LocalDataError(f"{where}: labels of dtype {v.dtype} are not supported. Allowed: "
                             f"integers, floats or text")
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


def _labels(values: np.ndarray, where: str, stable: bool) -> NDArray[np.int64]:
    """Validated labels: :func:`label_codes`, or (not ``stable``) per-node indices."""
    codes = label_codes(values, where)
    return codes if stable else _node_label_index(values)


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
