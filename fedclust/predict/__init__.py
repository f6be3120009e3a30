"""Apply a finished run to new rows: ``fedclust predict RUN_DIR DATA --out FILE``.

Works on any machine that holds the run's results folder (``summary.json`` and the arrays or
models the method saved). ``DATA`` is read with the loader a deployed node uses for its
``data-path`` (csv/tsv, npz, npy, a folder of images), so a site's own file predicts to the
labels it received at the end of the run.

- ``exact-fcm``, ``fedfcm``: the run's federated scaling, then FCM memberships to the final
  centers (FedFCM: at the chosen K); columns ``row,cluster,u0,…,u<C−1>``.
- ``fedcref``: each row goes to the community model that reconstructs it best; ``row,cluster``.
- ``emdcfl``: class predictions of one cluster's model (``cluster=``); ``row,label``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedclust.predict.base import FAR_FACTOR, FIX_RUN, PredictError, Prediction
from fedclust.registry import METHODS, load

# method -> "module:function(run_dir, summary, x, options) -> Prediction"
PREDICTORS: dict[str, str] = {name: spec.predictor for name, spec in METHODS.items()}


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` of a run's folder, or ``predict.json`` of a data owner's folder,
    checked: a JSON object naming a known method, with a ``config`` object.

    Raises
    ------
    PredictError
        The folder is missing, or its file is unreadable or damaged.
    """
    folder = Path(run_dir).expanduser()
    if not folder.is_dir():
        raise PredictError(f"RUN_DIR {str(folder)!r} is not a folder. Allowed: the results "
                           f"folder of a finished run, or a site's own results folder. "
                           f"Fix: {FIX_RUN}")
    for name in ("summary.json", "predict.json"):
        path = folder / name
        if path.is_file():
            break
    else:
        raise PredictError(f"{folder} holds neither summary.json nor predict.json: RUN_DIR must "
                           f"be the results folder of a finished run, or a site's own results "
                           f"folder. Allowed: a folder with one of them. Fix: {FIX_RUN}")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        where = f" (line {exc.lineno})" if isinstance(exc, json.JSONDecodeError) else ""
        raise PredictError(f"{path} cannot be read as JSON{where}: the file is damaged. "
                           f"Allowed: the {name} fedclust wrote. Fix: {FIX_RUN}") from None
    if not isinstance(summary, dict):
        raise PredictError(f"{path} holds a JSON {type(summary).__name__}, not an object. "
                           f"Allowed: the {name} fedclust wrote. Fix: {FIX_RUN}")
    method = summary.get("method")
    if method not in PREDICTORS:
        raise PredictError(f"{path} names method {method!r}. Allowed: one of "
                           f"{sorted(PREDICTORS)}. Fix: {FIX_RUN}")
    if not isinstance(summary.get("config"), dict):
        raise PredictError(f"{path} has no 'config' object (the run's settings, e.g. its "
                           f"fuzzifier). Allowed: the {name} fedclust wrote, with its config. "
                           f"Fix: {FIX_RUN}")
    return summary


def check_out(out: str | Path, run_dir: str | Path, data: str | Path | None,
              overwrite: bool = False) -> Path:
    """Where ``--out`` may be written, or a :class:`PredictError` before any work.

    Refused: a path inside the run folder or the data (predict's inputs, even with
    ``overwrite``), a folder, a path below a file, and an existing file unless ``overwrite``.
    """
    out = Path(out).expanduser()
    target = out.resolve()
    inputs = [("the run folder", Path(run_dir).expanduser().resolve())]
    if data is not None:
        inputs.append(("the data DATA", Path(data).expanduser().resolve()))
    for what, path in inputs:
        if target == path or path in target.parents:
            raise PredictError(
                f"--out {str(out)!r} is {'inside ' if target != path else ''}{what}, one of "
                f"predict's inputs: writing there would change or destroy it. Allowed: a new "
                f"file outside RUN_DIR and other than DATA. Fix: pass e.g. --out "
                f"predicted.csv")
        if out.exists() and path.exists() and _same(out, path):
            raise PredictError(f"--out {str(out)!r} is {what} under another name, one of "
                               f"predict's inputs. Allowed: a new file outside RUN_DIR and "
                               f"other than DATA. Fix: pass e.g. --out predicted.csv")
    if out.is_dir():
        raise PredictError(f"--out {str(out)!r} is a folder. Allowed: a file name (a CSV). Fix: "
                           f"pass e.g. --out {str(out / 'predicted.csv')!r}")
    for parent in out.parents:
        if parent.exists():
            if not parent.is_dir():
                raise PredictError(f"--out {str(out)!r} lies below {str(parent)!r}, which is a "
                                   f"file. Allowed: a path in a folder. Fix: pass another "
                                   f"--out")
            break
    if (out.exists() or out.is_symlink()) and not overwrite:
        raise PredictError(f"--out {str(out)!r} already exists. Allowed: a new file, or an "
                           f"existing one with --overwrite (Python: overwrite=True). Fix: pass "
                           f"another --out, or add --overwrite")
    if out.exists() and not out.is_file():
        raise PredictError(f"--out {str(out)!r} is not a plain file. Allowed: a new file or a "
                           f"plain file with --overwrite. Fix: pass another --out")
    return out


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def predict(run_dir: str | Path, data: str | Path | np.ndarray, out: str | Path | None = None,
            *, data_format: str = "", label_column: str = "", overwrite: bool = False,
            **options: Any) -> Prediction:
    """Apply the run in ``run_dir`` to ``data`` (a file/folder, or an array of rows).

    The run folder and ``out`` are checked before the data is read; ``out`` is written
    atomically, and nothing is left behind on an error.

    Parameters
    ----------
    run_dir : path
        A finished run's results folder.
    data : path or ndarray
        New rows, in the run's original feature units.
    out : path, optional
        Write the prediction as CSV there: a new file (an existing one with ``overwrite``),
        never inside ``run_dir`` or ``data``.
    data_format, label_column : str
        As the node config keys of the same names (a label column is dropped, not used).
    overwrite : bool
        Replace an existing ``out``.
    **options
        Method options, e.g. ``cluster=2`` for EMD-CFL.

    Raises
    ------
    PredictError
        A damaged or unknown run folder, a refused ``out``, rows that do not fit the run.
    """
    run_dir = Path(run_dir).expanduser()
    summary = load_summary(run_dir)
    method = summary["method"]
    frame = hasattr(data, "columns") and hasattr(data, "to_numpy")
    array = isinstance(data, np.ndarray) or frame
    if out is not None:
        out = check_out(out, run_dir, None if array else data, overwrite)
    names: list[str] | None = None
    if frame:
        names = [str(c) for c in data.columns]
        try:
            x = np.asarray(data.to_numpy(dtype=np.float64))
        except (TypeError, ValueError):
            raise PredictError(f"the DataFrame's columns {names} are not all numeric. Allowed: "
                               f"numeric feature columns. Fix: drop or encode the others") from None
    elif array:
        x = np.asarray(data, dtype=np.float64)
        x = x.reshape(len(x), -1) if x.ndim != 2 else x
    else:
        from fedclust.data.local import feature_names, load_local_table

        x, _ = load_local_table(str(data), data_format, label_column)
        names = feature_names(str(data), data_format, label_column)
    if x.shape[0] == 0:
        raise PredictError(f"{'the array' if array else data} holds no rows. Allowed: at least "
                           f"one row. Fix: pass the rows to predict")
    x = match_columns(x, names, run_features(run_dir, summary),
                      "the DataFrame" if frame else "the array" if array else "DATA")
    result: Prediction = load(PREDICTORS[method])(run_dir, summary, x, options)
    far = int(result.meta.get("far_rows", 0))
    if far:
        import logging

        logging.getLogger("fedclust").warning(
            "predict: %d of %d rows lie far outside the data the run was fitted on (more than "
            "%g times the spread of its centers from the nearest one): their labels mean "
            "little. Check their units, their columns and the run", far, len(x),
            FAR_FACTOR)
    if out is not None:
        _write(out, result)
    return result


def run_features(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any] | None:
    """What the run knows of its feature columns: ``{"names": [...]}`` and/or ``{"digest":
    int}`` (``features.json`` of a run folder; ``feature_names`` of a site's ``predict.json``),
    or None."""
    if summary.get("scope") == "client":
        names = summary.get("feature_names")
        return {"names": names} if _names_ok(names) else None
    path = run_dir / "features.json"
    if not path.is_file():
        return None
    try:
        known = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise PredictError(f"{path} cannot be read as JSON: the file is damaged. Allowed: the "
                           f"features.json fedclust wrote. Fix: {FIX_RUN}") from None
    if not isinstance(known, dict):
        raise PredictError(f"{path} holds no JSON object. Allowed: the features.json fedclust "
                           f"wrote. Fix: {FIX_RUN}")
    out: dict[str, Any] = {}
    if _names_ok(known.get("names")):
        out["names"] = known["names"]
    digest = known.get("digest")
    if isinstance(digest, int) and not isinstance(digest, bool) and digest > 0:
        out["digest"] = digest
    return out or None


def _names_ok(names: Any) -> bool:
    return (isinstance(names, list) and bool(names)
            and all(isinstance(n, str) for n in names))


def match_columns(x: np.ndarray, names: list[str] | None, known: dict[str, Any] | None,
                  what: str) -> np.ndarray:
    """``x``'s columns in the run's order, matched by name when both sides name them.

    The run's names (a site folder, ``dataset="files"``, ``simulate`` with DataFrames): the
    columns are taken by name, whatever their order; a name missing or extra is refused. Only
    the digest of the nodes' names (a deployed federation): the names must be the same in the
    same order. Rows without names (an array, a file without a header) are taken by position.

    Raises
    ------
    PredictError
        The names differ from the run's.
    """
    if known is None or names is None:
        return x
    from fedclust.data.local import names_digest

    def norm(n: str) -> str:
        return n.strip().casefold()

    if "names" in known:
        want = known["names"]
        have = {norm(n): i for i, n in enumerate(names)}
        missing = [n for n in want if norm(n) not in have]
        extra = [n for n in names if norm(n) not in {norm(w) for w in want}]
        if missing or extra or len(have) != len(names):
            raise PredictError(
                f"{what} has the columns {names}, but the run was fitted on {want}"
                f"{f' (missing: {missing})' if missing else ''}"
                f"{f' (not in the run: {extra})' if extra else ''}. Allowed: the run's feature "
                f"columns, in any order (a label column named with --label-column). Fix: give "
                f"{what} those columns")
        return x[:, [have[norm(n)] for n in want]]
    if names_digest(names) != known.get("digest"):
        raise PredictError(
            f"{what} has the columns {names}, which are not those the run was fitted on (other "
            f"names, or another order: the run knows only a digest of its nodes' names, never "
            f"the names). Allowed: the nodes' feature columns in their order. Fix: reorder or "
            f"rename {what}'s columns as in the nodes' files, or predict from a site's own "
            f"results folder, which knows the names and matches them in any order")
    return x


def _write(out: Path, result: Prediction) -> None:
    """The prediction as CSV, atomically; folders created for it are removed on an error."""
    from fedclust.results import write_table

    created = [p for p in (out.parent, *out.parent.parents) if not p.exists()]
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        write_table(out, result.header, result.table, result.fmt or "%.17g")
    except BaseException:
        for folder in created:          # deepest first
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedclust predict", description="Apply a finished run to new rows.")
    parser.add_argument("run_dir", help="the run's results folder (holds summary.json)")
    parser.add_argument("data", help="csv/tsv/npz/npy file or image folder, as a node's data-path")
    parser.add_argument("--out", required=True,
                        help="CSV to write (row,cluster,...): a new file outside RUN_DIR and "
                             "other than DATA")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace --out if it exists (never an input)")
    parser.add_argument("--data-format", default="", help="as node config 'data-format'")
    parser.add_argument("--label-column", default="",
                        help="a label column in DATA to drop (name or 0-based index)")
    parser.add_argument("--cluster", type=int, default=None,
                        help="EMD-CFL: the cluster whose model predicts (see the run's summary)")
    args = parser.parse_args(argv)
    options = {} if args.cluster is None else {"cluster": args.cluster}
    try:
        result = predict(args.run_dir, args.data, args.out, data_format=args.data_format,
                         label_column=args.label_column, overwrite=args.overwrite, **options)
    except (PredictError, ValueError) as exc:
        print(f"fedclust predict: {_one_line(str(exc))}", file=sys.stderr)
        return 2
    except OSError as exc:       # unreadable input, unwritable --out: no traceback
        name = f" {exc.filename!r}" if exc.filename else ""
        print(f"fedclust predict: cannot read or write{name}: {exc.strerror or exc}",
              file=sys.stderr)
        return 2
    counts = np.bincount(result.labels) if len(result.table) else []
    print(f"{len(result.table)} rows -> {args.out} ({result.header[1]} counts "
          f"{list(map(int, counts))})")
    if result.meta.get("far_rows"):
        print(f"fedclust predict: warning: {result.meta['far_rows']} of {len(result.table)} "
              f"rows lie far outside the data the run was fitted on (more than {FAR_FACTOR:g} "
              f"times the spread of its centers from the nearest one): their labels mean "
              f"little. Check their units and columns", file=sys.stderr)
    return 0


def _one_line(text: str) -> str:
    return " ".join(text.split())
