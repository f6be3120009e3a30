"""Results a client keeps for its data owner: written on the node, never sent anywhere.

At the end of a run each client writes what the run means for its own rows (its assignments,
the final centers or its cluster's model) into its *owner folder*:

- deployment, node config ``output-dir`` set: ``<output-dir>/<run-id>/<node key>/``, the node
  key being its data file's name without the suffix (``site0`` for ``site0.csv``), made
  file-name safe, or ``node-<node id>`` without a data file: nodes sharing an output folder
  keep apart;
- deployment, no ``output-dir``:
  ``<folder of data-path>/fedclust-results/<name of data-path>/<run-id>/``;
- simulation (node config ``partition-id``, ``dataset="files"`` included):
  ``<run's output-dir>/clients/<partition-id>/``.
  The server names its results folder in the final message (config record ``"result"``,
  key ``"run-dir"``); a deployed node ignores it, since the server's paths mean nothing there.

The owner folder is created exclusively (``os.mkdir``): when the name exists (another node with
the same key, or a run id seen before), the node warns and writes to ``<name>-2`` (``-3``, …)
instead, never into another writer's folder. The folder is kept in the node's state, so later
messages of the same run write to the same one. Every file is written atomically;
``result.json`` is written last, so a folder without it is visibly incomplete. A deployed node
flushes every file to disk as it writes it; a simulated node's files, in the server's run
folder, are flushed once at the end of the run (:func:`fedclust.outputs.flushed_by_run`).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from flwr.app import ConfigRecord, Context, Message

from fedclust import outputs
from fedclust.data.sites import RESULTS_FOLDER
from fedclust.results import remember_written, table_bytes, to_jsonable

T = TypeVar("T")

RESULT_RECORD = "result"
OWNER_STATE = "fedclust.owner-folder"   # context.state: the folder this node claimed


def owner_dir(msg: Message, context: Context, run_dir: str | None = None) -> Path | None:
    """The folder this client writes its owner's results to (claimed), or ``None``.

    ``None`` when the node is simulated and the server named no results folder (e.g. a test
    message without the ``"result"`` record). ``run_dir`` overrides the record (SecAgg+
    messages carry it in their fit config).
    """
    where = _owner_parent(msg, context, run_dir)
    if where is None:
        return None
    parent, name = where
    kept = context.state.get(OWNER_STATE)
    if isinstance(kept, ConfigRecord) and str(kept.get("parent", "")) == str(parent):
        folder = Path(str(kept["dir"]))
        if folder.is_dir() and not folder.is_symlink():
            return folder
    folder = outputs.claim_new_folder(parent, name)
    context.state[OWNER_STATE] = ConfigRecord({"parent": str(parent), "dir": str(folder)})
    return folder


def _owner_parent(msg: Message, context: Context, run_dir: str | None
                  ) -> tuple[Path, str] | None:
    """``(parent folder, name)`` of the owner folder (see the module docstring)."""
    node = context.node_config
    run_id = str(context.run_id)
    if run_dir is None:
        rec = msg.content.get(RESULT_RECORD)
        run_dir = str(rec.get("run-dir", "")) if isinstance(rec, ConfigRecord) else ""
    if str(node.get("output-dir", "")):
        return Path(str(node["output-dir"])).expanduser() / run_id, node_key(context)
    if "partition-id" in node:   # simulated (dataset=files too: data-path is then set)
        if not run_dir:
            return None
        # the server's run folder, on this machine: the run flushes it once at its end
        outputs.flushed_by_run(run_dir)
        return Path(run_dir) / "clients", str(int(node["partition-id"]))
    if "data-path" in node:   # named after the file: sites may share a folder
        data = Path(str(node["data-path"])).expanduser().resolve()
        return data.parent / RESULTS_FOLDER / data.name, run_id
    return None


def node_key(context: Context) -> str:
    """A stable, file-name-safe name of this node: its data file's name without the suffix
    (a folder's name), else ``node-<node id>``."""
    data = str(context.node_config.get("data-path", ""))
    key = outputs.safe_name(Path(data).stem) if data else ""
    return key or f"node-{int(context.node_id)}"


def write_assignments(folder: Path, labels: np.ndarray,
                      memberships: np.ndarray | None = None) -> Path:
    """``assignments.csv``: ``row,cluster[,u0,…,u<C−1>]``, one line per input row in input
    order (``cluster``: the row's cluster, never a ground-truth label)."""
    labels = np.asarray(labels).astype(np.int64).ravel()
    cols = [np.arange(labels.size), labels]
    header = ["row", "cluster"]
    fmt = ["%d", "%d"]
    if memberships is not None:
        u = np.asarray(memberships, dtype=np.float64).reshape(labels.size, -1)
        cols += list(u.T)
        header += [f"u{i}" for i in range(u.shape[1])]
        fmt += ["%.17g"] * u.shape[1]
    path = write_bytes(folder / "assignments.csv",
                       table_bytes(header, np.column_stack(cols), fmt))
    remember_written(path, labels, None if memberships is None else u)   # simulate's readback
    return path


def write_table(path: Path, header: list[str], table: np.ndarray,
                fmt: str | list[str] = "%.17g") -> Path:
    """A CSV of the owner folder (:func:`fedclust.results.table_bytes`), written atomically."""
    return write_bytes(path, table_bytes(header, table, fmt))


def npy_bytes(array: np.ndarray) -> bytes:
    """The bytes of an ``.npy`` file of the owner folder (:func:`save_array`)."""
    from fedclust.npy import dumps

    return dumps(np.asarray(array))


def write_result(folder: Path, meta: Mapping[str, Any]) -> Path:
    """``result.json`` (what the run gave this client), written atomically and last."""
    return write_bytes(folder / "result.json", outputs.json_bytes(to_jsonable(dict(meta))))


def write_predict_info(folder: Path, method: str, config: Mapping[str, Any], **extra: Any) -> Path:
    """``predict.json`` (``scope: "client"``): what ``fedclust predict`` needs to be pointed at
    the owner folder itself; ``config`` holds only the keys prediction needs."""
    return write_bytes(folder / "predict.json", predict_info_bytes(method, config, **extra))


def predict_info_bytes(method: str, config: Mapping[str, Any], **extra: Any) -> bytes:
    """The bytes of ``predict.json`` (:func:`write_predict_info`)."""
    return outputs.json_bytes({"method": method, "scope": "client", "config": dict(config),
                               **extra})


def save_array(path: Path, array: np.ndarray) -> Path:
    """An ``.npy`` file of the owner folder, written atomically."""
    return write_bytes(path, npy_bytes(array))


# (file name, bytes) -> the first owner folder's file with them, within shared_files(); and the
# bytes alike_bytes() made, by the objects and values they were made of
_SHARED: contextvars.ContextVar[dict[tuple[str, bytes], Path] | None] = contextvars.ContextVar(
    "fedclust_shared_owner_files", default=None)
_ALIKE: contextvars.ContextVar[dict[tuple[Any, ...], tuple[Any, tuple[Any, ...]]] | None] = \
    contextvars.ContextVar("fedclust_alike_owner_bytes", default=None)


def alike_bytes(made_of: tuple[Any, ...], make: Callable[[], T]) -> T:
    """``make()``; within :func:`shared_files`, made once for the nodes whose ``made_of`` are
    the same arrays (the same objects) and equal other values (settings, names): a simulated
    batch's nodes receive the same final centers and scaling, and write the same files of
    them."""
    made = _ALIKE.get()
    if made is None:
        return make()
    key = tuple((id(v),) if isinstance(v, np.ndarray) else v for v in made_of)
    hit = made.get(key)
    if hit is None:
        # the arrays are kept with the value: their ids stay theirs while the batch runs
        hit = made[key] = (make(), made_of)
    return hit[0]


@contextlib.contextmanager
def shared_files() -> Iterator[None]:
    """Within: simulated nodes' owner files that another node's folder already holds with the
    same name and bytes (the final centers, the scaling, ``predict.json`` of every simulated
    client of a run) are hard links of that one file, not new copies: an in-process engine
    writes thousands of owner folders at once. Only writes that the run makes durable at its
    end (:func:`fedclust.outputs.deferred`) are shared; a deployed node writes its own."""
    token, alike = _SHARED.set({}), _ALIKE.set({})
    try:
        yield
    finally:
        _SHARED.reset(token)
        _ALIKE.reset(alike)


def write_bytes(path: Path, data: bytes) -> Path:
    """``path`` holds ``data``, written atomically (or, within :func:`shared_files`, a link
    of the same file another owner folder holds)."""
    shared = _SHARED.get()
    if shared is None or not outputs.deferred(path):
        return outputs.write_atomic(path, lambda fh: fh.write(data))
    key = (path.name, data)
    first = shared.get(key)
    if first is not None:
        try:
            return outputs.link_file(first, path)
        except OSError:         # no hard links here: a copy of its own
            pass
    outputs.write_atomic(path, lambda fh: fh.write(data))
    shared[key] = path
    return path
