"""The four methods as Flower :class:`~flwr.serverapp.strategy.Strategy` objects.

A Flower user puts a method into their own ServerApp::

    from flwr.serverapp import Grid, ServerApp
    from strategies.methods import ExactFCM

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context) -> None:
        result = ExactFCM(n_clusters=4).start(grid=grid, dataset="local")
        print(result.centers, result.summary["metrics"]["objective"])

and chains methods (choose K with FedFCM, then exact FCM with that K)::

    k = FedFCM(k_max=8).start(grid=grid, dataset="local").summary["metrics"]["best_k"]
    ExactFCM(n_clusters=k).start(grid=grid, dataset="local")

None of the four methods has Flower's train/evaluate round shape (FCM sums several statistics
per round and ends with a final phase; FedFCM loops over K; FedCRef trains many models per
iteration; EMD-CFL clusters once between rounds), so each class overrides
:meth:`Strategy.start` with the method's own phases, and the round-shaped hooks
(``configure_train`` …) say so when called. The ClientApp is fedclust's
(``client_apps.app:app``): the nodes must run it.

The constructor parameters are the method's run-config keys (``fcm.n-clusters`` →
``n_clusters``); :meth:`FedclustStrategy.run_config` turns them back into keys, validated by
the same schema as ``flwr run --run-config`` (:mod:`fedclust.config`). ``start`` goes through
:func:`strategies.run.execute`, the ServerApp's own path, and returns the run as it built it
(the files are written too, never read back).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedclust.config import ConfigError, all_keys
from fedclust.results import RunRecorder
from fedclust.schema import refuse_unknown

LOG = logging.getLogger("fedclust")


@dataclass
class RunResult(Result):
    """What a finished run returns: Flower's :class:`~flwr.serverapp.strategy.Result` plus
    fedclust's own results.

    Attributes
    ----------
    arrays : ArrayRecord
        The run's final arrays: every ``<name>.npy`` the run wrote (FCM: ``centers`` in the
        scaled space, ``centers_unscaled`` in the data's units, ``scaling_shift``/``_scale``;
        FedFCM also ``centers_k<K>``; EMD-CFL: ``clusters``, ``emd_matrix`` …).
    summary : dict
        What ``summary.json`` holds (``metrics``, ``config``, ``wall_time_s`` …).
    history : list of dict
        One record per round/iteration (``history.jsonl``).
    run_dir : Path
        The run's folder (plots, models, ``summary.json``).
    labels : list of ndarray, or None
        Each client's cluster of every row, in row order, by client number (the folders
        ``clients/<i>/``; exact FCM, FedFCM at the chosen K, FedCRef), from
        :func:`fedclust.simulate` and :meth:`from_dir` (on an engine the clients keep them:
        ``start`` leaves None). ``simulate`` gives pandas Series with the rows' index when the
        client's data was a DataFrame.
    memberships : list of ndarray (rows, clusters), or None
        Each client's fuzzy memberships (exact FCM, FedFCM), as ``labels``.
    feature_names : list of str, or None
        The feature columns (:func:`fedclust.simulate` with DataFrames).
    classes : list, or None
        FedCRef and EMD-CFL from :func:`fedclust.simulate`, when the labels it was given were
        not class numbers (text, say): the label of each class number the nodes used
        (``classes[k]`` is class ``k``), as scikit-learn's ``LabelEncoder.classes_``.
    """

    summary: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    run_dir: Path | None = None
    labels: list[Any] | None = None
    memberships: list[Any] | None = None
    feature_names: list[str] | None = None
    classes: list[Any] | None = None

    def __repr__(self) -> str:
        """One line: the method, data, clients, folder and scalar metrics — no array bytes."""
        from fedclust.registry import METHODS

        first = METHODS[m].report_metrics if (m := self.summary.get("method")) in METHODS else ()
        scalars = sorted(((k, v) for k, v in self.metrics.items()
                          if isinstance(v, (bool, int, float))),
                         key=lambda kv: first.index(kv[0]) if kv[0] in first else len(first))
        shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) and not isinstance(v, bool)
                          else f"{k}={v}" for k, v in scalars[:REPR_METRICS])
        more = f", … {len(scalars) - REPR_METRICS} more" if len(scalars) > REPR_METRICS else ""
        parts = [f"method={self.summary.get('method')!r}",
                 f"dataset={self.summary.get('dataset')!r}",
                 f"clients={self.summary.get('num_clients')}"]
        if self.centers is not None:
            parts.append(f"centers={self.centers.shape}")
        if self.labels is not None:
            parts.append(f"labels=[{len(self.labels)} clients]")
        parts += [f"metrics={{{shown}{more}}}", f"run_dir='{self.run_dir}'"]
        return f"RunResult({', '.join(parts)})"

    @property
    def metrics(self) -> dict[str, Any]:
        """``summary["metrics"]``."""
        return self.summary.get("metrics", {})

    @property
    def centers(self) -> np.ndarray | None:
        """FCM methods: the final centers in the data's own units (None for other methods)."""
        if "centers_unscaled" in self.arrays:
            return self.arrays["centers_unscaled"].numpy()
        return None

    @classmethod
    def from_recorder(cls, summary: dict[str, Any], recorder: RunRecorder) -> RunResult:
        """The run as ``recorder`` holds it in memory, with its ``summary``."""
        arrays = ArrayRecord({name: _array(recorder.arrays[name])
                              for name in sorted(recorder.arrays, key=lambda n: f"{n}.npy")})
        return cls(arrays=arrays, summary=summary, history=list(recorder.history),
                   run_dir=recorder.dir)

    @classmethod
    def from_dir(cls, run_dir: str | Path) -> RunResult:
        """Read a finished run's folder (``summary.json``, ``history.jsonl``, ``*.npy``)."""
        run_dir = Path(run_dir)
        summary = json.loads((run_dir / "summary.json").read_text())
        history_path = run_dir / "history.jsonl"
        history = ([json.loads(line) for line in history_path.read_text().splitlines() if line]
                   if history_path.exists() else [])
        arrays = ArrayRecord({p.stem: _array(np.load(p)) for p in sorted(run_dir.glob("*.npy"))})
        labels, memberships = _owner_results(run_dir)
        return cls(arrays=arrays, summary=summary, history=history, run_dir=run_dir,
                   labels=labels, memberships=memberships)


def _owner_results(run_dir: Path) -> tuple[list[np.ndarray] | None, list[np.ndarray] | None]:
    """Every ``clients/<i>/assignments.csv`` (``row,cluster[,u0,…]``) of a run folder, by
    ``i``: the clusters and, where written, the memberships; ``(None, None)`` without them
    (folders written before the column was named ``cluster`` call it ``label``)."""
    folders = sorted((p for p in (run_dir / "clients").glob("*")
                      if p.name.isdigit() and (p / "assignments.csv").is_file()),
                     key=lambda p: int(p.name))
    if not folders:
        return None, None
    labels, memberships = [], []
    for folder in folders:
        path = folder / "assignments.csv"
        header = path.read_text().split("\n", 1)[0].split(",")
        table = np.loadtxt(path, delimiter=",", skiprows=1, ndmin=2)
        column = header.index("cluster" if "cluster" in header else "label")
        labels.append(table[:, column].astype(np.int64))
        u = [i for i, name in enumerate(header) if name.startswith("u") and name[1:].isdigit()]
        memberships.append(table[:, u] if u else None)
    return labels, (memberships if all(m is not None for m in memberships) else None)


def _array(a: np.ndarray):
    from flwr.app import Array

    return Array(np.ascontiguousarray(a))


#: how many scalar metrics ``repr(RunResult)`` shows
REPR_METRICS = 8
#: the keyword arguments of :meth:`FedclustStrategy.start`
START_ARGS = ("dataset", "seed", "output_dir", "evaluate", "timeout", "run_config", "data")
#: Flower's own ``Strategy.start`` arguments, which a fedclust method does not take
FLOWER_START_ARGS = {
    "num_rounds": "Flower's round count: a fedclust method runs its own phases; its round "
                  "budget is a constructor parameter, e.g. ExactFCM(max_rounds=5)",
    "initial_arrays": "not used: each method builds its own start",
    "train_config": "not used: pass run-config keys in run_config=",
    "evaluate_config": "not used: pass run-config keys in run_config=",
    "evaluate_fn": "not used: the eval_* metrics come from the clients (evaluate=True)",
}


class FedclustStrategy(Strategy):
    """Base of the fedclust methods: parameters ↔ run-config keys, and a ``start`` that runs
    the whole method (see the module docstring)."""

    method: ClassVar[str]
    #: run-config key prefixes of this method's own keys (``"fcm."`` …)
    prefixes: ClassVar[tuple[str, ...]]
    #: common run-config keys that are parameters of the method (e.g. FCM's ``scaling``)
    common_params: ClassVar[tuple[str, ...]] = ()

    def __new__(cls, *args: Any, **params: Any) -> FedclustStrategy:
        # A method with an explicit signature (ExactFCM, FedFCM) would otherwise meet a
        # mistyped parameter with Python's bare TypeError: name the close matches instead.
        import inspect

        sig = inspect.signature(cls.__init__)
        if not any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            named = [n for n in sig.parameters if n != "self"]
            refuse_unknown(f"{cls.__name__}()", [k for k in params if k not in named], named)
        return super().__new__(cls)

    def __init__(self, **params: Any) -> None:
        from fedclust.config import check_installed

        check_installed(self.method)    # its pip extra, before anything else
        self.params = dict(params)
        self.run_config()    # bad names and values are refused here, before any run
        #: ``(raw run config, its validation)`` when :func:`from_run_config` built this
        #: object: :meth:`start` with the same run config does not validate it again
        self._validated: tuple[dict[str, Any], dict[str, Any]] | None = None

    # ------------------------------------------------------------------ parameters ↔ keys
    @classmethod
    def param_keys(cls) -> dict[str, str]:
        """Constructor parameter name → run-config key, for every key of the method."""
        out = {}
        for key in all_keys():
            if key.name in cls.common_params:
                out[key.name.replace("-", "_").replace(".", "_")] = key.name
            elif key.name.startswith(cls.prefixes):
                out[key.name.split(".", 1)[1].replace("-", "_")] = key.name
        return out

    def run_config(self) -> dict[str, Any]:
        """The parameters as run-config keys, ``method`` included; each value checked against
        its key's schema (the cross-key rules, which need the whole run config, run in
        :meth:`start` before any message).

        Raises
        ------
        ConfigError
            An unknown parameter name (with the close matches), or a value the key's schema
            refuses (what is allowed and how to fix it).
        """
        names = self.param_keys()
        refuse_unknown(f"{type(self).__name__}()", sorted(set(self.params) - set(names)),
                       sorted(names))
        cfg = {"method": self.method, **{names[k]: v for k, v in self.params.items()}}
        schema = {k.name: k for k in all_keys()}
        try:
            for key, value in cfg.items():
                schema[key].parse(value)
        except ConfigError as exc:
            raise ConfigError(f"{type(self).__name__}: {exc}") from None
        return cfg

    # ------------------------------------------------------------------ Flower Strategy
    def start(self, grid: Grid, *, dataset: str | None = None, seed: int | None = None,
              output_dir: str | Path | None = None, evaluate: bool | None = None,
              timeout: float | None = None, run_config: Mapping[str, Any] | None = None,
              data: Mapping[str, Any] | None = None, **unknown: Any) -> RunResult:
        """Run the method on ``grid`` and return its :class:`RunResult`.

        Parameters
        ----------
        grid : Grid
            The ServerApp's grid; its nodes run fedclust's ClientApp.
        dataset : str, optional
            Run config ``dataset`` (``"local"``: each node reads its node config
            ``data-path``; ``"files"``: one site file per simulated node; or a built-in set).
        seed : int, optional
            Run config ``seed``.
        output_dir : str or Path, optional
            Where the run's results go (default: a new folder under ``~/fedclust-runs``).
        evaluate : bool, optional
            Run config ``evaluate`` (ground-truth metrics; a deployed node still needs node
            config ``allow-evaluation=true``).
        timeout : float, optional
            Seconds to wait for replies per step.
        run_config : mapping, optional
            Any other run-config keys (``num-clients``, ``min-clients``, ``data-dir`` …).
        data : mapping, optional
            What the nodes hold, when the run config cannot tell (``summary.json``'s ``data``
            and the tracker's params; :func:`fedclust.simulate` describes the arrays,
            DataFrames or Hugging Face data it was given).

        Raises
        ------
        UnknownArgumentError
            Any other keyword argument, e.g. Flower's ``num_rounds`` (the method's own round
            budget is a constructor parameter), with the close matches.
        """
        from strategies.run import execute

        refuse_unknown(f"{type(self).__name__}.start()", sorted(unknown), START_ARGS,
                       {**FLOWER_START_ARGS, **{k: f"a parameter of {type(self).__name__}(...)"
                                               for k in unknown if k in self.param_keys()}})
        cfg = self.full_run_config(dataset=dataset, seed=seed, output_dir=output_dir,
                                   evaluate=evaluate, timeout=timeout, run_config=run_config)
        raw, validated = self._validated or (None, None)
        summary, recorder = execute(grid, cfg, validated if raw == cfg else None,
                                    data=dict(data) if data else None)
        return RunResult.from_recorder(summary, recorder)

    def full_run_config(self, *, dataset: str | None = None, seed: int | None = None,
                        output_dir: str | Path | None = None, evaluate: bool | None = None,
                        timeout: float | None = None,
                        run_config: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The flat run config :meth:`start` runs with (its arguments, then the method's
        parameters); the nodes of an engine must see the same one."""
        cfg = dict(run_config or {})
        for key, value in (("dataset", dataset), ("seed", seed), ("evaluate", evaluate),
                           ("timeout", timeout),
                           ("output-dir", None if output_dir is None else str(output_dir))):
            if value is not None:
                cfg[key] = value
        clash = sorted(set(cfg) & (set(self.param_keys().values()) | {"method"}))
        if clash:
            raise ConfigError(f"run_config repeats the method's own parameter(s) {clash}. "
                              f"Allowed: the method's parameters once, as arguments. Fix: give "
                              f"them to {type(self).__name__}(...) (or to simulate() by name) "
                              f"instead of run_config")
        return {**cfg, **self.run_config()}

    def summary(self) -> None:
        """Log the method and its parameters."""
        LOG.info("%s(%s)", type(self).__name__,
                 ", ".join(f"{k}={v!r}" for k, v in sorted(self.params.items())))

    def _round_shape(self, hook: str):
        raise NotImplementedError(
            f"{type(self).__name__} has no train/evaluate rounds of Flower's shape: its phases "
            f"run inside start() ({hook} is not used). Call start(grid=...).")

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Not used: see :meth:`start`."""
        self._round_shape("configure_train")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Not used: see :meth:`start`."""
        self._round_shape("aggregate_train")

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Not used: see :meth:`start`."""
        self._round_shape("configure_evaluate")

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]
                           ) -> MetricRecord | None:
        """Not used: see :meth:`start`."""
        self._round_shape("aggregate_evaluate")


class ExactFCM(FedclustStrategy):
    """Exact federated fuzzy c-means (paper 004): each round the clients send the local sums
    ``U_i = Σ_j u_ij^m`` and ``WS_i = Σ_j u_ij^m x_j`` of the memberships to the broadcast
    centers, the server sets ``v_i = Σ_clients WS_i / Σ_clients U_i`` — the centralized FCM
    update, so the result equals FCM on the pooled data.

    Parameters
    ----------
    n_clusters : int, default 4
        Number of clusters ``C``.
    m : float, default 2.0
        Fuzzifier ``m`` (``λ`` in paper 004), in (1, 100].
    epsilon : float, default 0.005
        Stop when ``‖V(t+1) − V(t)‖_F < ε``.
    max_rounds : int, default 30
        Maximum federated rounds ``T``.
    fraction : float, default 1.0
        Participation fraction ``γ`` resampled every round.
    privacy_guard : bool, default True
        A client with ``N ≤ C(F+1)/F`` rows sends no statistic (paper 004 §4.2).
    secure_aggregation : bool, default False
        Sum the statistics with SecAgg+ (the server sees only totals).
    incremental : bool, default False
        Keep every client's latest ``U, WS`` on the server and update from the sum over all
        clients, replacing only the answering clients' sums (incremental EM): with
        ``fraction < 1`` the fixed point is centralized FCM's. Plain sums only (refused with
        ``secure_aggregation``).
    scaling : {"minmax", "standard", "none"}, default "minmax"
        Federated feature scaling before clustering.

    Override of :meth:`start`: the rounds are preceded by a federated scaling phase and
    followed by a final phase (objective, owners' results).
    """

    method = "exact-fcm"
    prefixes = ("fcm.",)
    common_params = ("scaling",)

    def __init__(self, n_clusters: int = 4, m: float = 2.0, epsilon: float = 0.005,
                 max_rounds: int = 30, fraction: float = 1.0, privacy_guard: bool = True,
                 secure_aggregation: bool = False, incremental: bool = False,
                 scaling: str = "minmax") -> None:
        super().__init__(n_clusters=n_clusters, m=m, epsilon=epsilon, max_rounds=max_rounds,
                         fraction=fraction, privacy_guard=privacy_guard,
                         secure_aggregation=secure_aggregation, incremental=incremental,
                         scaling=scaling)


class FedFCM(FedclustStrategy):
    """FedFCM with FedFuzzDB (paper 003): for every ``K`` in ``[k_min, k_max]`` the clients run
    local FCM from the global centers, the server averages the local centers (k-means
    averaging), and the federated fuzzy Davies–Bouldin index (eq. 15–17) chooses ``K``.

    Parameters
    ----------
    k_min, k_max : int, default 2, 6
        Range of the number of clusters ``K`` tried.
    m : float, default 2.0
        Fuzzifier ``m``.
    averaging : {"kmeans", "fedavg"}, default "kmeans"
        Global update: k-means averaging (the paper) or support-weighted averaging.
    tol : float, default 0.01
        Stop when ``Σ_k ‖c_k(t) − c_k(t+1)‖ ≤ tol``.
    max_rounds : int, default 10
        Maximum federated rounds per ``K``.
    local_tol : float, default 0.001
        Local FCM stops when ``‖U(t+1) − U(t)‖_F ≤ local_tol``.
    local_max_iter : int, default 50
        Maximum local FCM iterations per round.
    local_index : bool, default True
        Clients also report their local fuzzy DB index per ``K``.
    local_k_max : int, default 0
        Largest ``K`` of the local index (0 = ``k_max``).
    p, q : float, default 2.0, 1.0
        Minkowski ``p`` of the center distances ``M_ij`` and power ``q`` of the spread ``S_i``.
    privacy_guard : bool, default True
        A client with ``N ≤ K(F+1)/F`` rows (``K = k_max``) sends no statistic.
    scaling : {"minmax", "standard", "none"}, default "minmax"
        Federated feature scaling before clustering.

    Override of :meth:`start`: one loop of rounds per ``K``, then the index phase and a final
    phase at the chosen ``K``.
    """

    method = "fedfcm"
    prefixes = ("fedfcm.",)
    common_params = ("scaling",)

    def __init__(self, k_min: int = 2, k_max: int = 6, m: float = 2.0, averaging: str = "kmeans",
                 tol: float = 0.01, max_rounds: int = 10, local_tol: float = 0.001,
                 local_max_iter: int = 50, local_index: bool = True, local_k_max: int = 0,
                 p: float = 2.0, q: float = 1.0, privacy_guard: bool = True,
                 scaling: str = "minmax") -> None:
        super().__init__(k_min=k_min, k_max=k_max, m=m, averaging=averaging, tol=tol,
                         max_rounds=max_rounds, local_tol=local_tol,
                         local_max_iter=local_max_iter, local_index=local_index,
                         local_k_max=local_k_max, p=p, q=q, privacy_guard=privacy_guard,
                         scaling=scaling)


class FedCRef(FedclustStrategy):
    """FedCRef (paper 000): per-cluster autoencoders on every client, associations between
    clusters of different clients by cross-reconstruction (booleans leave the clients),
    communities of associated clusters, one FedAvg autoencoder per community, greedy
    refinement of the local clusters, stop when the community structure is stable.

    Parameters
    ----------
    assoc_rule : str, default "confident"
        The association test: ``"confident"`` (sign tests at level ``beta`` that a foreign
        model is within ``margin`` of the own model on held-out samples, within
        ``best_margin`` of the best foreign model, and better than the client's other cluster
        models; it abstains when the samples are too few), ``"ratio"`` (the median held-out
        log error ratio ≤ ``epsilon``) or ``"eq2"`` (the paper's eq. 2, with ``theta`` and
        ``alpha``).
    margin, best_margin, beta : float, default 0.3, 0.1, 0.02
        The confident test's margins (in log reconstruction error) and level.
    refine : str, default "covered"
        Algorithm 2's candidates: ``"covered"`` (community models take only samples whose
        best own model is a member of a community the client confirms), ``"gated"`` or
        ``"paper"``.
    wire : str, default "int8-delta"
        Number format of model weights in messages (``"int8-delta"``: the ``"int8"`` weights
        sent as compressed differences from a model both ends hold; ``"float32"``,
        ``"float16"``, ``"int8"``).
    epsilon : float, default 0.15
        ``ε`` of the ratio test: "within a factor ``e^ε`` of the own model's error".
    theta : float, default 0.2
        ``θ`` of eq. (2): threshold on the normalised reconstruction-error gap.
    alpha : float, default 0.75
        ``α`` of eq. (2): required ``Pr{D ≤ θ}``.
    tau : float, default 0.8
        ``τ``: a client whose labels agree (ACC) ≥ ``τ`` with the previous iteration becomes
        inactive.
    max_iterations : int, default 10
        Maximum iterations of Algorithm 1.
    fl_rounds : int, default 15
        FedAvg rounds per community per iteration.
    init : str, default "auto"
        Initial local clustering (``"auto"``: the paper's dirty start on simulated nodes,
        label-free k-means on deployed nodes).
    **options
        Any other ``fedcref.*`` key, named without the prefix and with ``_`` for ``-``
        (``ae_epochs=20``, ``association="mutual"`` …); ``fedclust config list``
        lists them.

    Override of :meth:`start`: every iteration is several phases (local training, cross-
    evaluation, community FedAvg, refinement).
    """

    method = "fedcref"
    prefixes = ("fedcref.",)

    def __init__(self, assoc_rule: str = "confident", margin: float = 0.3,
                 best_margin: float = 0.1, beta: float = 0.02, refine: str = "covered",
                 wire: str = "int8-delta", epsilon: float = 0.15, theta: float = 0.2,
                 alpha: float = 0.75, tau: float = 0.8, max_iterations: int = 10,
                 fl_rounds: int = 15, init: str = "auto", **options: Any) -> None:
        super().__init__(assoc_rule=assoc_rule, margin=margin, best_margin=best_margin,
                         beta=beta, refine=refine, wire=wire, epsilon=epsilon, theta=theta,
                         alpha=alpha, tau=tau, max_iterations=max_iterations,
                         fl_rounds=fl_rounds, init=init, **options)


class EMDCFL(FedclustStrategy):
    """EMD-CFL (paper 001): after round 0 of local training, the server sends every client's
    model to every other client; each returns the randomly projected embeddings of its data;
    the server computes Earth Mover's distances, links ``c → o`` when
    ``W(train_c, val_o) − W(train_c, val_c) < ε`` in both directions, clusters the clients by
    identical closed neighbourhoods, then runs FedAvg per cluster.

    Parameters
    ----------
    epsilon : float or "auto", default "auto"
        Tolerance ``ε`` of the edge rule: a number (the paper: 0.1), or ``"auto"``: read
        from the run's own excesses (:func:`fedclust.emdcfl.cluster.auto_epsilon`).
    rounds : int, default 3
        Global rounds including round 0.
    local_epochs : int, default 1
        Local epochs per round.
    proj_ratio : float, default 0.9
        Random projection dimension / embedding dimension.
    metric : {"cosine", "euclidean", "sqeuclidean"}, default "cosine"
        Ground cost of the EMD.
    algorithm : str, default "emdcfl"
        ``"emdcfl"`` or a baseline on the same data, model and budget (``"oracle"``,
        ``"fedavg"``, ``"local"``, ``"ifca"``, ``"cfl"``).
    **options
        Any other ``emdcfl.*`` key, named without the prefix and with ``_`` for ``-``
        (``conv1=64``, ``max_samples=512`` …).

    Override of :meth:`start`: the clustering step (embeddings of every peer model and the
    distance matrix) sits between round 0 and the per-cluster FedAvg rounds.
    """

    method = "emdcfl"
    prefixes = ("emdcfl.",)

    def __init__(self, epsilon: float | str = "auto", rounds: int = 3, local_epochs: int = 1,
                 proj_ratio: float = 0.9, metric: str = "cosine", algorithm: str = "emdcfl",
                 **options: Any) -> None:
        super().__init__(epsilon=epsilon, rounds=rounds, local_epochs=local_epochs,
                         proj_ratio=proj_ratio, metric=metric, algorithm=algorithm, **options)


#: The strategy class of each method (``method`` run-config value).
STRATEGIES: dict[str, type[FedclustStrategy]] = {
    cls.method: cls for cls in (ExactFCM, FedFCM, FedCRef, EMDCFL)}


def from_run_config(run_config: Mapping[str, Any]
                    ) -> tuple[FedclustStrategy, dict[str, Any]]:
    """The strategy a flat run config names, and the run config's other keys (for
    :meth:`FedclustStrategy.start`): how the ServerApp and the launchers build a method.

    Raises
    ------
    ConfigError
        Any bad key or value (:func:`fedclust.config.validate`).
    """
    from fedclust.config import validate

    cfg = validate(run_config)   # every key, as flwr run --run-config
    cls = STRATEGIES[cfg["method"]]
    param_of = {key: name for name, key in cls.param_keys().items()}
    params = {param_of[k]: v for k, v in run_config.items() if k in param_of}
    rest = {k: v for k, v in run_config.items() if k not in param_of and k != "method"}
    strategy = cls(**params)
    # start(run_config=rest) runs this run config with the method's other parameters at their
    # defaults, which validates to the same ``cfg``: validated once
    strategy._validated = (strategy.full_run_config(run_config=rest), cfg)
    return strategy, rest
