"""Results a client keeps for its data owner: written on the node, never sent anywhere.

At the end of a run each client writes what the run means for its own rows (its assignments,
the final centers or its cluster's model) into its *owner folder*:

- deployment, node config ``output-dir`` set: ``<output-dir>/<run-id>/``;
- deployment, no ``output-dir``:
  ``<folder of data-path>/fedclust-results/<name of data-path>/<run-id>/``;
- simulation (node config ``partition-id``, ``dataset="files"`` included):
  ``<run's output-dir>/clients/<partition-id>/``.
  The server names its results folder in the final message (config record ``"result"``,
  key ``"run-dir"``); a deployed node ignores it, since the server's paths mean nothing there.

``result.json`` is written last, so a folder without it is visibly incomplete.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context, Message

from fedclust.results import write_table

RESULT_RECORD = "result"


def owner_dir(msg: Message, context: Context, run_dir: str | None = None) -> Path | None:
    """The folder this client writes its owner's results to (created), or ``None``.

    ``None`` when the node is simulated and the server named no results folder (e.g. a test
    message without the ``"result"`` record). ``run_dir`` overrides the record (SecAgg+
    messages carry it in their fit config).
    """
    node = context.node_config
    run_id = str(context.run_id)
    if run_dir is None:
        rec = msg.content.config_records.get(RESULT_RECORD)
        run_dir = str(rec.get("run-dir", "")) if rec is not None else ""
    if str(node.get("output-dir", "")):
        path = Path(str(node["output-dir"])).expanduser() / run_id
    elif "partition-id" in node:   # simulated (dataset=files too: data-path is then set)
        if not run_dir:
            return None
        path = Path(run_dir) / "clients" / str(int(node["partition-id"]))
    elif "data-path" in node:   # named after the file: sites may share a folder
        data = Path(str(node["data-path"])).expanduser().resolve()
        path = data.parent / "fedclust-results" / data.name / run_id
    else:
        return None
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_assignments(folder: Path, labels: np.ndarray,
                      memberships: np.ndarray | None = None) -> Path:
    """``assignments.csv``: ``row,label[,u0,…,u<C−1>]``, one line per input row in input order."""
    labels = np.asarray(labels).astype(np.int64).ravel()
    cols = [np.arange(labels.size), labels]
    header = ["row", "label"]
    fmt = ["%d", "%d"]
    if memberships is not None:
        u = np.asarray(memberships, dtype=np.float64).reshape(labels.size, -1)
        cols += list(u.T)
        header += [f"u{i}" for i in range(u.shape[1])]
        fmt += ["%.17g"] * u.shape[1]
    return write_table(folder / "assignments.csv", header, np.column_stack(cols), fmt)


def write_result(folder: Path, meta: Mapping[str, Any]) -> Path:
    """``result.json`` (what the run gave this client), written atomically and last."""
    from fedclust.results import to_jsonable

    path = folder / "result.json"
    tmp = path.with_name("result.json.part")
    tmp.write_text(json.dumps(to_jsonable(dict(meta)), indent=2))
    os.replace(tmp, path)
    return path


def write_predict_info(folder: Path, method: str, config: Mapping[str, Any], **extra: Any) -> Path:
    """``predict.json`` (``scope: "client"``): what ``fedclust predict`` needs to be pointed at
    the owner folder itself; ``config`` holds only the keys prediction needs."""
    path = folder / "predict.json"
    tmp = path.with_name("predict.json.part")
    tmp.write_text(json.dumps({"method": method, "scope": "client", "config": dict(config),
                               **extra}, indent=2))
    os.replace(tmp, path)
    return path
