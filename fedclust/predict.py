"""Apply a finished run to new rows: ``fedclust predict RUN_DIR DATA --out FILE``.

Works on any machine that holds the run's results folder (``summary.json`` and the arrays or
models the method saved). ``DATA`` is read with the loader a deployed node uses for its
``data-path`` (csv/tsv, npz, npy, a folder of images), so a site's own file predicts to the
labels it received at the end of the run.

- ``exact-fcm``, ``fedfcm``: the run's federated scaling, then FCM memberships to the final
  centers (FedFCM: at the chosen K); columns ``row,label,u0,…,u<C−1>``.
- ``fedcref``: each row goes to the community model that reconstructs it best; ``row,label``.
- ``emdcfl``: class predictions of one cluster's model (``cluster=``); ``row,label``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fedclust.prediction import PredictError, Prediction, check_width

# method -> "module:function(run_dir, summary, x, options) -> Prediction"
PREDICTORS: dict[str, str] = {
    "exact-fcm": "fedclust.predict:predict_fcm",
    "fedfcm": "fedclust.predict:predict_fcm",
    "fedcref": "fedclust.fedcref.predict:predict_rows",
    "emdcfl": "fedclust.emdcfl.predict:predict_rows",
}


def load_summary(run_dir: str | Path) -> dict[str, Any]:
    """``summary.json`` of a run's folder, or ``predict.json`` of a data owner's folder."""
    folder = Path(run_dir).expanduser()
    for name in ("summary.json", "predict.json"):
        if (folder / name).is_file():
            return json.loads((folder / name).read_text())
    raise PredictError(f"{folder} holds neither summary.json nor predict.json: RUN_DIR must be "
                       f"the results folder of a finished run, or a site's own results folder")


def predict(run_dir: str | Path, data: str | Path | np.ndarray, out: str | Path | None = None,
            *, data_format: str = "", label_column: str = "", **options: Any) -> Prediction:
    """Apply the run in ``run_dir`` to ``data`` (a file/folder, or an array of rows).

    Parameters
    ----------
    run_dir : path
        A finished run's results folder.
    data : path or ndarray
        New rows, in the run's original feature units.
    out : path, optional
        Write the prediction as CSV there.
    data_format, label_column : str
        As the node config keys of the same names (a label column is dropped, not used).
    **options
        Method options, e.g. ``cluster=2`` for EMD-CFL.
    """
    run_dir = Path(run_dir).expanduser()
    summary = load_summary(run_dir)
    method = summary.get("method")
    if method not in PREDICTORS:
        raise PredictError(f"{run_dir}/summary.json names method {method!r}; predict knows "
                           f"{sorted(PREDICTORS)}")
    if isinstance(data, np.ndarray):
        x = np.asarray(data, dtype=np.float64)
        x = x.reshape(len(x), -1) if x.ndim != 2 else x
    else:
        from fedclust.data.local import load_local_table

        x, _ = load_local_table(str(data), data_format, label_column)
    if x.shape[0] == 0:
        raise PredictError(f"{data} holds no rows")
    module, _, fn = PREDICTORS[method].partition(":")
    result: Prediction = getattr(importlib.import_module(module), fn)(run_dir, summary, x,
                                                                      options)
    if out is not None:
        from fedclust.results import write_table

        out = Path(out).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        write_table(out, result.header, result.table, result.fmt or "%.17g")
    return result


def predict_fcm(run_dir: Path, summary: dict[str, Any], x: np.ndarray,
                options: dict[str, Any]) -> Prediction:
    """FCM memberships (paper 004 eq. 3 / paper 003 eq. 2) to the run's final centers, in the
    run's federated scaling."""
    from fedclust import fcm
    from fedclust.data import scaling

    if options:
        raise PredictError(f"method {summary['method']} takes no options, got {sorted(options)}")
    try:
        centers = np.load(run_dir / "centers.npy")
        shift = np.load(run_dir / "scaling_shift.npy")
        scale = np.load(run_dir / "scaling_scale.npy")
    except FileNotFoundError as exc:
        raise PredictError(f"{run_dir} lacks {Path(exc.filename).name}: the run did not finish "
                           f"or was made by an older fedclust") from exc
    check_width(x, centers.shape[1], "centers have")
    cfg = summary["config"]
    m = float(cfg["fcm.m"] if summary["method"] == "exact-fcm" else cfg["fedfcm.m"])
    u = fcm.memberships(scaling.apply(x, shift, scale), centers, m)
    labels = np.argmax(u, axis=1)
    table = np.column_stack([np.arange(len(x)), labels, u])
    header = ["row", "label"] + [f"u{i}" for i in range(centers.shape[0])]
    return Prediction(header, table, ["%d", "%d"] + ["%.17g"] * centers.shape[0],
                      {"n_clusters": int(centers.shape[0])})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedclust predict", description="Apply a finished run to new rows.")
    parser.add_argument("run_dir", help="the run's results folder (holds summary.json)")
    parser.add_argument("data", help="csv/tsv/npz/npy file or image folder, as a node's data-path")
    parser.add_argument("--out", required=True, help="CSV to write (row,label,...)")
    parser.add_argument("--data-format", default="", help="as node config 'data-format'")
    parser.add_argument("--label-column", default="",
                        help="a label column in DATA to drop (name or 0-based index)")
    parser.add_argument("--cluster", type=int, default=None,
                        help="EMD-CFL: the cluster whose model predicts (see the run's summary)")
    args = parser.parse_args(argv)
    options = {} if args.cluster is None else {"cluster": args.cluster}
    try:
        result = predict(args.run_dir, args.data, args.out, data_format=args.data_format,
                         label_column=args.label_column, **options)
    except (PredictError, ValueError) as exc:
        print(f"fedclust predict: {exc}", file=sys.stderr)
        return 2
    counts = np.bincount(result.labels) if len(result.table) else []
    print(f"{len(result.table)} rows -> {args.out} (label counts {list(map(int, counts))})")
    return 0
