"""``dataset="files"``: each site's own file, one per simulated client.

``data-dir`` holds one entry per site — a csv/tsv/txt/npz/npy/parquet file or a folder of
images — sorted by name; simulated client ``i`` (node config ``partition-id``) is the ``i``-th
entry and reads it with the loader a deployed node uses for its ``data-path``
(:func:`fedclust.data.local.load_local_table`). Hidden entries (``.name``) are ignored, and so
is ``fedclust-results``, the folder a deployed node writes its owner's results into next to
its data (the same folder may serve a simulation and a deployment).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedclust.common import setting
from fedclust.data.capacity import Capacity, check_distinct
from fedclust.data.local import SUFFIXES
from fedclust.errors import BadInputError
from fedclust.registry import METHODS, MethodSpec, load

#: what fedclust writes next to a node's data (``client_apps.results``): never a site
RESULTS_FOLDER = "fedclust-results"


class SiteFilesError(BadInputError, ValueError):
    """``data-dir`` does not hold one usable file per client."""

    data_free = True


def is_simulated(node_config: Mapping[str, Any], cfg: Mapping[str, Any] | None = None) -> bool:
    """Whether a node reads data the run config determines — the one definition every method
    uses (evaluation permission, EMD-CFL's key pairs and seeds, FedCRef's start).

    A node is *simulated* when its node config has ``partition-id`` and either no
    ``data-path`` of its own (a partition of the run's dataset) or run config
    ``dataset="files"`` (the engine set ``data-path`` to its site file of ``data-dir``). A node
    with a ``data-path`` of its own is *deployed*, whatever else its node config says.

    Parameters
    ----------
    node_config : mapping
        The node's node config (after the engine's ``dataset="files"`` resolution).
    cfg : mapping, optional
        The run config (only ``dataset`` is read); None counts as no ``dataset="files"``.
    """
    if "partition-id" not in node_config:
        return False
    return "data-path" not in node_config or (cfg or {}).get("dataset") == "files"


def site_files(data_dir: str | Path) -> list[Path]:
    """The per-site entries of ``data_dir``, sorted by name."""
    root = Path(str(data_dir)).expanduser()
    if str(data_dir) == "":
        raise SiteFilesError("dataset='files' needs run config 'data-dir': a folder with one "
                             "file per site (csv, tsv, npz, npy, parquet, or an image folder). "
                             "Fix: pass data-dir=\"/path/to/sites\"")
    if not root.is_dir():
        raise SiteFilesError(f"run config 'data-dir' = {str(data_dir)!r} is not a folder. "
                             f"Allowed: a folder with one file per site. Fix: pass the folder "
                             f"that holds the site files")
    # fedclust's own results next to the data (a deployed node's, e.g. after the quick
    # start's step 3) are no site
    entries = sorted((p for p in root.iterdir() if not p.name.startswith(".")
                      and p.name != RESULTS_FOLDER
                      and (p.is_dir() or p.suffix.lower() in SUFFIXES)), key=lambda p: p.name)
    if not entries:
        others = sorted(p.name for p in root.iterdir())[:5]
        raise SiteFilesError(
            f"data-dir {str(root)!r} holds no site files (allowed: {', '.join(SUFFIXES)} files "
            f"or image folders; found {others or 'nothing'}). Fix: put one file per site there")
    return entries


def site_file(cfg: Mapping[str, Any], partition_id: int) -> Path:
    """The file of simulated client ``partition_id``."""
    files = site_files(cfg["data-dir"])
    if not 0 <= partition_id < len(files):
        raise SiteFilesError(f"this node is partition {partition_id} but data-dir holds "
                             f"{len(files)} site files")
    return files[partition_id]


def check_sites(cfg: Mapping[str, Any], num_nodes: int | None = None) -> list[int]:
    """Preflight of ``dataset="files"``: one readable file per node, all of one width.

    Loads every file once with the loader its node uses (on the machine running the
    simulation, where the files are: FedCRef's pixel door, else the table loader) and returns
    the feature count of each. Raises :class:`SiteFilesError` naming the files at fault, and
    :class:`~fedclust.config.ConfigError` when an FCM method fits more clusters than the files
    hold rows; only shapes leave this function.
    """
    files = site_files(cfg["data-dir"])
    if num_nodes is not None and num_nodes != len(files):
        raise SiteFilesError(
            f"data-dir holds {len(files)} site files but the engine has {num_nodes} nodes: "
            f"with dataset='files' each simulated client reads one file. Fix: pass "
            f"--federation-config 'num-supernodes={len(files)}' to flwr run (or "
            f"num_supernodes={len(files)} to fedclust-sweep), or move files out of data-dir")
    return check_tables(cfg, files, setting(cfg, "files.format"),
                        setting(cfg, "files.label-column"), "the site files of data-dir")


def check_tables(cfg: Mapping[str, Any], files: list[Path], data_format: str,
                 label_column: str, whose: str) -> list[int]:
    """Every node file of a run read once with the node loader, where the files are at hand
    (the site files of a simulation, the data files of ``fedclust deploy up``): readable, not
    empty, all of one width, with rows enough (and distinct rows enough) for the clusters.

    Raises :class:`SiteFilesError` naming the files at fault, and
    :class:`~fedclust.config.ConfigError` when an FCM method fits more clusters than the files
    hold (distinct) rows; returns each file's feature count.
    """
    load = _site_loader(cfg, data_format, label_column)
    widths, bad, rows, tables = [], [], 0, []
    for path in files:
        try:
            x = load(str(path))
        except (OSError, ValueError) as exc:
            bad.append(f"{path.name}: {exc}")
            continue
        if x.shape[0] == 0:
            bad.append(f"{path.name}: no rows")
        widths.append(int(x.shape[1]))
        rows += int(x.shape[0])
        tables.append(x)
    if bad:
        raise SiteFilesError(f"unreadable files among {whose}: " + "; ".join(bad))
    if len(set(widths)) > 1:
        listing = ", ".join(f"{p.name}: {w}" for p, w in zip(files, widths))
        raise SiteFilesError(f"{whose} have different feature counts "
                             f"({listing}). "
                             f"Allowed: the same columns in every file. Fix: give every site "
                             f"the same features (a label column is named by "
                             f"files.label-column and not counted)")
    if setting(cfg, "method") in ("exact-fcm", "fedfcm"):    # the nodes' digest rule
        check_columns(files, data_format, label_column, whose)
    check_distinct(capacity(cfg), tables, whose)
    return widths


def capacity(cfg: Mapping[str, Any]) -> Capacity | None:
    """The clusters the data of the run config's method must hold (the method table's
    ``capacity`` column), or None."""
    spec = METHODS.get(str(cfg.get("method")))
    return load(spec.capacity)(cfg) if spec is not None and spec.capacity else None


def _site_loader(cfg: Mapping[str, Any], fmt: str | None = None, column: str | None = None):
    """``path -> (rows, features)`` array of a site file, read by the door the run's nodes
    use: the method table's :attr:`~fedclust.registry.MethodSpec.site_reader` (EMD-CFL's
    labelled image splits, FedCRef's pixel table, the table loader of the FCM family).
    ``fmt``, ``column``: the nodes' data format and label column (default: ``files.format``,
    ``files.label-column``)."""
    spec = METHODS.get(str(cfg.get("method")))
    fmt = str(setting(cfg, "files.format")) if fmt is None else fmt
    column = str(setting(cfg, "files.label-column")) if column is None else column
    return load(spec.site_reader if spec is not None else MethodSpec.site_reader)(
        cfg, fmt, column)


def check_columns(files: list[Path], data_format: str, label_column: str, whose: str) -> None:
    """The rule the run applies to the nodes' column-name digests, applied to the files
    themselves: the majority's header decides; once it names columns, a file with other
    names, another order or no header is refused (the run would sum its columns position by
    position with the others', or exclude it). Raises :class:`SiteFilesError` naming the
    files and both headers."""
    from collections import Counter

    from fedclust.data.local import feature_names, names_digest

    names = {p: feature_names(str(p), data_format, label_column) for p in files}
    digests = {p: names_digest(n) for p, n in names.items()}
    named = Counter(d for d in digests.values() if d).most_common()
    if not named:
        return
    unnamed = sum(1 for d in digests.values() if not d)
    if len(named) > 1 and named[0][1] == named[1][1]:
        raise SiteFilesError(
            f"{whose} name their feature columns differently with no majority: "
            + "; ".join(f"{p.name}: {names[p]}" for p in files if digests[p])
            + ". Allowed: the same columns in the same order in every file. Fix: give every "
              "file the same header")
    if named[0][1] < unnamed:
        return
    header = next(names[p] for p in files if digests[p] == named[0][0])
    odd = [p for p in files if digests[p] != named[0][0]]
    if odd:
        raise SiteFilesError(
            f"{whose}: " + "; ".join(
                f"{p.name} has {'no header row' if not digests[p] else f'columns {names[p]}'}"
                for p in odd)
            + f", where the others name {header}: the run would sum such a file's columns "
              f"position by position with the others', or exclude its node. Allowed: the same "
              f"columns in the same order in every file. Fix: reorder or rename the columns "
              f"of {', '.join(p.name for p in odd)} (or give it the header) as the others'")


def simulated_nodes(run_config: Mapping[str, Any], default: int = 2) -> int:
    """How many nodes to simulate for ``run_config``: ``num-clients`` when set, else one per
    site file for ``dataset="files"``, else ``default`` (Flower's default federation has 2).

    Raises :class:`~fedclust.config.ConfigError` for a ``num-clients`` that is not an int in
    range, and :class:`SiteFilesError` for a ``data-dir`` without site files."""
    from fedclust.config import COMMON_KEYS

    # the schema's own cast: num-clients="three" gets the run config's message, not int()'s
    key = next(k for k in COMMON_KEYS if k.name == "num-clients")
    n = int(key.parse(setting(run_config, "num-clients")))
    if n:
        return n
    if run_config.get("dataset") == "files":
        return len(site_files(setting(run_config, "data-dir")))
    return default
