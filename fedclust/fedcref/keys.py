"""Run-config keys of FedCRef (paper 000), prefix ``fedcref.``, and the typed settings built
from them: :class:`Settings` (the server's loop), :class:`ClientSettings` (the client steps)
and :class:`SystemSettings` (the simulated system of §5.2)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

from fedclust.common import common
from fedclust.data.capacity import Capacity
from fedclust.schema import Key, KeyedSettings, param, ref, require, settings

if TYPE_CHECKING:
    from fedclust.fedcref.rules import AssociationRule, ClusterGraph, Refinement

IMAGE_DATASETS = ("digits", "mnist", "fashion-mnist", "emnist-digits", "kmnist", "k49", "local",
                  "files")


def _hidden(value: str) -> str | None:
    try:
        sizes = [int(v) for v in value.split(",")]
    except ValueError:
        return "expected comma-separated ints, e.g. '100,64,32'"
    return None if sizes and min(sizes) > 0 else "expected positive layer sizes"


@settings(prefix="fedcref.")
class FedCRefSettings(KeyedSettings):
    """Every ``fedcref.*`` key, declared once: field ``x_y`` is the key ``fedcref.x-y`` (the
    parameters of the FedCRef Strategy). The loop, the clients and the simulated system read
    views of the same run config that refer to these fields (:func:`key_ref`):
    :class:`Settings`, :class:`ClientSettings` and :class:`SystemSettings`."""

    # system generator (§5.2)
    samples_per_cluster: int = param(0, "S, samples per client cluster (0 = auto: 500, or 30 for "
                                     "the small embedded 'digits')", low=0)
    k_min: int = param(2, "smallest K_i (classes per client)", low=1)
    k_max: int = param(0, "largest K_i (0 = |U|/2)", low=0)
    overlap: float = param(0.0, "O, fraction of a cluster's samples shared with the other clients' "
                           "clusters of the same class", low=0.0, high=1.0, high_open=True)
    split: str = param("train", "dataset split the system is drawn from",
                       choices=("train", "test", "all"))
    k49_min_count: int = param(6000, "k49: keep classes with at least this many training samples "
                               "(paper: 31 classes)", low=0)
    # initial clustering
    init: str = param("auto", "initial local clustering: 'auto' = 'dirty' on simulated nodes (the "
                      "paper's protocol, built from the true classes) and 'kmeans' on deployed "
                      "nodes (node config data-path; label-free, K_i from num-clusters or the "
                      "silhouette estimate); 'dirty' on a deployed node needs evaluate=true and "
                      "node config allow-evaluation=true",
                      choices=("auto", "dirty", "kmeans", "dec"))
    dirtiness: float = param(0.3, "dirty init: probability a sample starts in a wrong cluster (0 = "
                             "oracle split)", low=0.0, high=1.0)
    estimate_k: bool = param(False, "kmeans/dec init: estimate K_i by silhouette over "
                             "2..fedcref.k-estimate-max instead of using the given K_i")
    k_estimate_max: int = param(8, "largest K_i tried by the silhouette estimate", low=2)
    dec_pretrain_epochs: int = param(50, "DEC autoencoder pretraining epochs", low=1)
    dec_maxiter: int = param(2000, "DEC KL-refinement iterations", low=0)
    # algorithm (§4, defaults of §5.2)
    alpha: float = param(0.75, "alpha: required Pr{D <= theta} (the 75th percentile)", low=0.0,
                         high=1.0, low_open=True)
    theta: float = param(0.2, "theta: association threshold on the normalised error gap", low=0.0,
                         high=1.0)
    assoc_rule: str = param("confident", "association test: 'confident' (not in the paper: sign "
                            "tests at level beta on the cluster's own samples that the foreign "
                            "model is within fedcref.margin of the own model on held-out samples, "
                            "within fedcref.best-margin of the best foreign model, and better than "
                            "each of the client's other cluster models; abstains when the samples "
                            "are too few to tell), 'ratio' (not in the paper: the ratio-quantile "
                            "of log e_foreign - log e_own over the cluster's held-out samples <= "
                            "epsilon), 'eq2' (the paper: Pr{normalised error gap <= theta} >= "
                            "alpha; theta depends on the dataset) or 'calibrated' (not in the "
                            "paper, not recommended: the same statistic <= lambda times the "
                            "statistic of the client's own closest other cluster model)",
                            choices=("eq2", "ratio", "calibrated", "confident"))
    beta: float = param(0.02, "assoc-rule=confident: level of each of its sign tests (the chance "
                        "that one passes on evidence no stronger than a coin's)", low=0.0, high=1.0,
                        low_open=True, high_open=True)
    margin: float = param(0.3, "assoc-rule=confident: a foreign model must be within a factor "
                          "e^margin of the own model's error on most held-out samples", low=0.0)
    best_margin: float = param(0.1, "assoc-rule=confident: a foreign model must be within a factor "
                               "e^best-margin of the best foreign model's error on most of the "
                               "cluster's samples", low=0.0)
    best_margin_growth: float = param(0.3, "assoc-rule=confident: a cluster of n samples uses "
                                      "best-margin * max(1, n/60)^best-margin-growth (0 = "
                                      "best-margin at every size)", low=0.0)
    wire: str = param("int8-delta", "number format of model weights in messages: 'float32', "
                      "'float16', 'int8' (8-bit weights with one scale per output unit: about a "
                      "quarter of the bytes) or 'int8-delta' (the same 8-bit weights, sent as the "
                      "compressed difference of their codes from a model both ends hold: the "
                      "model's seeded initialisation or the previous FedAvg round's model; about "
                      "half to a third of int8's bytes)",
                      choices=("int8-delta", "float32", "float16", "int8"))
    cannot_link: bool = param(True, "cut the cluster graph so that no community holds two clusters "
                              "of one client (a minimum edge cut between them; not in the paper)")
    bridge_cut: int = param(3, "cut a link that alone joins two groups of at least this many "
                            "clusters each (a bridge of the cluster graph: one mutual acceptance "
                            "between two groups of one kind each; 0 = off; not in the paper)",
                            low=0)
    new_links: str = param("first", "which iterations may link clusters: 'every' (the paper), "
                           "'first' (later iterations test the first iteration's links again and "
                           "keep or drop them, never add one: refined clusters can drift into "
                           "mixtures of groups), 'once' (later iterations keep the first "
                           "iteration's links without a new cross-evaluation) or 'partners' (as "
                           "'first', but a client receives only the models of its clusters' "
                           "first-iteration partners, and the best foreign model is the best of "
                           "those); 'first', 'once' and 'partners' are not in the paper",
                           choices=("every", "first", "once", "partners"))
    refine: str = param("covered", "refinement (Algorithm 2): 'paper' (every sample may go to any "
                        "community model), 'gated' (a sample is offered only the communities of "
                        "the cluster whose own model reconstructs it best) or 'covered' (a sample "
                        "whose best own model belongs to a community the client confirms is "
                        "reassigned among the client's confirmed community models; any other "
                        "sample keeps its own models)", choices=("paper", "gated", "covered"))
    lam: float = param(0.9, "assoc-rule=calibrated: accept a foreign model closer to the own model "
                       "than this fraction of the way to the client's own closest other cluster "
                       "model (log error ratio over the held-out samples)", name="lambda", low=0.0,
                       high=1.0, low_open=True, high_open=True)
    epsilon: float = param(0.15, "epsilon of assoc-rule=ratio: accept a foreign model within a "
                           "factor e^epsilon of the own model's held-out error", low=0.0)
    ratio_quantile: float = param(0.5, "quantile of the log error ratio that assoc-rule=ratio and "
                                  "calibrated use (0.5 = median)", low=0.0, high=1.0, low_open=True,
                                  high_open=True)
    holdout: float = param(0.15, "assoc-rule=ratio or calibrated: share of each cluster held out "
                           "from its own autoencoder's training, on which the ratio is measured",
                           low=0.0, high=1.0, low_open=True, high_open=True)
    tau: float = param(0.8, "tau: a client whose labels agree (ACC) >= tau with the previous "
                       "iteration becomes inactive", low=0.0, high=1.0)
    association: str = param("mutual", "cluster graph: 'mutual' (the algorithm), 'perfect' "
                             "(baseline: graph from ground truth), 'none' (local-only baseline)",
                             choices=("mutual", "perfect", "none"))
    assoc_best_per_client: bool = param(True, "deviation (false = paper): a cluster accepts at "
                                        "most one cluster per foreign client, its best-scoring one "
                                        "(the reference code kept the first match per client pair)")
    max_iterations: int = param(10, "maximum FedCRef iterations", low=1)
    stop_window: int = param(3, "stop when communities and isolated counts change by at most "
                             "stop-change for this many consecutive iterations", low=1)
    stop_change: float = param(0.1, "relative change regarded as 'unchanged'", low=0.0)
    fl_rounds: int = param(15, "FedAvg rounds per community per iteration", low=1)
    reuse_communities: bool = param(False, "keep a community's model, untrained, while its member "
                                    "clusters and their clients' labels are unchanged since it was "
                                    "trained (not in the paper: it retrains every community every "
                                    "iteration)")
    warm_start: bool = param(False, "start a community from the previous iteration's community "
                             "model with the most members in common (or, if none, from its first "
                             "member's cluster model), trained for warm-rounds FedAvg rounds, and "
                             "a local cluster model from the cluster's previous model, trained for "
                             "warm-epochs epochs (not in the paper: it starts every model afresh)")
    warm_rounds: int = param(5, "warm-start: FedAvg rounds of a warm-started community (a fresh "
                             "one gets fl-rounds)", low=1)
    warm_epochs: int = param(5, "warm-start: epochs of a local cluster model that starts from the "
                             "cluster's previous model (a fresh one gets ae-epochs; not with "
                             "assoc-rule=ratio or calibrated, whose held-out samples the previous "
                             "model has seen)", low=1)
    fl_local_epochs: int = param(3, "local epochs per FedAvg round (not in the paper; the "
                                 "reference code used 2 then 7; 3 measured better than 1, "
                                 "docs/fedcref.md)", low=1)
    ae_hidden: str = param("100,64,32", "autoencoder encoder sizes (decoder mirrored)",
                           check=_hidden)
    ae_epochs: int = param(20, "epochs of local cluster autoencoder training", low=1)
    ae_patience: int = param(4, "early stopping patience on the epoch loss (0 = off)", low=0)
    ae_init: str = param("keras", "autoencoder weight init: 'keras' (glorot-uniform weights, zero "
                         "biases; the reference code) or 'torch' (nn.Linear default)",
                         choices=("keras", "torch"))
    batch_size: int = param(32, "mini-batch size of all autoencoder training (reference code: "
                            "Keras default 32)", low=1)
    lr: float = param(1e-3, "Adam learning rate", low=0.0, low_open=True)
    min_cluster_size: int = param(5, "clusters smaller than this get no model", low=1)
    torch_threads: int = param(1, "torch threads per client process (1 is fastest on a busy 2-core "
                               "machine)", low=1)
    device: str = param("cpu", "torch device of the clients' autoencoder training and "
                        "reconstruction errors: cpu, cuda, or auto (cuda if "
                        "torch.cuda.is_available()); checked on each node",
                        choices=("cpu", "cuda", "auto"))


KEYS: list[Key] = FedCRefSettings.keys()


def key_ref(name: str, convert: Callable[[Any], Any] | None = None) -> Any:
    """A view's field that holds the key :class:`FedCRefSettings` declares as field ``name``
    (with its default)."""
    return ref(next(key for field, key, _ in FedCRefSettings.bound() if field == name),
               convert=convert)


def _sizes(value: str | tuple[int, ...]) -> tuple[int, ...]:
    """``"100,64,32"`` → ``(100, 64, 32)``."""
    return tuple(int(v) for v in (value.split(",") if isinstance(value, str) else value))


def check(cfg: dict[str, Any]) -> None:
    """Cross-key rules of FedCRef.

    The project-wide default ``dataset=blobs`` (not an image dataset) resolves to the embedded
    ``digits``, so that ``flwr run . --run-config 'method="fedcref"'`` needs no files.
    """
    if cfg["dataset"] == "blobs":
        cfg["dataset"] = "digits"
    require(cfg["dataset"] in IMAGE_DATASETS, "dataset", cfg["dataset"],
            "an image dataset for method=fedcref: " + ", ".join(IMAGE_DATASETS)
            + " ('blobs', the project default, means digits)",
            "pass dataset=digits (embedded) or dataset=mnist with data-dir=<folder>")
    require(cfg["fedcref.k-max"] == 0 or cfg["fedcref.k-max"] >= cfg["fedcref.k-min"],
            "fedcref.k-max", cfg["fedcref.k-max"], f">= fedcref.k-min ({cfg['fedcref.k-min']})",
            "raise fedcref.k-max or set it to 0 (= |U|/2)")
    require(cfg["fedcref.association"] != "perfect" or cfg["evaluate"], "fedcref.association",
            cfg["fedcref.association"], "'perfect' only with evaluate=true (it is a ground-truth "
            "baseline)", "set evaluate=true or use fedcref.association=mutual")
    require(cfg["dataset"] in ("digits", "local", "files") or cfg["data-dir"] != "", "data-dir",
            cfg["data-dir"], f"the folder holding the {cfg['dataset']} files",
            "pass data-dir=/path/to/data")


# ---------------------------------------------------------------------------------------------
# typed settings, from a validated run config (fedclust.config.validate; nothing here checks
# again)

@settings(document=False)
class Settings(KeyedSettings):
    """The server loop's parameters (:func:`fedclust.fedcref.algorithm.run`).

    Attributes
    ----------
    seed : int
        Draws every phase's seed (``seed``).
    max_iterations : int
        Most iterations of Algorithm 1 (``fedcref.max-iterations``).
    tau : float
        ``τ``: a client whose labels agree (ACC) ≥ ``τ`` with the last iteration's becomes
        inactive (``fedcref.tau``).
    fl_rounds : int
        FedAvg rounds per community per iteration (``fedcref.fl-rounds``).
    stop_window : int
        Iterations of unchanged counts that stop the run (``fedcref.stop-window``).
    stop_change : float
        Relative change regarded as unchanged (``fedcref.stop-change``).
    association : str
        ``"mutual"``, ``"perfect"`` (ground truth) or ``"none"`` (``fedcref.association``).
    ae_init : str
        Initialisation of the community models, ``"keras"`` or ``"torch"``
        (``fedcref.ae-init``).
    evaluate : bool
        Compute the ``eval_*`` metrics from the clients' histograms (``evaluate``).
    cannot_link : bool
        No community holds two clusters of one client (``fedcref.cannot-link``).
    bridge_cut : int
        Cut a link that alone joins two groups of at least this many clusters each
        (``fedcref.bridge-cut``; 0 = off).
    new_links : str
        ``"every"`` iteration may link clusters (the paper); ``"first"`` (default): later
        iterations re-test the first iteration's links and never add one; ``"once"``: later
        iterations keep them without cross-evaluation; ``"partners"``: as ``"first"``, with
        each client re-testing against its clusters' first-iteration partners only
        (``fedcref.new-links``).
    reuse_communities : bool
        Keep a community's model while nothing it depends on changed
        (``fedcref.reuse-communities``).
    warm_start : bool
        Start a community from an earlier model (``fedcref.warm-start``).
    warm_rounds : int
        FedAvg rounds of a warm-started community (``fedcref.warm-rounds``).
    """

    checked: ClassVar[bool] = False   # tests and probes go beyond the keys' ranges

    seed: int = common("seed")
    max_iterations: int = key_ref("max_iterations")
    tau: float = key_ref("tau")
    fl_rounds: int = key_ref("fl_rounds")
    stop_window: int = key_ref("stop_window")
    stop_change: float = key_ref("stop_change")
    association: str = key_ref("association")
    ae_init: str = key_ref("ae_init")
    evaluate: bool = common("evaluate")
    cannot_link: bool = key_ref("cannot_link")
    bridge_cut: int = key_ref("bridge_cut")
    new_links: str = key_ref("new_links")
    reuse_communities: bool = key_ref("reuse_communities")
    warm_start: bool = key_ref("warm_start")
    warm_rounds: int = key_ref("warm_rounds")

    @cached_property
    def cluster_graph(self) -> ClusterGraph:
        """Where the graph's edges come from, chosen once (:mod:`fedclust.fedcref.rules`):
        the mutual test under the links policy ``new_links`` and the graph cuts, or a
        baseline."""
        from fedclust.fedcref import association, rules

        if self.association == "perfect":
            return association.Perfect()
        if self.association == "none":
            return association.Unlinked()
        return association.Mutual(rules.LINK_POLICIES[self.new_links](),
                                  association.GraphCuts(self.cannot_link, self.bridge_cut))


@settings(document=False)
class SystemSettings(KeyedSettings):
    """The simulated system (§5.2): what :func:`fedclust.fedcref.client.build_system` draws
    from. Hashable: it keys the caches of the system and of each client's data.

    Attributes
    ----------
    dataset, data_dir : str
        The image dataset and its folder (``dataset``, ``data-dir``).
    num_clients : int
        Clients drawn (``num-clients``).
    seed : int
        Draws the system (``seed``).
    samples_per_cluster : int
        ``S`` as configured, 0 for automatic (``fedcref.samples-per-cluster``); see
        :attr:`samples`.
    k_min, k_max : int
        Fewest and most classes per client, ``k_max`` 0 for ``|U|/2`` (``fedcref.k-min``,
        ``fedcref.k-max``).
    overlap : float
        ``O``, the share of a cluster's samples shared with other clients (``fedcref.overlap``).
    split : str
        The dataset split drawn from (``fedcref.split``).
    k49_min_count : int
        k49: the classes kept have at least this many training samples
        (``fedcref.k49-min-count``).
    """

    checked: ClassVar[bool] = False   # tests and probes go beyond the keys' ranges

    dataset: str = common("dataset")
    data_dir: str = common("data-dir")
    num_clients: int = common("num-clients")
    seed: int = common("seed")
    samples_per_cluster: int = key_ref("samples_per_cluster")
    k_min: int = key_ref("k_min")
    k_max: int = key_ref("k_max")
    overlap: float = key_ref("overlap")
    split: str = key_ref("split")
    k49_min_count: int = key_ref("k49_min_count")

    @property
    def samples(self) -> int:
        """``S``: the configured value, or the automatic default (500; 30 for the small
        embedded 'digits')."""
        if self.samples_per_cluster > 0:
            return self.samples_per_cluster
        return 30 if self.dataset == "digits" else 500

@settings(document=False)
class ClientSettings(KeyedSettings):
    """What a client's steps use (:mod:`fedclust.fedcref.client`, the ClientApp handlers),
    and what the server's reply checks bound a client's training by.

    Attributes
    ----------
    system : SystemSettings
        The simulated system a simulated node's data comes from.
    init : str
        Initial local clustering: ``"auto"``, ``"dirty"``, ``"kmeans"`` or ``"dec"``
        (``fedcref.init``).
    dirtiness : float
        Dirty start: the chance a sample starts in a wrong cluster (``fedcref.dirtiness``).
    estimate_k : bool
        kmeans/dec start: estimate ``K_i`` by silhouette (``fedcref.estimate-k``).
    k_estimate_max : int
        Largest ``K_i`` the estimate tries (``fedcref.k-estimate-max``).
    dec_pretrain_epochs, dec_maxiter : int
        DEC start: autoencoder pretraining epochs and KL iterations
        (``fedcref.dec-pretrain-epochs``, ``fedcref.dec-maxiter``).
    ae_hidden : tuple of int
        Encoder layer sizes, the decoder mirrored (``fedcref.ae-hidden``).
    ae_init : str
        ``"keras"`` or ``"torch"`` weight initialisation (``fedcref.ae-init``).
    ae_epochs, ae_patience : int
        Epochs of a fresh cluster model, early-stopping patience (``fedcref.ae-epochs``,
        ``fedcref.ae-patience``).
    batch_size : int
        Mini-batch size of all training (``fedcref.batch-size``).
    lr : float
        Adam learning rate (``fedcref.lr``).
    min_cluster_size : int
        Clusters smaller than this get no model (``fedcref.min-cluster-size``).
    warm_start : bool
        A cluster model starts from its previous model (``fedcref.warm-start``).
    warm_epochs : int
        Epochs of a warm-started cluster model (``fedcref.warm-epochs``).
    fl_local_epochs : int
        Local epochs per community FedAvg round (``fedcref.fl-local-epochs``).
    assoc_rule : str
        ``"confident"``, ``"ratio"``, ``"eq2"`` or ``"calibrated"`` (``fedcref.assoc-rule``).
    holdout : float
        Share of each cluster held out from its own model (``fedcref.holdout``).
    theta, alpha : float
        ``θ`` and ``α`` of eq. (2) (``fedcref.theta``, ``fedcref.alpha``).
    margin, best_margin, beta : float
        The confident test's margins and level (``fedcref.margin``, ``fedcref.best-margin``,
        ``fedcref.beta``); ``margin`` and ``beta`` also confirm communities in refinement.
    best_margin_growth : float
        How the margin to the best widens with the cluster's size
        (``fedcref.best-margin-growth``).
    epsilon, ratio_quantile, lam : float
        The ratio and calibrated tests (``fedcref.epsilon``, ``fedcref.ratio-quantile``,
        ``fedcref.lambda``).
    assoc_best_per_client : bool
        A cluster accepts at most one cluster per foreign client
        (``fedcref.assoc-best-per-client``).
    refine : str
        ``"paper"``, ``"gated"`` or ``"covered"`` (``fedcref.refine``).
    wire : str
        Number format of model weights in messages (``fedcref.wire``).
    torch_threads : int
        Torch threads per client process (``fedcref.torch-threads``).
    evaluate : bool
        Send the evaluation histograms where allowed (``evaluate``).
    seed : int
        The run's seed (``seed``).
    device : str
        ``"cpu"``, ``"cuda"`` or ``"auto"`` (``fedcref.device``; resolved where the client
        runs: :meth:`torch_device`).
    """

    checked: ClassVar[bool] = False   # tests and probes go beyond the keys' ranges

    system: SystemSettings
    init: str = key_ref("init")
    dirtiness: float = key_ref("dirtiness")
    estimate_k: bool = key_ref("estimate_k")
    k_estimate_max: int = key_ref("k_estimate_max")
    dec_pretrain_epochs: int = key_ref("dec_pretrain_epochs")
    dec_maxiter: int = key_ref("dec_maxiter")
    ae_hidden: tuple[int, ...] = key_ref("ae_hidden", convert=_sizes)
    ae_init: str = key_ref("ae_init")
    ae_epochs: int = key_ref("ae_epochs")
    ae_patience: int = key_ref("ae_patience")
    batch_size: int = key_ref("batch_size")
    lr: float = key_ref("lr")
    min_cluster_size: int = key_ref("min_cluster_size")
    warm_start: bool = key_ref("warm_start")
    warm_epochs: int = key_ref("warm_epochs")
    fl_local_epochs: int = key_ref("fl_local_epochs")
    assoc_rule: str = key_ref("assoc_rule")
    holdout: float = key_ref("holdout")
    theta: float = key_ref("theta")
    alpha: float = key_ref("alpha")
    margin: float = key_ref("margin")
    best_margin: float = key_ref("best_margin")
    best_margin_growth: float = key_ref("best_margin_growth")
    beta: float = key_ref("beta")
    epsilon: float = key_ref("epsilon")
    ratio_quantile: float = key_ref("ratio_quantile")
    lam: float = key_ref("lam")
    assoc_best_per_client: bool = key_ref("assoc_best_per_client")
    refine: str = key_ref("refine")
    wire: str = key_ref("wire")
    torch_threads: int = key_ref("torch_threads")
    evaluate: bool = common("evaluate")
    seed: int = common("seed")
    device: str = key_ref("device")

    @property
    def hidden(self) -> list[int]:
        """The encoder layer sizes as a list."""
        return list(self.ae_hidden)

    @cached_property
    def association_rule(self) -> AssociationRule:
        """The association test of ``assoc_rule``, chosen once (:mod:`fedclust.fedcref.rules`);
        a cluster of fewer than ``min_cluster_size`` samples abstains."""
        from fedclust.fedcref import rules

        n = self.min_cluster_size
        return {"eq2": lambda: rules.Eq2(self.theta, self.alpha, n),
                "ratio": lambda: rules.Ratio(self.epsilon, self.ratio_quantile, n),
                "calibrated": lambda: rules.Calibrated(self.lam, self.ratio_quantile, n),
                "confident": lambda: rules.Confident(self.margin, self.best_margin, self.beta,
                                                     self.best_margin_growth, n),
                }[self.assoc_rule]()

    @cached_property
    def refinement(self) -> Refinement:
        """The refinement of ``refine``, chosen once (:mod:`fedclust.fedcref.rules`); ``covered``
        confirms its communities with ``margin`` and ``beta``."""
        from fedclust.fedcref import rules

        if self.refine == "covered":
            return rules.CoveredRefine(self.margin, self.beta)
        return rules.REFINEMENTS[self.refine]()

    def torch_device(self) -> str:
        """The torch device of ``fedcref.device`` on this machine.

        Raises
        ------
        fedclust.schema.ConfigError
            ``cuda`` asked for and torch sees no GPU (on a node: an error reply naming the
            key).
        """
        from fedclust.device import resolve_device

        return resolve_device(self.device, "fedcref.device")

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> ClientSettings:
        """The settings of a validated run config."""
        return cls(system=SystemSettings.from_config(cfg),
                   **{name: cfg[key.name] for name, key, _ in cls.bound()})


def capacity(cfg: Mapping[str, Any]) -> Capacity:
    """What every client's rows must hold: ``fedcref.k-min`` clusters (at least 2)."""
    key = FedCRefSettings.key_of("k_min")
    return Capacity("fedcref", key, max(2, int(cfg.get(key, FedCRefSettings.k_min))),
                    per_client=True)

