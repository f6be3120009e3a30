"""``fedclust report DIR``: one table of mean ± sd (n) per setting of a folder of runs.

``DIR`` may be one run's folder, a Hydra sweep (``~/fedclust-runs/sweeps/<date>/``, one job
folder per run) or any folder holding run folders at any depth: every ``summary.json`` below
it is a finished run, of any method. Runs are grouped by the run-config keys that differ
between them (the swept keys; ``seed`` and ``output-dir`` always differ and are left out, so
the seeds of one setting form one group), or by the keys given with ``--by``. Each metric
cell is ``mean ± sd (n)``: the sample standard deviation over the ``n`` runs of the group
that have the metric as a finite number.

The table is printed as Markdown and written to ``report.csv`` (one row per group: the keys,
then ``<metric>_mean``, ``<metric>_sd``, ``<metric>_n``), with ``report.png`` (one panel per
metric, a bar per group with its standard deviation). A ``report.csv`` or ``report.png``
already in the folder is replaced only when ``fedclust report`` wrote it and nobody changed it
since (``.fedclust-report.json`` holds their checksums), or with ``--overwrite``.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import math
import sys
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedclust import outputs
from fedclust.errors import BadInputError
from fedclust.registry import METHODS

SUMMARY = "summary.json"
#: keys that differ between the seeds (and folders) of one setting: never a group key
RUN_ONLY = ("seed", "output-dir", "overwrite")
#: default metrics per method, where the runs have them (``--metric all``: every scalar)
DEFAULT_METRICS: dict[str, tuple[str, ...]] = {
    name: spec.report_metrics for name, spec in METHODS.items()}
#: the run-config key prefix of each method's own keys: another method's keys are left out of
#: a run's config when runs are compared (they do not act on it)
METHOD_PREFIX = {name: spec.prefix for name, spec in METHODS.items()}
MARKER = ".fedclust-report.json"
CSV_NAME, PLOT_NAME = "report.csv", "report.png"


class ReportError(BadInputError, ValueError):
    """The folder holds no finished run, or an option names what the runs do not have."""


@dataclass
class Run:
    """One finished run: its folder and its ``summary.json``."""

    dir: Path
    summary: dict[str, Any]

    @property
    def config(self) -> dict[str, Any]:
        """The run config without the keys of other methods than the run's."""
        config = dict(self.summary.get("config") or {})
        own = METHOD_PREFIX.get(str(config.get("method", self.summary.get("method"))))
        other = tuple(p for p in METHOD_PREFIX.values() if p != own)
        return {k: v for k, v in config.items() if not k.startswith(other)}

    def value(self, key: str) -> Any:
        """A grouping key's value: the run config's, else the summary's top-level entry."""
        config = self.config
        if key in config:
            return config[key]
        return self.summary.get(key)

    def metric(self, name: str) -> float | None:
        """A metric as a float (``a.b`` reaches into a dict metric; ``wall_time_s`` is the
        summary's), or None when the run has no finite number there."""
        if name == "wall_time_s":
            value: Any = self.summary.get(name)
        else:
            value = self.summary.get("metrics") or {}
            for part in name.split("."):
                if not isinstance(value, Mapping) or part not in value:
                    return None
                value = value[part]
        if isinstance(value, bool):
            return float(value)
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
        return None


@dataclass
class Group:
    """Runs of one setting and their statistics per metric."""

    label: dict[str, Any]
    runs: list[Run]
    stats: dict[str, tuple[float, float, int]] = field(default_factory=dict)


@dataclass
class Report:
    """Groups of runs, the keys they were grouped by and the metrics reported."""

    folder: Path
    by: list[str]
    metrics: list[str]
    groups: list[Group]
    unfinished: list[Path]

    def markdown(self) -> str:
        """The table: one line per group, a column per key, a ``mean ± sd (n)`` column per
        metric."""
        head = [*self.by, "runs", *self.metrics]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for g in self.groups:
            cells = [_show(g.label[k]) for k in self.by] + [str(len(g.runs))]
            cells += [format_stat(*g.stats[m]) for m in self.metrics]
            lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per group: the keys, ``runs``, and ``<metric>_mean/_sd/_n``."""
        out = []
        for g in self.groups:
            row: dict[str, Any] = {k: g.label[k] for k in self.by}
            row["runs"] = len(g.runs)
            for m in self.metrics:
                mean, sd, n = g.stats[m]
                row.update({f"{m}_mean": mean, f"{m}_sd": sd, f"{m}_n": n})
            out.append(row)
        return out


# --------------------------------------------------------------------------- reading runs

def find_runs(folder: str | Path) -> tuple[list[Run], list[Path]]:
    """Every finished run under ``folder`` (its own ``summary.json`` included), in path order,
    and the run folders without one (``interrupted.json``: the run failed or was stopped).

    Raises
    ------
    ReportError
        ``folder`` is not a folder.
    """
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ReportError(f"fedclust report: {str(folder)!r} is not a folder. Allowed: a run "
                          f"folder, a sweep folder (~/fedclust-runs/sweeps/<date>) or any "
                          f"folder of runs")
    runs, unfinished = [], []
    for path in sorted(folder.rglob(SUMMARY), key=_path_order):
        if "clients" in path.relative_to(folder).parts[:-1]:
            continue     # a data owner's folder inside a run, not a run
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            unfinished.append(path.parent)
            continue
        if isinstance(summary, dict) and isinstance(summary.get("config"), dict):
            runs.append(Run(path.parent, summary))
    done = {r.dir for r in runs}
    unfinished += [p.parent for p in sorted(folder.rglob("interrupted.json"))
                   if p.parent not in done]
    return runs, unfinished


def _path_order(path: Path) -> tuple:
    """Hydra's job folders 0, 1, … 10 in numeric order."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in path.parts)


def swept_keys(runs: Sequence[Run]) -> list[str]:
    """The run-config keys whose values differ between the ``runs`` that have them (not seed,
    output-dir; a method's own keys are compared between the runs of that method)."""
    names: list[str] = []
    for run in runs:
        names += [k for k in run.config if k not in names]
    configs = [r.config for r in runs]
    return [k for k in names if k not in RUN_ONLY
            and len({json.dumps(c[k], sort_keys=True, default=str)
                     for c in configs if k in c}) > 1]


def default_metrics(runs: Sequence[Run]) -> list[str]:
    """Each method's headline metrics that the runs have, then ``wall_time_s``; every scalar
    metric for a method without a list."""
    out: list[str] = []
    for run in runs:
        wanted = DEFAULT_METRICS.get(str(run.summary.get("method")))
        names = wanted if wanted is not None else scalar_metrics([run])
        out += [m for m in names if m not in out and run.metric(m) is not None]
    return [*out, "wall_time_s"] if "wall_time_s" not in out else out


def scalar_metrics(runs: Sequence[Run]) -> list[str]:
    """Every top-level metric that is a number (or a bool) in at least one run."""
    out: list[str] = []
    for run in runs:
        for name in (run.summary.get("metrics") or {}):
            if name not in out and run.metric(name) is not None:
                out.append(name)
    return out


def summarize(folder: str | Path, by: Sequence[str] | None = None,
              metrics: Sequence[str] | None = None) -> Report:
    """Group the runs under ``folder`` and compute mean, sd and n of every metric.

    Parameters
    ----------
    folder : path
        A run folder, a sweep folder or any folder of runs.
    by : sequence of str, optional
        Run-config keys (or summary entries: ``method``, ``dataset``) to group by; default:
        the keys that differ between the runs.
    metrics : sequence of str, optional
        Metric names (``a.b`` reaches into a dict metric; ``wall_time_s``); ``["all"]``: every
        scalar metric; default: :func:`default_metrics`.

    Raises
    ------
    ReportError
        No finished run under ``folder``; a ``by`` key or a metric no run has.
    """
    folder = Path(folder).expanduser()
    runs, unfinished = find_runs(folder)
    if not runs:
        extra = f" ({len(unfinished)} unfinished: interrupted.json)" if unfinished else ""
        raise ReportError(f"fedclust report: no finished run under {str(folder)!r}{extra}: a "
                          f"run's folder holds {SUMMARY} once it finished. Allowed: a run "
                          f"folder, a sweep folder or any folder holding such run folders")
    keys = list(by) if by else swept_keys(runs)
    known = sorted({k for r in runs for k in r.config} | {k for r in runs for k in r.summary})
    for key in keys:
        if all(r.value(key) is None for r in runs):
            raise ReportError(f"fedclust report: --by {key!r}: no run has this key"
                              f"{_did_you_mean(key, known)}. Allowed: a run-config key "
                              f"(summary.json 'config') or method, dataset")
    if metrics and list(metrics) == ["all"]:
        names = [*scalar_metrics(runs), "wall_time_s"]
    elif metrics:
        names = list(metrics)
        available = [*scalar_metrics(runs), "wall_time_s"]
        for name in names:
            if all(r.metric(name) is None for r in runs):
                raise ReportError(f"fedclust report: --metric {name!r}: no run has it as a "
                                  f"number{_did_you_mean(name, available)}. Allowed: "
                                  f"{', '.join(available)} (a.b for an entry of a dict "
                                  f"metric), or all")
    else:
        names = default_metrics(runs)
    grouped: dict[str, Group] = {}
    for run in runs:
        label = {k: run.value(k) for k in keys}
        ident = json.dumps(label, sort_keys=True, default=str)
        grouped.setdefault(ident, Group(label, [])).runs.append(run)
    groups = list(grouped.values())
    for g in groups:
        g.stats = {m: mean_sd([r.metric(m) for r in g.runs]) for m in names}
    return Report(folder, keys, names, groups, unfinished)


def mean_sd(values: Iterable[float | None]) -> tuple[float, float, int]:
    """Mean, sample standard deviation (0 for one value) and count of the numbers in
    ``values`` (None left out); ``(nan, nan, 0)`` for none."""
    xs = [v for v in values if v is not None]
    if not xs:
        return math.nan, math.nan, 0
    mean = sum(xs) / len(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return mean, sd, len(xs)


def format_stat(mean: float, sd: float, n: int) -> str:
    """``mean ± sd (n)``, rounded to the sd's second significant digit (``mean (1)`` for one
    run, ``–`` for none)."""
    if n == 0:
        return "–"
    if n == 1 or sd <= 1e-9 * max(1.0, abs(mean)):    # equal up to rounding
        return f"{mean:.4g} ({n})"
    if max(abs(mean), sd) >= 1e5:
        return f"{mean:.3g} ± {sd:.2g} ({n})"
    digits = min(max(0, 1 - math.floor(math.log10(sd))), 8)
    return f"{mean:.{digits}f} ± {sd:.{digits}f} ({n})"


def _show(value: Any) -> str:
    return "" if value is None else (json.dumps(value) if isinstance(value, (dict, list))
                                     else str(value))


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _did_you_mean(name: str, known: Sequence[str]) -> str:
    import difflib

    close = difflib.get_close_matches(name, list(known), n=3, cutoff=0.6)
    return f" (did you mean {', '.join(repr(c) for c in close)}?)" if close else ""


# --------------------------------------------------------------------------- writing

def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _check_may_write(folder: Path, names: Sequence[str], overwrite: bool) -> dict[str, str]:
    """The marker's checksums; refuses when one of ``names`` exists and is not what
    ``fedclust report`` last wrote there (unless ``overwrite``)."""
    marker = folder / MARKER
    try:
        written = json.loads(marker.read_text()).get("files", {}) if marker.is_file() else {}
    except (OSError, ValueError, AttributeError):
        written = {}
    for name in names:
        path = folder / name
        if overwrite or not (path.exists() or path.is_symlink()):
            continue
        if path.is_symlink() or not path.is_file() or written.get(name) != _digest(path):
            raise ReportError(f"fedclust report: {str(path)!r} exists and is not the one "
                              f"fedclust report wrote there (or it was changed since); it was "
                              f"left as it is. Fix: pass --out ANOTHER_FOLDER, or --overwrite "
                              f"to replace it")
    return dict(written) if isinstance(written, dict) else {}


def write(report: Report, out: str | Path | None = None, plot: bool = True,
          overwrite: bool = False) -> list[Path]:
    """Write ``report.csv`` (and ``report.png``) into ``out`` (default: the report's folder);
    return the paths written."""
    folder = Path(out).expanduser() if out else report.folder
    outputs.make_dirs(folder)
    names = [CSV_NAME, PLOT_NAME] if plot else [CSV_NAME]
    written = _check_may_write(folder, names, overwrite)
    rows = report.rows()
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(rows[0]) if rows else ["runs"],
                            lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _csv(v) for k, v in row.items()} for row in rows)
    paths = [outputs.write_text(folder / CSV_NAME, buf.getvalue())]
    if plot:
        paths.append(plot_report(report, folder / PLOT_NAME))
    written.update({p.name: _digest(p) for p in paths})
    marker = {"written-by": "fedclust report", "files": written}
    outputs.write_text(folder / MARKER, json.dumps(marker, indent=1))
    return paths


def _csv(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return ""
    return _show(value) if isinstance(value, (dict, list)) else value


def plot_report(report: Report, path: Path) -> Path:
    """One panel per metric: a bar per group (mean) with its standard deviation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metrics = report.metrics
    cols = min(len(metrics), 3)
    rows = math.ceil(len(metrics) / cols)
    labels = [_short(", ".join(f"{k}={_show(g.label[k])}" for k in report.by) or "all runs")
              for g in report.groups]
    width = max(4.0, 0.5 * len(labels) + 2.0)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 3.2 * rows), dpi=100,
                             squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
        means = [g.stats[metric][0] for g in report.groups]
        sds = [g.stats[metric][1] for g in report.groups]
        ax.bar(range(len(labels)), means, yerr=sds, capsize=3, color="tab:blue", alpha=0.8)
        ax.set_title(metric, fontsize=9)
        ax.set_xticks(range(len(labels)))
        ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=7)
        ax.grid(alpha=0.3, axis="y")
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    fig.suptitle(f"{report.folder.name}: mean ± sd per setting", fontsize=10)
    with warnings.catch_warnings():     # many long labels: the layout is only approximate
        warnings.simplefilter("ignore")
        fig.tight_layout()
    outputs.save_figure(fig, path)
    plt.close(fig)
    return path


# --------------------------------------------------------------------------- command line

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="fedclust report", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example:\n  fedclust report ~/fedclust-runs/sweeps/2026-01-01_12-00-00 "
               "--by fcm.fraction --metric eval_ari objective\n\n"
               "A paper's table, with the paper's numbers beside ours (docs/results.md):\n"
               "  fedclust report --table NAME FOLDER ...\n"
               "  NAME: fcm-table1, fedfcm-table1, fedfcm-table3, fedfcm-bank, "
               "fedcref-figure4, emdcfl, emdcfl-eps.")
    parser.add_argument("folder", help="a run folder, a sweep folder or any folder of runs")
    parser.add_argument("--by", nargs="+", default=None, metavar="KEY",
                        help="run-config keys to group by (default: those that differ)")
    parser.add_argument("--metric", nargs="+", default=None, metavar="NAME",
                        help="metrics to report (default: the method's headline metrics and "
                             "wall_time_s; 'all': every scalar metric)")
    parser.add_argument("--out", default=None, help="folder for report.csv and report.png "
                        "(default: FOLDER)")
    parser.add_argument("--no-plot", action="store_true", help="write report.csv only")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace report.csv/report.png even when fedclust did not write "
                             "them")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        report = summarize(args.folder, args.by, args.metric)
        paths = write(report, args.out, plot=not args.no_plot, overwrite=args.overwrite)
    except (ReportError, outputs.OutputDirError) as exc:
        print(exc, file=sys.stderr)
        return 2
    print(report.markdown())
    runs = sum(len(g.runs) for g in report.groups)
    note = f"; {len(report.unfinished)} unfinished run(s) left out" if report.unfinished else ""
    print(f"\n{runs} run(s) in {len(report.groups)} group(s){note}; wrote "
          f"{', '.join(str(p) for p in paths)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
