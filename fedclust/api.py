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

import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from fedclust.config import ConfigError

if TYPE_CHECKING:   # pragma: no cover
    from strategies.methods import FedclustStrategy, RunResult

EMDCFL_PARTS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test")


def simulate(method_or_strategy: str | FedclustStrategy, clients: Sequence[Any] | None = None,
             labels: Sequence[Any] | None = None, *, seed: int = 0,
             output_dir: str | Path | None = None, dataset: Any = "local",
             run_config: Mapping[str, Any] | None = None, label_column: str | None = None,
             partitioner: Any = None, split: str | None = None,
             feature_columns: Sequence[str] | None = None,
             image_column: str | None = None, **params: Any) -> RunResult:
    """Run a method on one array (or pandas DataFrame) per client and return its result.

    Parameters
    ----------
    method_or_strategy : str or FedclustStrategy
        ``"exact-fcm"``, ``"fedfcm"``, ``"fedcref"``, ``"emdcfl"``, or a strategy object
        (:mod:`strategies.methods`, e.g. ``ExactFCM(n_clusters=3)``).
    clients : sequence
        One entry per client: a 2-D array ``(rows, features)`` (images may be ``(rows, …)``),
        a pandas DataFrame of numeric columns (every client the same columns; the names are
        kept: ``RunResult.feature_names``, and ``labels``/``memberships`` come back indexed
        like the rows), or a Hugging Face ``datasets.Dataset`` (its numeric columns, or
        ``feature_columns``/``image_column``). EMD-CFL trains a classifier: an entry is a
        mapping with ``x_train``, ``y_train``, ``x_val``, ``y_val``, ``x_test``, ``y_test``
        (optional ``cluster``: the true group, for the evaluation path), or an array whose
        training labels come in ``labels``.
    labels : sequence, optional
        One label array per client, for the evaluation path only (``eval_*`` metrics): they
        never drive the clustering. For EMD-CFL they are the training targets. Any type:
        integers, text, booleans, a pandas ``category`` — every client's labels are coded
        the way a deployed node codes its own (:func:`fedclust.data.local.label_codes`), so
        a label means the same on every client whatever the others hold.
    label_column : str, optional
        With DataFrames or Hugging Face data: the column holding the ground-truth labels,
        taken out of the features and used as ``labels`` (instead of passing ``labels``).
    seed : int, default 0
        Run config ``seed``.
    output_dir : str or Path, optional
        Where the results go (default: a new folder under ``~/fedclust-runs``); every client's
        own results are in ``<output_dir>/clients/<i>/``.
    dataset : str, or Hugging Face / Flower Datasets data, default "local"
        ``"local"``: the clients' arrays. EMD-CFL's model takes 28×28 grey images with
        ``"local"``; pass ``"rotdigits"`` for 8×8 ones. Instead of ``clients``:

        - a ``flwr_datasets.FederatedDataset``: client ``i`` is ``load_partition(i, split)``
          (``split``: default its only partitioned split);
        - a ``datasets.Dataset``, or a ``datasets.DatasetDict`` with ``split``, split by
          ``partitioner``;
        - a list of ``datasets.Dataset``: one per client.
    partitioner : flwr_datasets.partitioner.Partitioner, optional
        Splits ``dataset`` (or the dataset already assigned to it) into the clients:
        ``partitioner.num_partitions`` clients, client ``i`` = ``load_partition(i)``.
    split : str, optional
        The split of a ``DatasetDict`` or of a ``FederatedDataset`` (e.g. ``"train"``).
    feature_columns : sequence of str, optional
        With Hugging Face data: the feature columns (default: every numeric column but
        ``label_column``).
    image_column : str, optional
        With Hugging Face data: an image column instead of feature columns (FCM methods and
        FedCRef: each image's pixels as one row; EMD-CFL: the images, with ``label_column``
        as the training targets).
    run_config : mapping, optional
        Other run-config keys (``plots``, ``timeout`` …).
    **params
        The method's constructor parameters when ``method_or_strategy`` is a name (e.g.
        ``n_clusters=3``).

    Returns
    -------
    RunResult
        ``.summary`` (what ``summary.json`` holds; its ``data`` says what was clustered: the
        kind of input, the Hugging Face dataset's name, split and fingerprint, the
        partitioner's class and parameters), ``.history``, ``.arrays``, ``.run_dir``; for the
        FCM methods ``.centers`` (in the data's units); every client's own results in memory,
        by client number: ``.labels`` (each row's cluster: FCM methods, FedCRef) and
        ``.memberships`` (FCM methods). With ``plots`` on (the default), ``clusters.png`` in
        ``run_dir`` shows the clusters of every client's rows (FCM methods, FedCRef on tables).

    Raises
    ------
    ConfigError
        Bad method name, parameters, or client arrays — before any work.
    """
    strategy = _strategy(method_or_strategy, params)
    emdcfl = strategy.method == "emdcfl"
    record: dict[str, Any] = {}
    hf_names = None
    if isinstance(dataset, (list, tuple)):
        if clients is not None:
            raise ConfigError("simulate(): give the clients once: clients=[...] or "
                              "dataset=[<datasets.Dataset>, ...], not both")
        clients, dataset = dataset, "local"
    if clients is not None and not isinstance(clients, (str, bytes)):
        clients = list(clients)
    if clients and any(_is_hf(c) for c in clients):
        if partitioner is not None:
            raise ConfigError("simulate(): clients are already one Hugging Face Dataset each: "
                              "partitioner= does not apply. Fix: leave it out, or pass one "
                              "Dataset as dataset= with the partitioner")
        clients, labels, hf_names, record = _from_hf_clients(
            clients, labels, label_column, feature_columns, image_column, images=emdcfl)
        label_column = None
    elif partitioner is not None or not isinstance(dataset, str):
        if clients is not None:
            raise ConfigError("simulate(): give either clients or dataset= (a Hugging Face or "
                              "Flower Datasets object), not both")
        clients, labels, hf_names, record = _from_hf_source(
            dataset, partitioner, split, label_column, feature_columns, image_column,
            images=emdcfl)
        dataset, label_column = "local", None
        if emdcfl and clients and clients[0].shape[1:] == (8, 8):
            dataset = "rotdigits"      # the model of 8×8 images (28×28: "local")
    elif clients is None:
        raise ConfigError("simulate() needs clients (one array, DataFrame or datasets.Dataset "
                          "per client), or dataset= a flwr_datasets.FederatedDataset, or a "
                          "datasets.Dataset with partitioner=<flwr_datasets Partitioner>")
    if len(clients) < 1:
        raise ConfigError("simulate() needs at least one client in 'clients' (got none). "
                          "Allowed: a list of arrays or DataFrames, one per client. Fix: pass "
                          "clients=[x0, x1, ...]")
    frames = [_is_frame(c) for c in clients]
    if label_column is not None and not any(frames):
        raise ConfigError("simulate(): label_column names a column of pandas DataFrames (or "
                          "Hugging Face datasets), and no client is one. Fix: pass "
                          "labels=[...] with arrays")
    index, feature_names = None, None
    if any(frames):
        if emdcfl:
            raise ConfigError("simulate(): EMD-CFL trains on images: DataFrames are not "
                              "accepted. Allowed: arrays or mappings of x_train, y_train, …")
        clients, labels, index, feature_names = _from_frames(clients, labels, label_column)
        record = {"dataset": "dataframes", "source": "one pandas DataFrame per client",
                  "feature_columns": feature_names,
                  **({"label_column": label_column} if label_column else {})}
    if labels is not None and len(labels) != len(clients):
        raise ConfigError(f"simulate(): {len(labels)} label arrays for {len(clients)} clients. "
                          f"Fix: one label array per client, or labels=None")
    for i, c in enumerate(clients):         # what each client is, before anything reads it
        problem = None if emdcfl and isinstance(c, Mapping) else _not_a_table(i, c)
        if problem:
            raise ConfigError("simulate(): "
                              + (problem.replace("a DataFrame", "images") if emdcfl else problem))
    classes = None
    if isinstance(labels, Mapping):       # {client number: its labels}
        if set(labels) != set(range(len(clients))):
            raise ConfigError(f"simulate(): labels is a mapping with keys {sorted(labels)[:6]}. "
                              f"Allowed: a list of one label array per client (or a mapping "
                              f"of client numbers 0..{len(clients) - 1}). Fix: pass "
                              f"labels=[y0, y1, ...]")
        labels = [labels[i] for i in range(len(clients))]
    if labels is not None:
        none = [i for i, y in enumerate(labels) if y is None]
        if none and strategy.method in CLASS_NUMBERS:
            raise ConfigError(f"simulate(): client {none[0]} has no labels (None), and "
                              f"{strategy.method} needs every client's or none. Fix: give "
                              f"client {none[0]} its labels, or pass labels=None")
        # a client whose entry is None has no labels: the evaluation leaves it out
        labels = [None if y is None else _label_values(i, y) for i, y in enumerate(labels)]
        if strategy.method in CLASS_NUMBERS:
            labels, classes = _class_numbers(labels, CLASS_NUMBERS[strategy.method])
    elif emdcfl and any(isinstance(c, Mapping) for c in clients):
        clients, classes = _mapping_classes(clients)
    if not record:
        record = {"dataset": "arrays", "source": "one array per client"}
    record.setdefault("rows", [int(len(c)) if not isinstance(c, Mapping) else
                               int(len(c.get("x_train", ()))) for c in clients])
    if classes is not None and emdcfl:
        # the training targets' names: what the classes EMD-CFL's models predict mean (FedCRef's
        # labels serve the evaluation only: they stay in memory, RunResult.classes)
        record["classes"] = list(classes)
    if not emdcfl:
        _check_distinct(strategy, clients, run_config)
    with tempfile.TemporaryDirectory(prefix="fedclust-simulate-",
                                     dir=_scratch_dir(clients, labels)) as tmp:
        nodes = []
        for i, data in enumerate(clients):
            path = Path(tmp) / f"client{i:04d}.npz"
            y = None if labels is None else labels[i]
            if emdcfl:
                parts = _emdcfl_parts(i, data, y, seed)
                _check_images(i, parts["x_train"], dataset)
                np.savez(path, **parts)
                allow = "cluster" in parts
            else:
                path = _write_rows(i, data, y, path)
                allow = y is not None
            nodes.append({"data-path": str(path), "allow-evaluation": allow})
        result = _run(strategy, nodes, seed, output_dir, dataset, dict(run_config or {}),
                      evaluate=any(n["allow-evaluation"] for n in nodes), data=record)
    result.feature_names = feature_names or hf_names
    result.classes = classes
    if result.feature_names and not emdcfl and result.run_dir is not None:
        from fedclust.outputs import write_json

        # for `fedclust predict` to match new rows by name (the clients' files name none)
        write_json(result.run_dir / "features.json", {"names": list(result.feature_names)})
    if not emdcfl and result.labels is not None and result.summary["config"].get("plots"):
        _plot_clusters(result, clients)
    from fedclust.trackers import log_after

    log_after(result.summary, result.run_dir, ("clusters.png", "clients"))   # written since
    if index is not None:
        _as_frames(result, index)
    return result


#: methods whose labels index per-class tables (FedCRef's class histograms and dirty start,
#: EMD-CFL's classifier): the largest class number their nodes take
CLASS_NUMBERS = {"fedcref": 65_535, "emdcfl": 9}


def _strategy(method_or_strategy: Any, params: dict[str, Any]) -> FedclustStrategy:
    from strategies.methods import STRATEGIES, FedclustStrategy

    if isinstance(method_or_strategy, FedclustStrategy):
        if params:
            raise ConfigError(f"simulate() got both a strategy object and parameters "
                              f"{sorted(params)}: give them to {type(method_or_strategy).__name__}"
                              f"(...) instead")
        return method_or_strategy
    if isinstance(method_or_strategy, str) and method_or_strategy in STRATEGIES:
        cls = STRATEGIES[method_or_strategy]
        from fedclust.schema import refuse_unknown

        names = list(cls.param_keys())
        refuse_unknown(f"simulate({method_or_strategy!r})", sorted(set(params) - set(names)),
                       names + [a for a in SIMULATE_ARGS if a not in names])
        return cls(**params)
    raise ConfigError(f"simulate(): unknown method {method_or_strategy!r}. Allowed: "
                      f"{', '.join(STRATEGIES)} or a strategy object")


#: :func:`simulate`'s own keyword arguments (close matches of a mistyped parameter)
SIMULATE_ARGS = ("clients", "labels", "seed", "output_dir", "dataset", "run_config",
                 "label_column", "partitioner", "split", "feature_columns", "image_column")


def _label_values(i: int, y: Any) -> np.ndarray:
    """Client ``i``'s labels as the node will read them (numbers, booleans or text), checked
    by the node's own coding first so that a bad label stops here, naming the client."""
    from fedclust.data.local import LocalDataError, label_codes, label_values

    try:
        values = label_values(y, f"simulate(): client {i}'s labels")
        label_codes(values, f"simulate(): client {i}'s labels")
    except LocalDataError as exc:
        raise ConfigError(str(exc)) from None
    return values


def _class_numbers(labels: list[np.ndarray], largest: int
                   ) -> tuple[list[np.ndarray], list[Any] | None]:
    """Labels as the class numbers FedCRef and EMD-CFL index their tables by. Labels that are
    class numbers already (integers ``0..largest``) are kept; any others (text, say) are
    numbered by one vocabulary of every client's node codes (:func:`label_codes`, then
    :func:`compact_codes` over their union, as the FCM evaluation does): returns the numbers
    and the label of each number."""
    from fedclust.data.local import compact_codes, label_codes

    codes = [label_codes(y) for y in labels]
    if all(c.size == 0 or (c.min() >= 0 and c.max() <= largest) for c in codes):
        return codes, None
    vocab = np.unique(np.concatenate(codes))
    if len(vocab) > largest + 1:
        raise ConfigError(f"simulate(): the labels hold {len(vocab)} distinct classes; this "
                          f"method takes at most {largest + 1}. Fix: merge classes, or pass "
                          f"labels=None")
    classes: list[Any] = [None] * len(vocab)
    for y, c in zip(labels, codes):
        for value, k in zip(y.tolist(), compact_codes(c, vocab).tolist()):
            if classes[k] is None:
                classes[k] = value
    return [compact_codes(c, vocab) for c in codes], classes


def _mapping_classes(clients: list[Any]) -> tuple[list[Any], list[Any] | None]:
    """EMD-CFL clients given as mappings: their ``y_train``/``y_val``/``y_test`` as class
    numbers of one vocabulary over every client's splits (:func:`_class_numbers`)."""
    names = ("y_train", "y_val", "y_test")
    found = [(i, k) for i, c in enumerate(clients) if isinstance(c, Mapping)
             for k in names if k in c]
    values = [_label_values(i, clients[i][k]) for i, k in found]
    numbers, classes = _class_numbers(values, CLASS_NUMBERS["emdcfl"])
    if classes is None:
        return clients, None
    out = [dict(c) if isinstance(c, Mapping) else c for c in clients]
    for (i, k), y in zip(found, numbers):
        out[i][k] = y
    return out, classes


def _is_hf(obj: Any) -> bool:
    from fedclust.data.hf import is_hf_dataset

    return is_hf_dataset(obj)


def _hf_arrays(part: Any, label_column: str | None, feature_columns: Sequence[str] | None,
               image_column: str | None, images: bool, where: str
               ) -> tuple[np.ndarray, np.ndarray | None, list[str]]:
    from fedclust.data.hf import arrays_from_hf

    x, y, names = arrays_from_hf(part, label_column or "", list(feature_columns or []),
                                 image_column or "", where=where)
    if images and image_column:
        x = np.stack([np.asarray(im, dtype=np.float64) for im in part[image_column]])
    return x, y, names


def _check_distinct(strategy: FedclustStrategy, clients: list[Any],
                    run_config: Mapping[str, Any] | None) -> None:
    """Refuse client data that cannot hold the run's clusters (all-constant data, fewer
    distinct rows than clusters) before the run: :func:`fedclust.data.capacity.check_distinct`."""
    from fedclust.config import validate
    from fedclust.data.capacity import check_distinct
    from fedclust.data.sites import capacity

    arrays = []
    for i, data in enumerate(clients):
        problem = _not_a_table(i, data)
        if problem:
            raise ConfigError(f"simulate(): {problem}")
        x = np.asarray(data)
        x = x.astype(np.float64) if x.dtype in (object, bool) else x
        if x.ndim < 2 or not len(x) or not np.issubdtype(x.dtype, np.number) \
                or np.iscomplexobj(x):
            return          # refused with its own message when the client's file is written
        arrays.append(x.reshape(len(x), -1))
    widths = [x.shape[1] for x in arrays]
    if len(set(widths)) > 1:
        odd = next(i for i, w in enumerate(widths) if w != max(set(widths), key=widths.count))
        raise ConfigError(f"simulate(): client {odd} has {widths[odd]} features but the others "
                          f"have {max(set(widths), key=widths.count)} (features per client: "
                          f"{widths}). Allowed: the same features, in the same order, in every "
                          f"client. Fix: give every client the same columns")
    cfg = validate({**dict(run_config or {}), **strategy.run_config(), "dataset": "local"})
    check_distinct(capacity(cfg), arrays, f"the {len(arrays)} client array(s)")


def _from_hf_clients(clients: list[Any], labels: Sequence[Any] | None,
                     label_column: str | None, feature_columns: Sequence[str] | None,
                     image_column: str | None, images: bool
                     ) -> tuple[list[np.ndarray], list[Any] | None, list[str], dict[str, Any]]:
    """One ``datasets.Dataset`` per client: features (or images), labels, names, record."""
    from fedclust.data.hf import dataset_record
    from fedclust.data.tabular import DatasetError

    odd = [i for i, c in enumerate(clients) if not _is_hf(c)]
    if odd:
        raise ConfigError(f"simulate(): client {odd[0]} is a {type(clients[odd[0]]).__name__} "
                          f"while other clients are Hugging Face Datasets. Fix: give every "
                          f"client a datasets.Dataset with the same columns")
    if labels is not None and label_column:
        raise ConfigError("simulate(): both labels and label_column were given. Fix: pass one")
    xs, ys, names = [], [], None
    try:
        for i, part in enumerate(clients):
            x, y, cols = _hf_arrays(part, label_column, feature_columns, image_column, images,
                                    f"simulate(): client {i}")
            if names is not None and cols != names:
                raise ConfigError(f"simulate(): client {i}'s feature columns {cols} differ "
                                  f"from client 0's {names}. Fix: give every client the same "
                                  f"columns (feature_columns=[...])")
            names = cols
            xs.append(x)
            ys.append(y)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    record = {"dataset": _hf_name([dataset_record(c) for c in clients]),
              "source": "one Hugging Face datasets.Dataset per client",
              "datasets": [dataset_record(c) for c in clients],
              **({"label_column": label_column} if label_column else {})}
    return xs, (ys if label_column else labels), names or [], record


def _hf_name(records: list[dict[str, Any]]) -> str:
    names = {r.get("name") for r in records} - {None}
    return f"hf:{names.pop()}" if len(names) == 1 else "hf"


def _from_hf_source(dataset: Any, partitioner: Any, split: str | None, label_column: str | None,
                    feature_columns: Sequence[str] | None, image_column: str | None,
                    images: bool
                    ) -> tuple[list[np.ndarray], list[Any] | None, list[str], dict[str, Any]]:
    """The clients of a flwr-datasets ``FederatedDataset``, or of a partitioner over a Hugging
    Face ``Dataset``/``DatasetDict``: features (or images), labels, feature names, and the
    record of the data (name, split, fingerprint, the partitioner's class and parameters)."""
    from fedclust.data.hf import (
        dataset_record,
        is_dataset_dict,
        is_federated_dataset,
        partitioner_record,
        pick_split,
    )
    from fedclust.data.tabular import DatasetError

    source = "Hugging Face datasets.Dataset split by a flwr-datasets partitioner"
    try:
        if is_federated_dataset(dataset):
            if partitioner is not None:
                raise ConfigError("simulate(dataset=<FederatedDataset>) partitions with its own "
                                  "partitioners: partitioner= does not apply. Fix: leave it out "
                                  "(set FederatedDataset(partitioners={split: ...}))")
            splits = sorted(dataset.partitioners)
            if split is None:
                if len(splits) != 1:
                    raise ConfigError(f"simulate(dataset=<FederatedDataset>): it partitions "
                                      f"the splits {splits}: say which. Fix: split={splits[0]!r}")
                split = splits[0]
            if split not in dataset.partitioners:
                raise ConfigError(f"simulate(dataset=<FederatedDataset>): split={split!r} has "
                                  f"no partitioner. Allowed: {', '.join(map(repr, splits))}")
            partitioner = dataset.partitioners[split]
            n = int(partitioner.num_partitions)
            parts = [dataset.load_partition(i, split) for i in range(n)]
            whole = partitioner.dataset
            source = "flwr_datasets.FederatedDataset"
            name = getattr(dataset, "_dataset_name", None)
        else:
            if partitioner is None or not hasattr(partitioner, "load_partition"):
                kind = ("a DatasetDict" if is_dataset_dict(dataset) else
                        "a datasets.Dataset" if _is_hf(dataset) else type(dataset).__name__)
                raise ConfigError(f"simulate(dataset=...) got {kind} without partitioner=: "
                                  f"say how to split it into clients, e.g. partitioner="
                                  f"DirichletPartitioner(num_partitions=5, partition_by='label',"
                                  f" alpha=0.5). Or pass a flwr_datasets.FederatedDataset, or "
                                  f"clients=[one datasets.Dataset per client]")
            if isinstance(dataset, str):
                if not partitioner.is_dataset_assigned():
                    raise ConfigError("simulate(partitioner=...) needs the data: pass dataset="
                                      "<datasets.Dataset>, or assign partitioner.dataset first")
            else:
                if is_dataset_dict(dataset):
                    dataset = pick_split(dataset, split, "simulate(dataset=<DatasetDict>)")
                elif not _is_hf(dataset):
                    raise ConfigError(
                        f"simulate(): dataset is a {type(dataset).__name__}. Allowed: a "
                        f"run-config dataset name (str), a flwr_datasets.FederatedDataset, a "
                        f"datasets.Dataset or DatasetDict (with partitioner=), or a list of "
                        f"datasets.Dataset (one per client)")
                partitioner.dataset = dataset
            n = int(partitioner.num_partitions)
            parts = [partitioner.load_partition(i) for i in range(n)]
            whole = partitioner.dataset
            name = None
        xs, ys, names = [], [], []
        for i, part in enumerate(parts):
            x, y, names = _hf_arrays(part, label_column, feature_columns, image_column, images,
                                     f"simulate(): partition {i}")
            xs.append(x)
            ys.append(y)
    except DatasetError as exc:
        raise ConfigError(str(exc)) from None
    info = dataset_record(whole)
    if name:
        info["name"] = str(name)
    record = {"dataset": f"hf:{info['name']}" if info.get("name") else "hf", "source": source,
              "hf": info, "partitioner": partitioner_record(partitioner),
              **({"label_column": label_column} if label_column else {})}
    return xs, (ys if label_column else None), names, record


def _is_frame(data: Any) -> bool:
    """A pandas DataFrame (told by its shape of API: pandas is not needed otherwise)."""
    return hasattr(data, "columns") and hasattr(data, "dtypes") and hasattr(data, "to_numpy")


def _from_frames(clients: list[Any], labels: Sequence[Any] | None, label_column: str | None
                 ) -> tuple[list[np.ndarray], list[Any] | None, list[Any], list[str]]:
    """DataFrames as arrays: the label column out, every other column numeric and the same in
    every client; returns (arrays, labels, each client's row index, feature names)."""
    if labels is not None and label_column is not None:
        raise ConfigError("simulate(): both labels and label_column were given. Fix: pass one")
    arrays, ys, index, names = [], [], [], None
    for i, frame in enumerate(clients):
        if not _is_frame(frame):
            raise ConfigError(f"simulate(): client {i} is a {type(frame).__name__} while other "
                              f"clients are DataFrames. Fix: give every client a DataFrame "
                              f"with the same columns")
        columns = [str(c) for c in frame.columns]
        twice = sorted({c for c in columns if columns.count(c) > 1})
        if twice:
            raise ConfigError(f"simulate(): client {i}'s DataFrame has duplicate column names "
                              f"{twice}. Allowed: distinct names. Fix: rename them")
        if label_column is not None:
            # the column itself, or the one whose name reads the same (4 and "4")
            match = [c for c in frame.columns if c == label_column] or [
                c for c in frame.columns if str(c) == str(label_column)]
            if not match:
                raise ConfigError(f"simulate(): client {i} has no column {label_column!r} "
                                  f"(label_column). Its columns: {list(frame.columns)}. Fix: "
                                  f"pass one of them as label_column")
            ys.append(frame[match[0]].to_numpy())
            frame = frame.drop(columns=[match[0]])
            columns = [str(c) for c in frame.columns]
        bad = [str(c) for c, dtype in zip(frame.columns, frame.dtypes)
               if getattr(dtype, "kind", "O") not in "biuf"]
        if bad:
            raise ConfigError(f"simulate(): client {i}'s column(s) {bad} are not numeric "
                              f"(dtype {[str(frame[c].dtype) for c in bad]}). Allowed: numeric "
                              f"columns only. Fix: drop or encode them (pandas.get_dummies), or "
                              f"name the label column with label_column=")
        if names is None:
            names = columns
        elif columns != names:
            raise ConfigError(f"simulate(): client {i}'s columns {columns} differ from client "
                              f"0's {names}. Fix: give every client the same columns in the "
                              f"same order (df[columns])")
        arrays.append(frame.to_numpy(dtype=np.float64))
        index.append(frame.index)
    return arrays, (ys if label_column is not None else labels), index, names or []


def _as_frames(result: RunResult, index: list[Any]) -> None:
    """Per-client labels and memberships as pandas objects indexed like the input rows."""
    import pandas as pd

    if result.labels is not None:
        result.labels = [pd.Series(lab, index=ix, name="cluster")
                         for lab, ix in zip(result.labels, index)]
    if result.memberships is not None:
        result.memberships = [pd.DataFrame(u, index=ix, columns=[f"u{c}" for c in
                                                                 range(u.shape[1])])
                              for u, ix in zip(result.memberships, index)]


def _plot_clusters(result: RunResult, clients: list[Any]) -> None:
    """``clusters.png``: every client's rows (all at hand in a notebook) in 2-D, by cluster."""
    from fedclust.plots import plot_clusters

    xs = [np.asarray(c, dtype=np.float64) for c in clients]
    if (any(x.ndim != 2 for x in xs) or len(xs) != len(result.labels)
            or any(len(x) != len(lab) for x, lab in zip(xs, result.labels))):
        return      # images, or clients without results for every row: no table to draw
    try:
        plot_clusters(result.run_dir / "clusters.png", xs, result.labels, result.memberships,
                      result.centers, result.feature_names)
    except (ValueError, np.linalg.LinAlgError) as exc:   # the run's results stand without it
        import logging

        logging.getLogger("fedclust").warning("clusters.png not drawn: %s", exc)


def _not_a_table(i: int, data: Any) -> str | None:
    """Why client ``i``'s entry is no table of numbers (None: it may be one)."""
    name = type(data).__name__
    if hasattr(data, "tocsr") and hasattr(data, "nnz"):      # scipy.sparse, without scipy
        return (f"client {i}'s data is a scipy sparse matrix ({name}, shape {data.shape}, "
                f"{data.nnz} stored values). Allowed: a dense 2-D array (rows, features) or a "
                f"DataFrame. Fix: pass x.toarray() (FCM needs dense rows)")
    if isinstance(data, Mapping):
        return (f"client {i}'s data is a {name} with keys {list(data)[:5]}. Allowed: a 2-D "
                f"array (rows, features) or a DataFrame (mappings of x_train, y_train, … are "
                f"EMD-CFL's). Fix: pass the feature array, e.g. np.column_stack(list(d.values()))")
    if isinstance(data, (str, bytes)) or data is None or np.isscalar(data):
        return (f"client {i}'s data is a {name}, not a table. Allowed: a 2-D array (rows, "
                f"features) or a DataFrame. Fix: pass one array per client")
    try:
        x = np.asarray(data)
    except (ValueError, TypeError):
        return (f"client {i}'s data is a {name} whose rows have different lengths (a ragged "
                f"nested list). Allowed: rows of one length. Fix: give every row the same "
                f"features")
    if x.dtype == object:
        try:
            x.astype(np.float64)        # numbers held as objects: converted, fine
            return None
        except (TypeError, ValueError):
            pass
        kinds = sorted({type(v).__name__ for v in x.reshape(-1)[:1000]})
        return (f"client {i}'s data holds Python objects ({', '.join(kinds[:4])}), not numbers "
                f"(shape {x.shape}). Allowed: real numbers. Fix: convert them to float "
                f"(np.asarray(data, dtype=float)), or drop or encode the other columns")
    return None


#: a folder in memory, where the system has one: the clients' data files of a simulation are
#: read once by its in-process nodes and removed at its end, never needed on a disk
MEMORY_DIR = "/dev/shm"


def _scratch_dir(clients: list[Any], labels: Sequence[Any] | None) -> str | None:
    """Where :func:`simulate` writes its clients' data files for the in-process nodes:
    :data:`MEMORY_DIR` when it is there, writable and has room for twice their size, else
    None (the system's temporary folder)."""
    def size(v: Any) -> int:
        if isinstance(v, Mapping):
            return sum(size(a) for a in v.values())
        return int(getattr(v, "nbytes", 0) or np.asarray(v).nbytes)

    try:
        st = os.statvfs(MEMORY_DIR)
    except (OSError, AttributeError):
        return None
    if not (os.path.isdir(MEMORY_DIR) and os.access(MEMORY_DIR, os.W_OK | os.X_OK)):
        return None
    need = sum(size(c) for c in clients) + sum(size(y) for y in labels or () if y is not None)
    return MEMORY_DIR if st.f_bavail * st.f_frsize > 2 * need + 64 * 1024 ** 2 else None


def _write_rows(i: int, data: Any, y: Any, path: Path) -> Path:
    """Client ``i``'s rows (and labels) checked and written for its node: ``path`` (an
    ``.npz``), or the ``.npy`` of the same name for a table without labels; returns the
    file written."""
    problem = _not_a_table(i, data)
    if problem:
        raise ConfigError(f"simulate(): {problem}")
    x = np.asarray(data)
    x = x.astype(np.float64) if x.dtype in (object, bool) else x
    if x.ndim < 2 or x.shape[0] == 0:
        raise ConfigError(f"simulate(): client {i}'s array has shape {x.shape}. Allowed: "
                          f"(rows, features) with at least one row. Fix: give client {i} its "
                          f"rows as a 2-D array, or leave it out")
    if not np.issubdtype(x.dtype, np.number) or np.iscomplexobj(x):
        raise ConfigError(f"simulate(): client {i}'s array has dtype {x.dtype}. Allowed: real "
                          f"numbers. Fix: convert it (np.asarray(x, dtype=float)), or drop the "
                          f"columns that are not numbers")
    if not np.isfinite(x).all():
        where = tuple(int(v) for v in np.argwhere(~np.isfinite(x))[0])
        raise ConfigError(f"simulate(): client {i}'s array holds {int((~np.isfinite(x)).sum())}"
                          f" NaN or infinite value(s), the first at index {where}. Allowed: "
                          f"finite numbers. Fix: drop or impute those rows")
    from fedclust.data.local import MAX_ABS

    if x.size and float(np.abs(x).max()) > MAX_ABS:
        raise ConfigError(f"simulate(): client {i}'s array holds values as large as "
                          f"{float(np.abs(x).max()):.3g}. Allowed: |x| ≤ {MAX_ABS:g} (larger "
                          f"values overflow the squared distances). Fix: rescale the data")
    arrays = {"x": x}
    if y is not None:
        y = np.asarray(y).reshape(-1)
        if len(y) != len(x):
            raise ConfigError(f"simulate(): client {i} has {len(x)} rows but {len(y)} labels. "
                              f"Allowed: one label per row. Fix: pass labels[{i}] with "
                              f"{len(x)} entries, or labels=None")
        arrays["y"] = y
    if y is None and x.ndim == 2:
        path = path.with_suffix(".npy")
        np.save(path, x, allow_pickle=False)
        return path
    np.savez(path, **arrays)
    return path


def _check_images(i: int, x: np.ndarray, dataset: str) -> None:
    """EMD-CFL trains a small CNN on square images of its dataset's side (28, or 8 for
    ``rotdigits``): a table or images of another size are refused, naming what was given."""
    side = 8 if dataset == "rotdigits" else 28
    x = np.asarray(x)
    if x.dtype == object or not np.issubdtype(x.dtype, np.number) or x.ndim < 3 \
            or x.shape[-2:] != (side, side):
        what = ("a table (rows, features)" if x.ndim == 2 else f"shape {x.shape}"
                if x.dtype != object else "objects")
        raise ConfigError(
            f"simulate(): EMD-CFL trains a CNN on images, and client {i}'s data is {what}. "
            f"Allowed: images of shape (rows, {side}, {side}) (or (rows, channels, {side}, "
            f"{side})) with dataset={dataset!r}"
            + ("; 8×8 images with dataset='rotdigits'" if side == 28 else "")
            + ". Fix: for tabular data use exact-fcm, fedfcm or fedcref; for images pass them "
              "with their side")


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
        raise ConfigError(f"simulate(): EMD-CFL trains a classifier: client {i} has no "
                          f"training labels. Allowed: an image array with labels=[...], or a "
                          f"mapping with x_train, y_train, …. Fix: pass labels=[y0, y1, ...]")
    problem = _not_a_table(i, data)
    if problem:
        raise ConfigError(f"simulate(): {problem.replace('a DataFrame', 'images')}")
    x, y = np.asarray(data), np.asarray(y).reshape(-1)
    if x.ndim < 1 or len(x) != len(y) or len(x) < 3:
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
         evaluate: bool, data: dict[str, Any] | None = None) -> RunResult:
    from client_apps.app import app as client_app
    from server_app.inprocess import InProcessGrid, heap_frozen

    run_config.setdefault("num-clients", len(nodes))
    from fedclust.config import COMMON_KEYS

    count = next(k for k in COMMON_KEYS if k.name == "num-clients").parse(
        run_config["num-clients"])
    if count not in (0, len(nodes)):
        raise ConfigError(f"simulate(): run_config num-clients = {count} but {len(nodes)} "
                          f"client(s) were given. Allowed: num-clients = {len(nodes)} (or 0, "
                          f"or leave it out). Fix: drop num-clients from run_config, or pass "
                          f"{count} clients")
    args = {"dataset": dataset, "seed": seed, "output_dir": output_dir, "evaluate": evaluate,
            "run_config": run_config}
    # client i keeps its results in <run_dir>/clients/<i>/, as a simulated node does (it
    # still reads its own data-path: a node with a data-path of its own is not "simulated")
    grid = InProcessGrid(client_app, len(nodes), strategy.full_run_config(**args),
                         node_configs=[{**n, "partition-id": i} for i, n in enumerate(nodes)])
    from fedclust.outputs import durable_at_exit
    from fedclust.results import keeping_written
    from strategies.methods import _owner_results

    with keeping_written():     # the clients' tables, read back below while unchanged
        # every file of the run, the clients' too: one sync at the end
        with heap_frozen(), durable_at_exit():
            result = strategy.start(grid, data=data, **args)
        result.labels, result.memberships = _owner_results(result.run_dir)   # now in run_dir
    return result


def check(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """``fedclust check``: the run config as the ServerApp validates it before any message
    (every key and value, the cross-key rules, the method's preflight: the data files a
    simulation reads, the site files of ``dataset="files"``); returns the typed config.

    Raises
    ------
    ConfigError
        Or the data checks' own :class:`~fedclust.errors.BadInputError`.
    """
    from strategies.run import check_run_config

    return check_run_config(dict(run_config))


def sweep(argv: Sequence[str]) -> int:
    """``fedclust sweep …``: ``fedclust-sweep`` (:func:`server_app.sweep.main`, Hydra)."""
    import sys

    from server_app.sweep import main

    saved = sys.argv
    sys.argv = ["fedclust sweep", *argv]
    try:
        main()
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = saved
    return 0


def emdcfl_table(folders: Sequence[str], eps_sweep: bool = False,
                 epsilons: Sequence[float] | None = None) -> str:
    """``fedclust report --table emdcfl``: paper 001's table of the EMD-CFL runs under
    ``folders`` (:func:`server_app.emdcfl_experiments.table`); ``eps_sweep``: the clustering of
    the one run ``folders[0]`` at other ε (:func:`server_app.emdcfl_experiments.epsilon_sweep`).
    """
    from server_app.emdcfl_experiments import EPS_GRID, epsilon_sweep, table

    if eps_sweep:
        return "\n\n".join(epsilon_sweep(Path(f), list(epsilons or EPS_GRID)) for f in folders)
    return table([Path(f) for f in folders])


def deploy(argv: Sequence[str]) -> int:
    """``fedclust deploy …``: :func:`server_app.deploy.main` (``up``, ``certs``,
    ``fleet-gateway``)."""
    from server_app.deploy import main

    return main(list(argv))
