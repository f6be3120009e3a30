"""Results contract: ``summary.json``, ``history.jsonl``, arrays, and progress lines.

Every run writes to its output directory:

- ``summary.json`` with ``method, dataset, seed, num_clients, config, wall_time_s, metrics``;
- ``history.jsonl``, one JSON object per round/iteration;
- arrays such as ``centers.npy``; PNG plots where the method has an iteration story;
- ``.fedclust-manifest.json``, everything fedclust wrote there (:mod:`fedclust.outputs`):
  ``overwrite=true`` removes exactly that and nothing else.

Every file is written atomically (a temporary file beside it, then a rename).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from fedclust import outputs, trackers
from fedclust.common import setting
from fedclust.outputs import OutputDirError
from fedclust.trackers import Tracker, open_tracker

LOG = logging.getLogger("fedclust")


def read_history(path: str | Path) -> list[dict[str, Any]]:
    """The records of a run's ``history.jsonl`` (one dict per round/iteration)."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def to_jsonable(value: Any) -> Any:
    """Convert numpy scalars/arrays and nested containers into JSON-serialisable values."""
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.ndarray):
        return to_jsonable(value.tolist())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None if np.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, Path):
        return str(value)
    return value


class Progress:
    """Log ``step i/n`` lines with elapsed time and an estimate of the time remaining."""

    def __init__(self, total: int, label: str, logger: logging.Logger = LOG) -> None:
        self.total, self.label, self.logger = max(int(total), 1), label, logger
        self.start = time.perf_counter()

    def step(self, i: int, message: str = "") -> str:
        elapsed = time.perf_counter() - self.start
        remaining = elapsed / max(i, 1) * (self.total - i)
        line = (f"{self.label} {i}/{self.total} | elapsed {elapsed:7.1f}s | "
                f"~{remaining:6.1f}s left | {message}")
        self.logger.info(line)
        return line


class Record(Protocol):
    """Where a server loop puts what it learns as it runs: one record per round, and arrays.
    :class:`RunRecorder` writes them to the run's folder; :class:`MemoryRecord` keeps them in
    memory."""

    history: list[dict[str, Any]]
    arrays: dict[str, np.ndarray]

    def log_round(self, record: Mapping[str, Any]) -> None:
        """One round's or iteration's record."""

    def save_array(self, name: str, array: np.ndarray) -> Any:
        """An array of the run's result, named ``name``."""


class MemoryRecord:
    """A :class:`Record` in memory (runs over in-memory clients, tests): the records as
    ``history.jsonl`` would hold them, the arrays by name."""

    def __init__(self) -> None:
        self.history: list[dict[str, Any]] = []
        self.arrays: dict[str, np.ndarray] = {}

    def log_round(self, record: Mapping[str, Any]) -> None:
        self.history.append(to_jsonable(dict(record)))

    def save_array(self, name: str, array: np.ndarray) -> None:
        self.arrays[name] = np.array(array, copy=True)


class RunRecorder:
    """Write the results of one run to ``output_dir``.

    The folder is claimed first (:func:`claim_folder`); every file goes through
    :mod:`fedclust.outputs`, so it is written atomically and recorded in the folder's manifest.

    Parameters
    ----------
    output_dir : str or Path
        Created if missing. ``history.jsonl`` is truncated at start.
    method, dataset : str
    seed, num_clients : int
    config : mapping
        The full resolved run config (written verbatim into ``summary.json``).
    overwrite : bool
        Remove what an earlier fedclust run wrote in ``output_dir`` first.
    """

    def __init__(self, output_dir: str | Path, method: str, dataset: str, seed: int,
                 num_clients: int, config: Mapping[str, Any], overwrite: bool = False,
                 data: Mapping[str, Any] | None = None) -> None:
        self.dir = Path(output_dir).expanduser().resolve()
        self.method, self.dataset, self.seed, self.num_clients = method, dataset, seed, num_clients
        self.start = time.perf_counter()
        claim_folder(self.dir, overwrite)
        try:        # the folder is ours from here: an interruption marks and releases it
            self._setup(config, data)
        except BaseException as exc:
            self.interrupted(exc)
            raise

    def _setup(self, config: Mapping[str, Any], data: Mapping[str, Any] | None) -> None:
        self.config = dict(config)
        #: what the run clustered (:func:`data_record`), ``summary.json``'s ``data``
        self.data = dict(data) if data else None
        self.history: list[dict[str, Any]] = []
        #: every array saved, by name, as saved (the run's result in memory)
        self.arrays: dict[str, np.ndarray] = {}
        #: called by :meth:`log_round`; what it returns is added to the record (the server
        #: loop's runner uses it for entries every method shares, e.g. ``excluded_nodes``)
        self.round_notes: Callable[[], Mapping[str, Any]] | None = None
        self.start = time.perf_counter()
        self._history_path = self.dir / "history.jsonl"
        outputs.write_text(self._history_path, "")
        #: the run-config ``tracker`` (:mod:`fedclust.trackers`): MLflow or TensorBoard get
        #: every record, the final metrics and the artifacts as well
        self.tracker: Tracker | None = None
        self.tracker = open_tracker(str(setting(self.config, "tracker")), self.dir, self.config,
                                    self.data)
        #: seconds spent opening the tracker (its store, the experiment, the params): not part
        #: of the run's ``wall_time_s``, which starts after it
        self.tracker_s = round(time.perf_counter() - self.start, 4)
        self.start = time.perf_counter()

    def log_round(self, record: Mapping[str, Any]) -> None:
        """Append one record (a round/iteration) to ``history.jsonl``."""
        rec = dict(record)
        if self.round_notes is not None:
            rec.update(self.round_notes())
        rec = to_jsonable(rec)
        rec.setdefault("elapsed_s", round(time.perf_counter() - self.start, 4))
        self.history.append(rec)
        outputs.append_line(self._history_path, json.dumps(rec))
        self.tracker = trackers.safe(self.tracker, "log_round", rec, len(self.history) - 1)

    def save_array(self, name: str, array: np.ndarray) -> Path:
        """Save ``array`` as ``<name>.npy`` (atomically), and keep a copy in :attr:`arrays`."""
        self.arrays[name] = np.array(array, copy=True)
        return outputs.save_npy(self.dir / f"{name}.npy", np.asarray(array))

    def save_json(self, name: str, obj: Any) -> Path:
        """Save ``obj`` as ``<name>.json`` (atomically)."""
        return outputs.write_json(self.dir / f"{name}.json", to_jsonable(obj))

    def path(self, name: str) -> Path:
        """The path of a file ``name`` the caller writes into the folder, recorded in the
        manifest (write it with :func:`fedclust.outputs.write_atomic`)."""
        path = self.dir / name
        outputs.record(path, outputs.FILE)
        return path

    def finish(self, metrics: Mapping[str, Any], extra: Mapping[str, Any] | None = None
               ) -> dict[str, Any]:
        """Write ``summary.json`` (atomically, and last) and return it (``extra``: more
        top-level entries, placed before ``metrics``)."""
        summary = {
            "method": self.method,
            "dataset": self.dataset,
            "seed": self.seed,
            "num_clients": self.num_clients,
            "config": self.config,
            **({"data": self.data} if self.data else {}),
            "wall_time_s": round(time.perf_counter() - self.start, 4),
            **({"tracker_setup_s": self.tracker_s} if self.tracker is not None else {}),
            **dict(extra or {}),
            "metrics": dict(metrics),
        }
        if self.tracker is not None:
            summary["tracker"] = self.tracker.describe()
        summary = to_jsonable(summary)
        self.tracker = trackers.safe(self.tracker, "final", summary)
        outputs.write_json(self.dir / "summary.json", summary)
        (self.dir / RUNNING).unlink(missing_ok=True)
        self.tracker = trackers.safe(self.tracker, "finish", summary, self.dir)
        LOG.info("results written to %s", self.dir)
        return summary

    def interrupted(self, exc: BaseException) -> None:
        """Mark the folder as the result of a run that did not finish (no summary.json)."""
        (self.dir / RUNNING).unlink(missing_ok=True)
        outputs.write_json(self.dir / INTERRUPTED, {
            "method": self.method, "error": type(exc).__name__, "message": str(exc)[:2000],
            "wall_time_s": round(time.perf_counter() - self.start, 4)})
        self.tracker = trackers.safe(getattr(self, "tracker", None), "fail", exc)


#: the ``partition.*`` keys that each ``partition.kind`` reads (the others do not apply)
PARTITION_PARAMS = {"dirichlet": ("partition.alpha",), "column": ("partition.column",),
                    "pathological": ("partition.classes-per-client",),
                    "shard": ("partition.shards-per-client",), "size": ("partition.sizes",)}
#: run-config datasets whose clients read their own files (no partition of a shared dataset)
OWN_FILES = ("local", "files")


def data_record(cfg: Mapping[str, Any], given: Mapping[str, Any] | None = None
                ) -> dict[str, Any]:
    """``summary.json``'s ``data``: what the run clustered. ``given`` (from
    :func:`fedclust.simulate`: the arrays, DataFrames or Hugging Face data it was handed, the
    flwr-datasets partitioner with its parameters, the dataset's fingerprint) wins; else it is
    told from the run config: the dataset the method ran on (a method's own default resolved,
    e.g. FedCRef's ``digits``) and how it was split across the clients."""
    if given:
        return dict(given)
    name = str(cfg["dataset"])
    if name == "local":
        return {"dataset": "local", "source": "each node's own file (node config data-path)"}
    if name == "files":
        return {"dataset": "files", "source": "one file of data-dir per client",
                "data-dir": str(setting(cfg, "data-dir"))}
    out: dict[str, Any] = {"dataset": name}
    if name == "hf":
        out["hf"] = {k[3:]: cfg[k] for k in ("hf.path", "hf.split", "hf.label-column")
                     if cfg.get(k, "") != ""}
    if cfg["method"] in ("exact-fcm", "fedfcm"):     # the image methods split their own way
        kind = str(setting(cfg, "partition.kind"))
        out["partition"] = {"kind": kind, **{k.split(".", 1)[1]: cfg[k]
                                             for k in PARTITION_PARAMS.get(kind, ())}}
    return out


def recorded_config(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The run config as ``summary.json`` records it: without the ``partition.*`` keys where
    no partition of fedclust's is made (clients with their own files), so that no record says
    ``partition.kind="iid"`` for data it never split."""
    if cfg.get("dataset") in OWN_FILES:
        return {k: v for k, v in cfg.items() if not k.startswith("partition.")}
    return dict(cfg)


def terminate_as_interrupt() -> None:
    """SIGTERM (``kill``, a scheduler's stop) ends a command as Ctrl-C does: a run in progress
    marks its folder ``interrupted.json`` and releases it, instead of dying with its folder
    still marked running. Only in the main thread of a process fedclust's command owns."""
    import signal
    import threading

    def stop(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"stopped by signal {signal.Signals(signum).name}")

    if threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
        signal.signal(signal.SIGTERM, stop)


RUNNING = "RUNNING"            # exists while a run writes to the folder (created exclusively)
INTERRUPTED = "interrupted.json"


def claim_folder(folder: Path, overwrite: bool = False) -> None:
    """Make ``folder`` this run's own, before any work starts.

    A new or empty folder is taken. A folder in use by a running run is refused. A folder
    holding anything is refused unless ``overwrite`` and it is the folder of an earlier fedclust
    run: then exactly what that run wrote (its manifest, :mod:`fedclust.outputs`) is removed,
    and anything else in it refuses the run with the first such entry named, before anything
    is removed. Hidden entries and ``*.log`` files (Hydra's job folder) do not count and are
    left alone. The folder then gets a new manifest.
    """
    _check_not_a_file(folder)
    try:
        outputs.make_dirs(folder)
        fd = os.open(folder / RUNNING, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError as exc:
        if Path(exc.filename or "") != folder / RUNNING:
            raise _unwritable(folder, exc) from None
        raise _in_use(folder) from None
    except OSError as exc:      # a folder this user cannot create or write
        raise _unwritable(folder, exc) from None
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    try:
        kept = _clear_for_run(folder, overwrite)
        outputs.write_manifest(folder, {**kept, RUNNING: outputs.FILE})
    except OSError as exc:
        (folder / RUNNING).unlink(missing_ok=True)
        raise _unwritable(folder, exc) from None
    except BaseException:
        (folder / RUNNING).unlink(missing_ok=True)
        raise


def check_folder(folder: str | Path, overwrite: bool = False) -> None:
    """:func:`claim_folder`'s verdict on ``folder``, without writing anything but a probe
    folder, made and removed at once where permissions alone cannot tell (``fedclust check``, a
    sweep's grid check): the same refusals, with the same messages.

    Raises
    ------
    OutputDirError
        ``folder`` is a file, is in use by a run, holds what a run there would mix with, holds
        an entry ``overwrite=true`` would not remove, or cannot be created here.
    """
    folder = Path(folder).expanduser().resolve()
    _check_not_a_file(folder)
    if not folder.exists():
        parent = next((p for p in folder.parents if p.exists()), None)
        if parent is None or not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise OutputDirError(f"output-dir {str(folder)!r} cannot be created: "
                                 f"{str(parent)!r} is not a folder this process may write in. "
                                 f"Fix: pass an output-dir in a folder you can write to")
        try:        # permissions say yes (root: always); the file system may still say no
            import tempfile

            os.rmdir(tempfile.mkdtemp(prefix=".fedclust-check-", dir=parent))
        except OSError as exc:
            raise _unwritable(folder, exc) from None
        return
    if (folder / RUNNING).exists():
        raise _in_use(folder)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputDirError(f"output-dir {str(folder)!r} is not writable by this process. Fix: "
                             f"pass an output-dir you can write to")
    if _refuse_for_run(folder, overwrite):
        outputs.check_clearable(folder, skip=(RUNNING,))


def _check_not_a_file(folder: Path) -> None:
    if folder.exists() and not folder.is_dir():
        raise OutputDirError(f"output-dir {str(folder)!r} is a file, not a folder. Allowed: a "
                             f"new or empty folder (or an earlier run's, with overwrite=true). "
                             f"Fix: choose another output-dir")


def _in_use(folder: Path) -> OutputDirError:
    return OutputDirError(
        f"output-dir {str(folder)!r} is in use by another run (it holds {RUNNING}). "
        f"Allowed: a folder no run is writing to. Fix: pass another output-dir, or leave it "
        f"empty for a new folder per run (delete {RUNNING} if that run is dead)")


def _unwritable(folder: Path, exc: OSError) -> OutputDirError:
    return OutputDirError(
        f"output-dir {str(folder)!r} cannot be created or written ({type(exc).__name__}: "
        f"{exc.strerror or exc}{f', at {exc.filename!r}' if exc.filename else ''}). Allowed: a "
        f"folder this user may create and write. Fix: pass another output-dir (or leave it "
        f"empty for a new folder under ~/fedclust-runs), or fix the folder's permissions")


def _clear_for_run(folder: Path, overwrite: bool) -> dict[str, str]:
    """:func:`claim_folder` once ``RUNNING`` is held: the manifest entries that stay."""
    if not _refuse_for_run(folder, overwrite):
        return {}
    return outputs.clear_folder(folder, skip=(RUNNING,))


def _refuse_for_run(folder: Path, overwrite: bool) -> bool:
    """Refuse a non-empty ``folder`` that a run may not take (no manifest, or no
    ``overwrite``); True when an earlier run's results are to be cleared."""
    names = outputs.visible_entries(folder, skip=(RUNNING,))
    if not names:
        return False
    listed = f"{names[:6]}{' …' if len(names) > 6 else ''}"
    manifest = outputs.read_manifest(folder)
    if manifest is None:
        what = (f"output-dir {str(folder)!r} is not empty (it holds {listed}) and holds no "
                f"{outputs.MANIFEST}, so it is not the folder of an earlier fedclust run")
        why = ("nothing was removed" if overwrite
               else "a run there would mix its results with what is there")
        raise OutputDirError(
            f"{what}: {why}. "
            f"Allowed: an empty or new folder (overwrite=true clears only a folder fedclust "
            f"wrote, one with {outputs.MANIFEST}, and removes only what fedclust wrote there). "
            f"Fix: pass another output-dir, or leave output-dir empty for a new folder per run")
    if not overwrite:
        raise OutputDirError(
            f"output-dir {str(folder)!r} is not empty (it holds {listed}): a run there would "
            f"mix its results with what is there. Allowed: an empty or new folder, or "
            f"overwrite=true for the folder of an earlier fedclust run (it removes only what "
            f"that run wrote). Fix: pass another output-dir, leave output-dir empty, or pass "
            f"overwrite=true")
    return True


def write_table(path: Path, header: Sequence[str], table: np.ndarray,
                fmt: str | Sequence[str] = "%.17g") -> Path:
    """A CSV with a header line, written atomically: :func:`table_bytes`."""
    data = table_bytes(header, table, fmt)
    return outputs.write_atomic(path, lambda fh: fh.write(data))


def table_bytes(header: Sequence[str], table: np.ndarray, fmt: str | Sequence[str] = "%.17g"
                ) -> bytes:
    """The bytes of ``numpy.savetxt(fh, table, delimiter=",", header=",".join(header),
    comments="", fmt=fmt)``, formatted a block of rows at a time (half its cost: a simulation
    writes one table per client)."""
    rows = np.asarray(table).reshape(len(table), -1)
    ncol = rows.shape[1]
    if isinstance(fmt, str):
        line = ",".join([fmt] * ncol) if fmt.count("%") == 1 else fmt
    else:
        line = ",".join(fmt)
    line += "\n"
    parts = [(",".join(header) + "\n").encode("latin1")]
    for start in range(0, len(rows), TABLE_BLOCK):
        block = rows[start:start + TABLE_BLOCK]
        parts.append(((line * len(block)) % tuple(block.ravel().tolist())).encode("latin1"))
    return b"".join(parts)


TABLE_BLOCK = 8192      # rows formatted at once by write_table


# The assignments tables this process wrote for simulated owners inside keeping_written() (an
# in-process simulation writes thousands, then reads them back for RunResult): by path, what
# parsing the file gives, with the file's identity just after the write. A reader takes them
# (once) while the file is that same file; a file replaced, changed or touched since is parsed.
_WRITTEN: dict[str, tuple[tuple[int, ...], np.ndarray, np.ndarray | None]] = {}
_WRITTEN_BYTES = [0]
_KEEPING = [0]          # open keeping_written() contexts
_WRITTEN_LOCK = threading.Lock()
WRITTEN_TABLES_BYTES = 256 * 1024 ** 2
"""Most bytes of written tables kept for a reader (the oldest go first)."""


@contextlib.contextmanager
def keeping_written() -> Iterator[None]:
    """Within: the assignments tables this process writes are kept for
    :func:`recall_written` (``fedclust.simulate``: its run, then its reading the owners'
    tables back); all are dropped at the outermost exit."""
    with _WRITTEN_LOCK:
        _KEEPING[0] += 1
    try:
        yield
    finally:
        with _WRITTEN_LOCK:
            _KEEPING[0] -= 1
            if _KEEPING[0] == 0:
                _WRITTEN.clear()
                _WRITTEN_BYTES[0] = 0


def remember_written(path: str | Path, labels: np.ndarray, memberships: np.ndarray | None
                     ) -> None:
    """Keep what ``path`` (an ``assignments.csv`` just written with these ``labels`` and
    ``memberships``) parses to, for :func:`recall_written`; nothing outside
    :func:`keeping_written`."""
    if not _KEEPING[0]:
        return
    try:
        ident = outputs.file_identity(os.stat(path))
    except OSError:
        return
    entry = (ident, np.array(labels, dtype=np.int64),
             None if memberships is None else np.array(memberships, dtype=np.float64))
    key = os.path.abspath(path)
    with _WRITTEN_LOCK:
        if not _KEEPING[0]:
            return
        old = _WRITTEN.pop(key, None)
        if old is not None:
            _WRITTEN_BYTES[0] -= _nbytes(old)
        _WRITTEN[key] = entry
        _WRITTEN_BYTES[0] += _nbytes(entry)
        while _WRITTEN_BYTES[0] > WRITTEN_TABLES_BYTES and _WRITTEN:
            _WRITTEN_BYTES[0] -= _nbytes(_WRITTEN.pop(next(iter(_WRITTEN))))


def _nbytes(entry: tuple[tuple[int, ...], np.ndarray, np.ndarray | None]) -> int:
    return entry[1].nbytes + (0 if entry[2] is None else entry[2].nbytes)


def recall_written(path: str | Path) -> tuple[np.ndarray, np.ndarray | None] | None:
    """``(labels, memberships)`` of an ``assignments.csv`` this process wrote
    (:func:`remember_written`), given once, while the file is the one written; None: parse it."""
    key = os.path.abspath(path)
    with _WRITTEN_LOCK:
        entry = _WRITTEN.pop(key, None)
        if entry is not None:
            _WRITTEN_BYTES[0] -= _nbytes(entry)
    if entry is None:
        return None
    try:
        same = outputs.file_identity(os.stat(key)) == entry[0]
    except OSError:
        return None
    return (entry[1], entry[2]) if same else None


def coverage(method: str, figure: str, covered: Iterable[Any], of_nodes: Iterable[Any],
             rows: int | None = None) -> dict[str, Any]:
    """``{"nodes", "of_nodes", "missing"[, "rows"]}``: which of the run's clients a figure of the
    summary (``figure``, e.g. ``"objective"``) rests on. Every figure computed from one phase's
    replies says so, so that a phase that lost a node never reports the others' figure as the
    whole; a partial figure is also logged as a warning naming the missing clients."""
    covered, of_nodes = set(covered), sorted(set(of_nodes))
    missing = [n for n in of_nodes if n not in covered]
    if missing:
        LOG.warning("%s: %s covers %d of %d nodes; not: %s (they dropped out, withheld or were "
                    "excluded in that phase) — summary metrics.%s_coverage", method, figure,
                    len(of_nodes) - len(missing), len(of_nodes), missing, figure)
    out: dict[str, Any] = {"nodes": len(of_nodes) - len(missing), "of_nodes": len(of_nodes),
                           "missing": missing}
    if rows is not None:
        out["rows"] = int(rows)
    return out


def eval_coverage(method: str, nodes: int, of_nodes: int, rows: int) -> dict[str, int]:
    """``{"nodes", "of_nodes", "rows"}``: how many clients (of the run's) and rows the
    ``eval_*`` figures rest on; logged as a warning when not every client contributed (a
    deployed node sends evaluation statistics only with node config
    ``allow-evaluation=true``)."""
    if nodes < of_nodes:
        LOG.warning("%s: the eval_* metrics cover %d of %d nodes (%d rows): the other nodes sent "
                    "no evaluation statistics (a deployed node sends them only with node config "
                    "allow-evaluation=true and labels in its data; or it dropped out, or its "
                    "reply was excluded) — summary metrics.eval_coverage", method, nodes,
                    of_nodes, rows)
    return {"nodes": int(nodes), "of_nodes": int(of_nodes), "rows": int(rows)}
