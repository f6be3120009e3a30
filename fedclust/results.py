"""Results contract: ``summary.json``, ``history.jsonl``, arrays, and progress lines.

Every run writes to its output directory:

- ``summary.json`` with ``method, dataset, seed, num_clients, config, wall_time_s, metrics``;
- ``history.jsonl``, one JSON object per round/iteration;
- arrays such as ``centers.npy``; PNG plots where the method has an iteration story.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

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


class RunRecorder:
    """Write the results of one run to ``output_dir``.

    Parameters
    ----------
    output_dir : str or Path
        Created if missing. ``history.jsonl`` is truncated at start.
    method, dataset : str
    seed, num_clients : int
    config : mapping
        The full resolved run config (written verbatim into ``summary.json``).
    """

    def __init__(self, output_dir: str | Path, method: str, dataset: str, seed: int,
                 num_clients: int, config: Mapping[str, Any], overwrite: bool = False) -> None:
        self.dir = Path(output_dir).expanduser().resolve()
        claim_folder(self.dir, overwrite)
        self.method, self.dataset, self.seed, self.num_clients = method, dataset, seed, num_clients
        self.config = dict(config)
        self.history: list[dict[str, Any]] = []
        #: called by :meth:`log_round`; what it returns is added to the record (the server
        #: loop's runner uses it for entries every method shares, e.g. ``excluded_nodes``)
        self.round_notes: Callable[[], Mapping[str, Any]] | None = None
        self.start = time.perf_counter()
        self._history_path = self.dir / "history.jsonl"
        self._history_path.write_text("")

    def log_round(self, record: Mapping[str, Any]) -> None:
        """Append one record (a round/iteration) to ``history.jsonl``."""
        rec = dict(record)
        if self.round_notes is not None:
            rec.update(self.round_notes())
        rec = to_jsonable(rec)
        rec.setdefault("elapsed_s", round(time.perf_counter() - self.start, 4))
        self.history.append(rec)
        with self._history_path.open("a") as fh:
            fh.write(json.dumps(rec) + "\n")

    def save_array(self, name: str, array: np.ndarray) -> Path:
        """Save ``array`` as ``<name>.npy``."""
        path = self.dir / f"{name}.npy"
        np.save(path, np.asarray(array))
        return path

    def save_json(self, name: str, obj: Any) -> Path:
        path = self.dir / f"{name}.json"
        path.write_text(json.dumps(to_jsonable(obj), indent=2))
        return path

    def path(self, name: str) -> Path:
        return self.dir / name

    def finish(self, metrics: Mapping[str, Any], extra: Mapping[str, Any] | None = None
               ) -> dict[str, Any]:
        """Write ``summary.json`` and return it (``extra``: more top-level entries, placed
        before ``metrics``)."""
        summary = {
            "method": self.method,
            "dataset": self.dataset,
            "seed": self.seed,
            "num_clients": self.num_clients,
            "config": self.config,
            "wall_time_s": round(time.perf_counter() - self.start, 4),
            **dict(extra or {}),
            "metrics": dict(metrics),
        }
        summary = to_jsonable(summary)
        tmp = self.dir / "summary.json.part"
        tmp.write_text(json.dumps(summary, indent=2))
        os.replace(tmp, self.dir / "summary.json")     # atomic, and the last file written
        (self.dir / RUNNING).unlink(missing_ok=True)
        LOG.info("results written to %s", self.dir)
        return summary

    def interrupted(self, exc: BaseException) -> None:
        """Mark the folder as the result of a run that did not finish (no summary.json)."""
        (self.dir / RUNNING).unlink(missing_ok=True)
        (self.dir / INTERRUPTED).write_text(json.dumps({
            "method": self.method, "error": type(exc).__name__, "message": str(exc)[:2000],
            "wall_time_s": round(time.perf_counter() - self.start, 4)}, indent=2))


RUNNING = "RUNNING"            # exists while a run writes to the folder (created exclusively)
INTERRUPTED = "interrupted.json"
_OURS = ("summary.json", "history.jsonl", RUNNING, INTERRUPTED)


class OutputDirError(ValueError):
    """``output-dir`` holds another run's results (or a run is writing there)."""


def claim_folder(folder: Path, overwrite: bool = False) -> None:
    """Make ``folder`` this run's own: refuse one in use by a running run, or holding files,
    unless ``overwrite`` (then a fedclust results folder is cleared first; any other folder is
    refused). Hidden entries and ``*.log`` files (Hydra's job folder) do not count."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(folder / RUNNING, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        raise OutputDirError(
            f"output-dir {str(folder)!r} is in use by another run (it holds {RUNNING}). "
            f"Allowed: a folder no run is writing to. Fix: pass another output-dir, or leave it "
            f"empty for a new folder per run (delete {RUNNING} if that run is dead)") from None
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    entries = [p for p in folder.iterdir() if p.name != RUNNING and not p.name.startswith(".")
               and not p.name.endswith(".log")]
    if not entries:
        return
    ours = any(p.name in _OURS for p in entries)
    if not overwrite or not ours:
        (folder / RUNNING).unlink()
        names = sorted(p.name for p in entries)[:6]
        if ours:
            allowed = ("an empty or new folder, or overwrite=true for a folder of an earlier "
                       "fedclust run (it is cleared first)")
            fix = "pass another output-dir, leave output-dir empty, or pass overwrite=true"
        else:
            allowed = ("an empty or new folder (overwrite=true clears only a fedclust results "
                       "folder, and this one holds no summary.json or history.jsonl)")
            fix = "pass another output-dir, or leave output-dir empty for a new folder per run"
        raise OutputDirError(
            f"output-dir {str(folder)!r} is not empty (it holds {names}"
            f"{' …' if len(entries) > 6 else ''}): a run there would mix its results with "
            f"what is there. Allowed: {allowed}. Fix: {fix}")
    for p in entries:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()


def write_table(path: Path, header: Sequence[str], table: np.ndarray,
                fmt: str | Sequence[str] = "%.17g") -> Path:
    """A CSV with a header line, written atomically."""
    tmp = path.with_name(path.name + ".part")
    np.savetxt(tmp, np.asarray(table).reshape(len(table), -1), delimiter=",",
               header=",".join(header), comments="", fmt=fmt)
    os.replace(tmp, path)
    return path
