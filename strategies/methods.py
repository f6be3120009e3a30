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

import dataclasses
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

from fedclust.config import ConfigError
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.fcm.keys import FCMSettings
from fedclust.fedcref.keys import FedCRefSettings
from fedclust.fedfcm.keys import FedFCMSettings
from fedclust.results import RunRecorder
from fedclust.schema import Key, KeyedSettings, refuse_unknown

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
    from fedclust.results import recall_written

    labels, memberships = [], []
    for folder in folders:
        written = recall_written(folder / "assignments.csv")  # this process wrote it: unchanged
        if written is not None:
            labels.append(written[0])
            memberships.append(written[1])
            continue
        text = (folder / "assignments.csv").read_text()      # read once: header and rows
        lines = text.split("\n")
        header = lines[0].split(",")
        table = np.loadtxt(lines[1:], delimiter=",", ndmin=2)
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
    """Base of the fedclust methods: a method's Settings (its parameters, typed) and a
    ``start`` that runs the whole method (see the module docstring).

    A subclass names its Settings class (``settings_class``); its constructor's signature,
    defaults and the ``Parameters`` of its docstring are generated from that class's fields,
    the one declaration of each parameter (:func:`fedclust.schema.param`).
    """

    method: ClassVar[str]
    #: the method's Settings class: its declared fields are the constructor's parameters
    settings_class: ClassVar[type[KeyedSettings]]
    #: common run-config keys that are parameters of the method too (FCM's ``scaling``)
    common_params: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "settings_class" in cls.__dict__:
            _generate_constructor(cls)

    def __new__(cls, *args: Any, **params: Any) -> FedclustStrategy:
        # name the close matches of a mistyped parameter, not Python's bare TypeError
        named = list(cls.param_keys()) + ["settings"]
        refuse_unknown(f"{cls.__name__}()", [k for k in params if k not in named], named)
        return super().__new__(cls)

    def __init__(self, settings: KeyedSettings | None = None, **params: Any) -> None:
        from fedclust.config import check_installed

        check_installed(self.method)    # its pip extra, before anything else
        name = type(self).__name__
        if settings is not None and not isinstance(settings, self.settings_class):
            raise ConfigError(f"{name}(settings=...) got a {type(settings).__name__}. Allowed: "
                              f"a {self.settings_class.__name__}. Fix: pass "
                              f"settings={self.settings_class.__name__}(...), or the "
                              f"parameters by name")
        args = self._args()
        refuse_unknown(f"{name}()", sorted(set(params) - set(args)), sorted(args))
        fields = {args[arg][0]: value for arg, value in params.items()}
        try:      # bad values are refused here, before any run, as the run config's
            self.settings = (dataclasses.replace(settings, **fields) if settings is not None
                             else self.settings_class(**fields))
        except ConfigError as exc:
            raise ConfigError(f"{name}: {exc}") from None
        #: ``(raw run config, its validation)`` when :func:`from_run_config` built this
        #: object: :meth:`start` with the same run config does not validate it again
        self._validated: tuple[dict[str, Any], dict[str, Any]] | None = None

    # ------------------------------------------------------------------ parameters ↔ keys
    @classmethod
    def param_keys(cls) -> dict[str, str]:
        """Constructor parameter name → run-config key, for every parameter of the method."""
        return {arg: key.name for arg, (_, key, _) in cls._args().items()}

    @classmethod
    def _args(cls) -> dict[str, tuple[str, Key, str]]:
        """Parameter name → ``(field, key, type)``: the declared fields of the settings, then
        those holding :attr:`common_params`. A parameter is named after its key (``solver``
        for the field ``solver_name`` of ``emdcfl.solver``) unless the key's name is no
        Python name (``fedcref.lambda``: the field ``lam``)."""
        cached = cls.__dict__.get("_args_cache")
        if cached is None:
            import keyword

            settings_class = cls.settings_class
            names = ([name for name, _, _ in settings_class.parameters()]
                     + [name for name, key, _ in settings_class.bound()
                        if key.name in cls.common_params])
            cached = {}
            for name, key, text in settings_class.parameters(names):
                arg = key.name.removeprefix(settings_class.key_prefix).replace("-", "_")
                usable = arg.isidentifier() and not keyword.iskeyword(arg)
                cached[arg if usable else name] = (name, key, text)
            cls._args_cache = cached
        return cached

    @property
    def params(self) -> dict[str, Any]:
        """The method's parameters by name (the settings' fields the constructor takes)."""
        return {arg: getattr(self.settings, name) for arg, (name, _, _) in self._args().items()}

    def run_config(self) -> dict[str, Any]:
        """The parameters as run-config keys, ``method`` included (the nodes and the
        ServerApp read these; the cross-key rules, which need the whole run config, run in
        :meth:`start` before any message)."""
        names = [name for name, _, _ in self._args().values()]
        return {"method": self.method, **self.settings.to_config(names)}

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


def _generate_constructor(cls: type[FedclustStrategy]) -> None:
    """``cls.__init__`` with the parameters of ``cls.settings_class`` (their keys' defaults)
    as its signature, and the ``Parameters`` of the docstring written from the same fields."""
    import inspect

    from fedclust.schema import describe

    settings_class, args = cls.settings_class, cls._args()
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    parameters = [inspect.Parameter("self", kind)]
    parameters += [inspect.Parameter(arg, kind, default=key.default, annotation=text)
                   for arg, (_, key, text) in args.items()]
    parameters.append(inspect.Parameter("settings", inspect.Parameter.KEYWORD_ONLY,
                                        default=None,
                                        annotation=f"{settings_class.__name__} | None"))
    signature = inspect.Signature(parameters)

    def __init__(self: FedclustStrategy, *args: Any, settings: KeyedSettings | None = None,
                 **params: Any) -> None:
        given = signature.bind_partial(self, *args, **params).arguments
        given.pop("self")
        FedclustStrategy.__init__(self, settings, **given)

    __init__.__signature__ = signature    # type: ignore[attr-defined]
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__doc__ = f"See :class:`{cls.__name__}`."
    cls.__init__ = __init__    # type: ignore[method-assign]
    cls.__doc__ = "\n".join([
        (cls.__doc__ or "").rstrip(), "", "    Parameters", "    ----------",
        *describe(settings_class, [name for name, _, _ in args.values()],
                  {name: arg for arg, (name, _, _) in args.items()}),
        f"    settings : {settings_class.__name__}, optional",
        "        Every parameter at once; parameters also given by name replace its fields.",
        ""])


class ExactFCM(FedclustStrategy):
    """Exact federated fuzzy c-means (paper 004): each round the clients send the local sums
    ``U_i = Σ_j u_ij^m`` and ``WS_i = Σ_j u_ij^m x_j`` of the memberships to the broadcast
    centers, the server sets ``v_i = Σ_clients WS_i / Σ_clients U_i`` — the centralized FCM
    update, so the result equals FCM on the pooled data.

    Override of :meth:`start`: the rounds are preceded by a federated scaling phase and
    followed by a final phase (objective, owners' results). The parameters are the fields of
    :class:`~fedclust.fcm.keys.FCMSettings` (``ExactFCM(n_clusters=3)`` or
    ``ExactFCM(settings=FCMSettings(n_clusters=3))``).
    """

    method = "exact-fcm"
    settings_class = FCMSettings
    common_params = ("scaling",)
    settings: FCMSettings


class FedFCM(FedclustStrategy):
    """FedFCM with FedFuzzDB (paper 003): for every ``K`` in ``[k_min, k_max]`` the clients run
    local FCM from the global centers, the server averages the local centers (k-means
    averaging), and the federated fuzzy Davies–Bouldin index (eq. 15–17) chooses ``K``.

    Override of :meth:`start`: one loop of rounds per ``K``, then the index phase and a final
    phase at the chosen ``K``. The parameters are the fields of
    :class:`~fedclust.fedfcm.keys.FedFCMSettings`.
    """

    method = "fedfcm"
    settings_class = FedFCMSettings
    common_params = ("scaling",)
    settings: FedFCMSettings


class FedCRef(FedclustStrategy):
    """FedCRef (paper 000): per-cluster autoencoders on every client, associations between
    clusters of different clients by cross-reconstruction (booleans leave the clients),
    communities of associated clusters, one FedAvg autoencoder per community, greedy
    refinement of the local clusters, stop when the community structure is stable.

    Override of :meth:`start`: every iteration is several phases (local training, cross-
    evaluation, community FedAvg, refinement). The parameters are the fields of
    :class:`~fedclust.fedcref.keys.FedCRefSettings`.
    """

    method = "fedcref"
    settings_class = FedCRefSettings
    settings: FedCRefSettings


class EMDCFL(FedclustStrategy):
    """EMD-CFL (paper 001): after round 0 of local training, the server sends every client's
    model to every other client; each returns the randomly projected embeddings of its data;
    the server computes Earth Mover's distances, links ``c → o`` when
    ``W(train_c, val_o) − W(train_c, val_c) < ε`` in both directions, clusters the clients by
    identical closed neighbourhoods, then runs FedAvg per cluster.

    Override of :meth:`start`: the clustering step (embeddings of every peer model and the
    distance matrix) sits between round 0 and the per-cluster FedAvg rounds. The parameters
    are the fields of :class:`~fedclust.emdcfl.keys.EMDCFLSettings` (``algorithm`` runs a
    baseline on the same data, model and budget instead).
    """

    method = "emdcfl"
    settings_class = EMDCFLSettings
    settings: EMDCFLSettings


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
    own = set(cls.param_keys().values())
    rest = {k: v for k, v in run_config.items() if k not in own and k != "method"}
    strategy = cls(settings=cls.settings_class.from_config(cfg))    # typed, from the validation
    # start(run_config=rest) runs this run config with the method's parameters as validated,
    # which validates to the same ``cfg``: validated once
    strategy._validated = (strategy.full_run_config(run_config=rest), cfg)
    return strategy, rest
