"""Results contract: ``summary.json``, ``history.jsonl``, arrays, and progress lines.

Every run writes to its output directory:

- ``summary.json`` with ``method, dataset, seed, num_clients, config, wall_time_s, metrics``;
- ``history.jsonl``, one JSON object per round/iteration;
- arrays such as ``centers.npy``; PNG plots where the method has an iteration story.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
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
                 num_clients: int, config: Mapping[str, Any]) -> None:
        self.dir = Path(output_dir).expanduser().resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        self.method, self.dataset, self.seed, self.num_clients = method, dataset, seed, num_clients
        self.config = dict(config)
        self.history: list[dict[str, Any]] = []
        self.start = time.perf_counter()
        self._history_path = self.dir / "history.jsonl"
        self._history_path.write_text("")

    def log_round(self, record: Mapping[str, Any]) -> None:
        """Append one record (a round/iteration) to ``history.jsonl``."""
        rec = to_jsonable(dict(record))
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

    def finish(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write ``summary.json`` and return it."""
        summary = {
            "method": self.method,
            "dataset": self.dataset,
            "seed": self.seed,
            "num_clients": self.num_clients,
            "config": self.config,
            "wall_time_s": round(time.perf_counter() - self.start, 4),
            "metrics": dict(metrics),
        }
        summary = to_jsonable(summary)
        (self.dir / "summary.json").write_text(json.dumps(summary, indent=2))
        LOG.info("results written to %s", self.dir)
        return summary
