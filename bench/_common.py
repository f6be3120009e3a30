"""The scaffold the benchmarks share: their command-line options, timers and output.

Every benchmark measures a command and a reference in the same run and prints their ratio
(the machine is shared and noisy: compare ratios, not seconds). A script builds its parser
with :func:`parser`, asking for the shared options it takes under the names its command line
has always used, times with :func:`seconds` / :func:`median_seconds`, and prints with
:func:`ratio` / :func:`print_json`::

    from _common import median_seconds, parser, ratio

    ap = parser(__doc__, repeats=20)
    a = ap.parse_args()
    new = median_seconds(lambda: candidate(), a.repeats)
    ref = median_seconds(lambda: reference(), a.repeats)
    print(f"candidate / reference {ratio(new, ref)}")

Run a benchmark from the repository root (``python bench/bench_x.py``): Python puts
``bench/`` on the path, so ``import _common`` works, and importing it puts the repository
root on the path, so the project's packages import from the checkout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")


def parser(doc: str | None = None, *, first_line: bool = False, raw: bool = False,
           data_dir: str | bool | None = None, dataset: str | None = None,
           clients: int | None = None, samples_per_cluster: int | None = None,
           seed: int | None = None, repeats: int | None = None,
           repeats_flag: str = "--repeats", overrides: bool = False,
           out: str | None = None) -> argparse.ArgumentParser:
    """An ``ArgumentParser`` with the shared options this benchmark takes.

    Each keyword adds its option with that default (``None``: not added):

    - ``data_dir``: ``--data-dir``; ``True`` defaults to ``$FEDCLUST_DATA_DIR`` (else
      ``data``), ``"required"`` makes it required, a string is the default;
    - ``dataset``, ``clients``, ``samples_per_cluster``, ``seed``: ``--dataset``,
      ``--clients``, ``--samples-per-cluster``, ``--seed``;
    - ``repeats``: how many timed repeats, under ``repeats_flag`` (``--repeats``, or the
      ``--reps`` / ``--repeat`` a script has always used);
    - ``overrides``: ``--set key=value ...`` (run-config overrides, read by :func:`pairs`);
    - ``out``: ``--out``, where results are written.

    ``doc`` is the description (``first_line``: its first line only; ``raw``: kept as
    written, for a docstring with command examples).
    """
    if doc is not None and first_line:
        doc = doc.splitlines()[0]
    ap = argparse.ArgumentParser(
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter)
    if data_dir == "required":
        ap.add_argument("--data-dir", required=True)
    elif data_dir is True:
        ap.add_argument("--data-dir", default=os.environ.get("FEDCLUST_DATA_DIR", "data"))
    elif isinstance(data_dir, str):
        ap.add_argument("--data-dir", default=data_dir)
    if dataset is not None:
        ap.add_argument("--dataset", default=dataset)
    if clients is not None:
        ap.add_argument("--clients", type=int, default=clients)
    if samples_per_cluster is not None:
        ap.add_argument("--samples-per-cluster", type=int, default=samples_per_cluster)
    if seed is not None:
        ap.add_argument("--seed", type=int, default=seed)
    if repeats is not None:
        ap.add_argument(repeats_flag, type=int, default=repeats)
    if overrides:
        ap.add_argument("--set", nargs="*", default=[], help="run-config overrides key=value")
    if out is not None:
        ap.add_argument("--out", default=out)
    return ap


def pairs(items: Sequence[str]) -> dict[str, str]:
    """``["key=value", ...]`` (``--set``) as a dict of strings."""
    return dict(p.split("=", 1) for p in items)


def seconds(fn: Callable[[], Any]) -> tuple[float, Any]:
    """One call of ``fn``: its wall-clock seconds and what it returned."""
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def mean_seconds(fn: Callable[[], Any], repeats: int = 1) -> float:
    """The mean wall-clock seconds of ``repeats`` calls of ``fn`` (one timer around them)."""
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def median_seconds(fn: Callable[[], Any], repeats: int, warmup: bool = False) -> float:
    """The median wall-clock seconds of ``repeats`` calls of ``fn`` (after one untimed call
    with ``warmup``)."""
    if warmup:
        fn()
    times = sorted(seconds(fn)[0] for _ in range(repeats))
    mid = len(times) // 2
    return times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2


def median_ms(fn: Callable[[], Any], repeats: int, warmup: bool = False) -> float:
    """:func:`median_seconds` in milliseconds."""
    return 1000 * median_seconds(fn, repeats, warmup)


def ratio(value: float, reference: float, digits: int = 2) -> str:
    """``value / reference`` as text (``inf`` for a zero reference)."""
    return f"{value / reference:.{digits}f}" if reference else "inf"


def load_average() -> float:
    """The 1-minute load average: print it beside the ratios of a shared machine."""
    return os.getloadavg()[0]


def print_json(obj: Any, out: str | Path | None = None, indent: int | None = None) -> None:
    """Print ``obj`` as JSON (one line unless ``indent``), and write it to ``out`` when
    given."""
    text = json.dumps(obj, indent=indent)
    print(text, flush=True)
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
