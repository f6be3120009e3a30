"""``fedclust.simulate``: run a method on arrays in a notebook; ``fedclust deploy``.

This module is the one place where :mod:`fedclust` reaches the layers above it (the
Strategy objects, the ClientApp, the in-process engine, the local deployment tool): it imports
them lazily, inside :func:`simulate` and :func:`deploy`, so ``import fedclust`` stays light and
the algorithm modules stay Flower-free.

Every client's array is written to a file of its own in a temporary folder, and client ``i``
reads it through node config ``data-path`` with the loader a deployed SuperNode uses; the
run is fedclust's real ServerApp loop and ClientApp handlers, exchanging Flower messages in one
process.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedclust.config import ConfigError

if TYPE_CHECKING:   # pragma: no cover
    from strategies.methods import FedclustStrategy, RunResult

EMDCFL_PARTS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")


def simulate(method_or_strategy: str | FedclustStrategy, clients: Sequence[Any],
             labels: Sequence[Any] | None = None, *, seed: int = 0,
             output_dir: str | Path | None = None, dataset: str = "local",
             run_config: Mapping[str, Any] | None = None, **params: Any) -> RunResult:
    """Run a method on one array per client and return its result.

    Parameters
    ----------
    method_or_strategy : str or FedclustStrategy
        ``"exact-fcm"``, ``"fedfcm"``, ``"fedcref"``, ``"emdcfl"``, or a strategy object
        (:mod:`strategies.methods`, e.g. ``ExactFCM(n_clusters=3)``).
    clients : sequence
        One entry per client: a 2-D array ``(rows, features)`` (images may be ``(rows, …)``).
        EMD-CFL trains a classifier: an entry is a mapping with ``x_train``, ``y_train``,
        ``x_val``, ``y_val``, ``x_test``, ``y_test`` (optional ``cluster``: the true group, for
        the evaluation path), or an array whose training labels come in ``labels``.
    labels : sequence, optional
        One label array per client, for the evaluation path only (``eval_*`` metrics): they
        never drive the clustering. For EMD-CFL they are the training targets.
    seed : int, default 0
        Run config ``seed``.
    output_dir : str or Path, optional
        Where the results go (default: a new folder under ``~/fedclust-runs``); every client's
        own results are in ``<output_dir>/clients/<i>/``.
    dataset : str, default "local"
        ``"local"``: the clients' arrays. EMD-CFL's model takes 28×28 grey images with
        ``"local"``; pass ``"rotdigits"`` for 8×8 ones.
    run_config : mapping, optional
        Other run-config keys (``plots``, ``timeout`` …).
    **params
        The method's constructor parameters when ``method_or_strategy`` is a name (e.g.
        ``n_clusters=3``).

    Returns
    -------
    RunResult
        ``.summary`` (what ``summary.json`` holds), ``.history``, ``.arrays``, ``.run_dir``
        and, for the FCM methods, ``.centers`` (in the data's units).

    Raises
    ------
    ConfigError
        Bad method name, parameters, or client arrays — before any work.
    """
    from strategies.methods import STRATEGIES, FedclustStrategy

    if isinstance(method_or_strategy, FedclustStrategy):
        if params:
            raise ConfigError(f"simulate() got both a strategy object and parameters "
                              f"{sorted(params)}: give them to {type(method_or_strategy).__name__}"
                              f"(...) instead")
        strategy = method_or_strategy
    elif isinstance(method_or_strategy, str) and method_or_strategy in STRATEGIES:
        strategy = STRATEGIES[method_or_strategy](**params)
    else:
        raise ConfigError(f"simulate(): unknown method {method_or_strategy!r}. Allowed: "
                          f"{', '.join(STRATEGIES)} or a strategy object")
    clients = list(clients)
    if len(clients) < 1:
        raise ConfigError("simulate() needs at least one client array in 'clients'")
    if labels is not None and len(labels) != len(clients):
        raise ConfigError(f"simulate(): {len(labels)} label arrays for {len(clients)} clients. "
                          f"Fix: one label array per client, or labels=None")
    emdcfl = strategy.method == "emdcfl"
    with tempfile.TemporaryDirectory(prefix="fedclust-simulate-") as tmp:
        nodes = []
        for i, data in enumerate(clients):
            path = Path(tmp) / f"client{i:04d}.npz"
            y = None if labels is None else labels[i]
            if emdcfl:
                parts = _emdcfl_parts(i, data, y, seed)
                np.savez(path, **parts)
                allow = "cluster" in parts
            else:
                _write_rows(i, data, y, path)
                allow = y is not None
            nodes.append({"data-path": str(path), "allow-evaluation": allow})
        return _run(strategy, nodes, seed, output_dir, dataset, dict(run_config or {}),
                    evaluate=any(n["allow-evaluation"] for n in nodes))


def _write_rows(i: int, data: Any, y: Any, path: Path) -> None:
    x = np.asarray(data)
    if x.ndim < 2 or x.shape[0] == 0:
        raise ConfigError(f"simulate(): client {i}'s array has shape {x.shape}. Allowed: "
                          f"(rows, features) with at least one row")
    if not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x):
        raise ConfigError(f"simulate(): client {i}'s array has dtype {x.dtype}. Allowed: real "
                          f"numbers")
    arrays = {"x": x}
    if y is not None:
        y = np.asarray(y).reshape(-1)
        if len(y) != len(x):
            raise ConfigError(f"simulate(): client {i} has {len(x)} rows but {len(y)} labels")
        arrays["y"] = y
    np.savez(path, **arrays)


def _emdcfl_parts(i: int, data: Any, y: Any, seed: int) -> dict[str, np.ndarray]:
    """The train/validation/test split file of an EMD-CFL client."""
    if isinstance(data, Mapping):
        missing = [k for k in EMDCFL_PARTS if k not in data]
        if missing:
            raise ConfigError(f"simulate(): EMD-CFL client {i} lacks {missing}. Allowed: a "
                              f"mapping with {', '.join(EMDCFL_PARTS)} (optional 'cluster'), or "
                              f"an array with its training labels in 'labels'")
        return {k: np.asarray(v) for k, v in data.items()}
    if y is None:
        raise ConfigError(f"simulate(): EMD-CFL trains a classifier: client {i} needs its "
                          f"training labels (labels=[...]) or a mapping with x_train/y_train/…")
    x, y = np.asarray(data), np.asarray(y).reshape(-1)
    if len(x) != len(y) or len(x) < 3:
        raise ConfigError(f"simulate(): EMD-CFL client {i} has {len(x)} rows and {len(y)} "
                          f"labels. Allowed: equal counts, at least 3")
    order = np.random.default_rng([seed, i]).permutation(len(x))
    n_test = max(1, len(x) // 5)
    n_val = max(1, (len(x) - n_test) // 10)
    test, val, train = np.split(order, [n_test, n_test + n_val])
    return {"x_train": x[train], "y_train": y[train], "x_val": x[val], "y_val": y[val],
            "x_test": x[test], "y_test": y[test]}


def _run(strategy: FedclustStrategy, nodes: list[dict[str, Any]], seed: int,
         output_dir: str | Path | None, dataset: str, run_config: dict[str, Any],
         evaluate: bool) -> RunResult:
    from client_apps.app import app as client_app
    from server_app.inprocess import InProcessGrid

    run_config.setdefault("num-clients", len(nodes))
    args = {"dataset": dataset, "seed": seed, "output_dir": output_dir, "evaluate": evaluate,
            "run_config": run_config}
    grid = InProcessGrid(client_app, len(nodes), strategy.full_run_config(**args),
                         node_configs=nodes)
    result = strategy.start(grid, **args)
    _move_owner_results(grid, result)
    return result


def _move_owner_results(grid: Any, result: RunResult) -> None:
    """Each client's own results into ``<run_dir>/clients/<i>/`` (they were written beside its
    temporary data file, as on a deployed node without node config ``output-dir``)."""
    import shutil

    from fedclust.outputs import make_dirs, record_tree

    moved = []
    for i, context in enumerate(grid.contexts.values()):
        src = Path(context.node_config["data-path"]).parent / "fedclust-results"
        src = src / Path(context.node_config["data-path"]).name
        if src.is_dir():
            for run_folder in src.iterdir():
                dst = result.run_dir / "clients" / str(i)
                make_dirs(dst.parent)
                shutil.move(str(run_folder), str(dst))
                moved.append(dst)
    record_tree(*moved)     # in the run folder's manifest: overwrite=true may clear them


def deploy(argv: Sequence[str]) -> int:
    """``fedclust deploy …``: :func:`server_app.deploy.main` (``up``, ``certs``,
    ``fleet-gateway``)."""
    from server_app.deploy import main

    return main(list(argv))
