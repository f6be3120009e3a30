"""Run-config keys of FedCRef (paper 000), prefix ``fedcref.``, and the typed settings built
from them: :class:`Settings` (the server's loop), :class:`ClientSettings` (the client steps)
and :class:`SystemSettings` (the simulated system of §5.2)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fedclust.data.capacity import Capacity
from fedclust.schema import Key, require

IMAGE_DATASETS = ("digits", "mnist", "fashion-mnist", "emnist-digits", "kmnist", "k49", "local",
                  "files")


def _hidden(value: str) -> str | None:
    try:
        sizes = [int(v) for v in value.split(",")]
    except ValueError:
        return "expected comma-separated ints, e.g. '100,64,32'"
    return None if sizes and min(sizes) > 0 else "expected positive layer sizes"


KEYS: list[Key] = [
    # system generator (§5.2)
    Key("fedcref.samples-per-cluster", int, 0, "S, samples per client cluster (0 = auto: 500, "
        "or 30 for the small embedded 'digits')", low=0),
    Key("fedcref.k-min", int, 2, "smallest K_i (classes per client)", low=1),
    Key("fedcref.k-max", int, 0, "largest K_i (0 = |U|/2)", low=0),
    Key("fedcref.overlap", float, 0.0, "O, fraction of a cluster's samples shared with the other "
        "clients' clusters of the same class", low=0.0, high=1.0, high_open=True),
    Key("fedcref.split", str, "train", "dataset split the system is drawn from",
        choices=("train", "test", "all")),
    Key("fedcref.k49-min-count", int, 6000, "k49: keep classes with at least this many "
        "training samples (paper: 31 classes)", low=0),
    # initial clustering
    Key("fedcref.init", str, "auto", "initial local clustering: 'auto' = 'dirty' on simulated "
        "nodes (the paper's protocol, built from the true classes) and 'kmeans' on deployed "
        "nodes (node config data-path; label-free, K_i from num-clusters or the silhouette "
        "estimate); 'dirty' on a deployed node needs evaluate=true and node config "
        "allow-evaluation=true",
        choices=("auto", "dirty", "kmeans", "dec")),
    Key("fedcref.dirtiness", float, 0.3, "dirty init: probability a sample starts in a wrong "
        "cluster (0 = oracle split)", low=0.0, high=1.0),
    Key("fedcref.estimate-k", bool, False, "kmeans/dec init: estimate K_i by silhouette over "
        "2..fedcref.k-estimate-max instead of using the given K_i"),
    Key("fedcref.k-estimate-max", int, 8, "largest K_i tried by the silhouette estimate", low=2),
    Key("fedcref.dec-pretrain-epochs", int, 50, "DEC autoencoder pretraining epochs", low=1),
    Key("fedcref.dec-maxiter", int, 2000, "DEC KL-refinement iterations", low=0),
    # algorithm (§4, defaults of §5.2)
    Key("fedcref.alpha", float, 0.75, "alpha: required Pr{D <= theta} (the 75th percentile)",
        low=0.0, high=1.0, low_open=True),
    Key("fedcref.theta", float, 0.2, "theta: association threshold on the normalised error gap",
        low=0.0, high=1.0),
    Key("fedcref.assoc-rule", str, "confident", "association test: 'confident' (not in the "
        "paper: sign tests at level beta on the cluster's own samples that the foreign model "
        "is within fedcref.margin of the own model on held-out samples, within "
        "fedcref.best-margin of the best foreign model, and better than each of the "
        "client's other cluster models; abstains when the samples are too few to tell), "
        "'ratio' (not in the paper: the ratio-quantile of log e_foreign - log e_own over the "
        "cluster's held-out samples <= epsilon), 'eq2' (the paper: Pr{normalised error gap "
        "<= theta} >= alpha; theta depends on the dataset) or 'calibrated' (not in the "
        "paper, not recommended: the same statistic <= lambda times the statistic of the "
        "client's own closest other cluster model)",
        choices=("eq2", "ratio", "calibrated", "confident")),
    Key("fedcref.beta", float, 0.02, "assoc-rule=confident: level of each of its sign tests "
        "(the chance that one passes on evidence no stronger than a coin's)",
        low=0.0, high=1.0, low_open=True, high_open=True),
    Key("fedcref.margin", float, 0.3, "assoc-rule=confident: a foreign model must be within "
        "a factor e^margin of the own model's error on most held-out samples", low=0.0),
    Key("fedcref.best-margin", float, 0.1, "assoc-rule=confident: a foreign model must be "
        "within a factor e^best-margin of the best foreign model's error on most of the "
        "cluster's samples", low=0.0),
    Key("fedcref.best-margin-growth", float, 0.3, "assoc-rule=confident: a cluster of n "
        "samples uses best-margin * max(1, n/60)^best-margin-growth (0 = best-margin at every "
        "size)", low=0.0),
    Key("fedcref.wire", str, "int8-delta", "number format of model weights in messages: "
        "'float32', 'float16', 'int8' (8-bit weights with one scale per output unit: about "
        "a quarter of the bytes) or 'int8-delta' (the same 8-bit weights, sent as the "
        "compressed difference of their codes from a model both ends hold: the model's seeded "
        "initialisation or the previous FedAvg round's model; about half to a third of "
        "int8's bytes)", choices=("int8-delta", "float32", "float16", "int8")),
    Key("fedcref.cannot-link", bool, True, "cut the cluster graph so that no community holds "
        "two clusters of one client (a minimum edge cut between them; not in the paper)"),
    Key("fedcref.bridge-cut", int, 3, "cut a link that alone joins two groups of at least "
        "this many clusters each (a bridge of the cluster graph: one mutual acceptance between "
        "two groups of one kind each; 0 = off; not in the paper)", low=0),
    Key("fedcref.new-links", str, "first", "which iterations may link clusters: 'every' (the "
        "paper), 'first' (later iterations test the first iteration's links again and keep "
        "or drop them, never add one: refined clusters can drift into mixtures of groups), "
        "'once' (later iterations keep the first iteration's links without a new "
        "cross-evaluation) or 'partners' (as 'first', but a client receives only the models "
        "of its clusters' first-iteration partners, and the best foreign model is the best "
        "of those); 'first', 'once' and 'partners' are not in the paper",
        choices=("every", "first", "once", "partners")),
    Key("fedcref.refine", str, "covered", "refinement (Algorithm 2): 'paper' (every sample may "
        "go to any community model), 'gated' (a sample is offered only the communities of "
        "the cluster whose own model reconstructs it best) or 'covered' (a sample whose best "
        "own model belongs to a community the client confirms is reassigned among the "
        "client's confirmed community models; any other sample keeps its own models)",
        choices=("paper", "gated", "covered")),
    Key("fedcref.lambda", float, 0.9, "assoc-rule=calibrated: accept a foreign model closer "
        "to the own model than this fraction of the way to the client's own closest other "
        "cluster model (log error ratio over the held-out samples)", low=0.0, high=1.0,
        low_open=True, high_open=True),
    Key("fedcref.epsilon", float, 0.15, "epsilon of assoc-rule=ratio: accept a foreign model "
        "within a factor e^epsilon of the own model's held-out error", low=0.0),
    Key("fedcref.ratio-quantile", float, 0.5, "quantile of the log error ratio that "
        "assoc-rule=ratio and calibrated use (0.5 = median)", low=0.0, high=1.0,
        low_open=True, high_open=True),
    Key("fedcref.holdout", float, 0.15, "assoc-rule=ratio or calibrated: share of each "
        "cluster held out "
        "from its own autoencoder's training, on which the ratio is measured", low=0.0,
        high=1.0, low_open=True, high_open=True),
    Key("fedcref.tau", float, 0.8, "tau: a client whose labels agree (ACC) >= tau with the "
        "previous iteration becomes inactive", low=0.0, high=1.0),
    Key("fedcref.association", str, "mutual", "cluster graph: 'mutual' (the algorithm), "
        "'perfect' (baseline: graph from ground truth), 'none' (local-only baseline)",
        choices=("mutual", "perfect", "none")),
    Key("fedcref.assoc-best-per-client", bool, True, "deviation (false = paper): a cluster "
        "accepts at most one cluster per foreign client, its best-scoring one (the reference "
        "code kept the first match per client pair)"),
    Key("fedcref.max-iterations", int, 10, "maximum FedCRef iterations", low=1),
    Key("fedcref.stop-window", int, 3, "stop when communities and isolated counts change by at "
        "most stop-change for this many consecutive iterations", low=1),
    Key("fedcref.stop-change", float, 0.1, "relative change regarded as 'unchanged'", low=0.0),
    Key("fedcref.fl-rounds", int, 15, "FedAvg rounds per community per iteration", low=1),
    Key("fedcref.reuse-communities", bool, False, "keep a community's model, untrained, "
        "while its member clusters and their clients' labels are unchanged since it was "
        "trained (not in the paper: it retrains every community every iteration)"),
    Key("fedcref.warm-start", bool, False, "start a community from the previous "
        "iteration's community model with the most members in common (or, if none, from its "
        "first member's cluster model), trained for warm-rounds FedAvg rounds, and a local "
        "cluster model from the cluster's previous model, trained for warm-epochs epochs (not "
        "in the paper: it starts every model afresh)"),
    Key("fedcref.warm-rounds", int, 5, "warm-start: FedAvg rounds of a warm-started "
        "community (a fresh one gets fl-rounds)", low=1),
    Key("fedcref.warm-epochs", int, 5, "warm-start: epochs of a local cluster model that "
        "starts from the cluster's previous model (a fresh one gets ae-epochs; not with "
        "assoc-rule=ratio or calibrated, whose held-out samples the previous model has seen)",
        low=1),
    Key("fedcref.fl-local-epochs", int, 3, "local epochs per FedAvg round (not in the paper; "
        "the reference code used 2 then 7; 3 measured better than 1, docs/fedcref.md)", low=1),
    Key("fedcref.ae-hidden", str, "100,64,32", "autoencoder encoder sizes (decoder mirrored)",
        check=_hidden),
    Key("fedcref.ae-epochs", int, 20, "epochs of local cluster autoencoder training", low=1),
    Key("fedcref.ae-patience", int, 4, "early stopping patience on the epoch loss (0 = off)",
        low=0),
    Key("fedcref.ae-init", str, "keras", "autoencoder weight init: 'keras' (glorot-uniform "
        "weights, zero biases; the reference code) or 'torch' (nn.Linear default)",
        choices=("keras", "torch")),
    Key("fedcref.batch-size", int, 32, "mini-batch size of all autoencoder training (reference "
        "code: Keras default 32)", low=1),
    Key("fedcref.lr", float, 1e-3, "Adam learning rate", low=0.0, low_open=True),
    Key("fedcref.min-cluster-size", int, 5, "clusters smaller than this get no model", low=1),
    Key("fedcref.torch-threads", int, 1, "torch threads per client process (1 is fastest on a "
        "busy 2-core machine)", low=1),
    Key("fedcref.device", str, "cpu", "torch device of the clients' autoencoder training and "
        "reconstruction errors: cpu, cuda, or auto (cuda if torch.cuda.is_available()); "
        "checked on each node", choices=("cpu", "cuda", "auto")),
]


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

@dataclass(frozen=True)
class Settings:
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

    seed: int = 0
    max_iterations: int = 10
    tau: float = 0.8
    fl_rounds: int = 15
    stop_window: int = 3
    stop_change: float = 0.1
    association: str = "mutual"
    ae_init: str = "keras"
    evaluate: bool = False
    cannot_link: bool = True
    bridge_cut: int = 3
    new_links: str = "first"
    reuse_communities: bool = False
    warm_start: bool = False
    warm_rounds: int = 5

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> Settings:
        """The settings of a validated run config."""
        return cls(seed=int(cfg["seed"]), max_iterations=int(cfg["fedcref.max-iterations"]),
                   tau=float(cfg["fedcref.tau"]), fl_rounds=int(cfg["fedcref.fl-rounds"]),
                   stop_window=int(cfg["fedcref.stop-window"]),
                   stop_change=float(cfg["fedcref.stop-change"]),
                   association=str(cfg["fedcref.association"]),
                   ae_init=str(cfg["fedcref.ae-init"]), evaluate=bool(cfg["evaluate"]),
                   cannot_link=bool(cfg["fedcref.cannot-link"]),
                   bridge_cut=int(cfg["fedcref.bridge-cut"]),
                   new_links=str(cfg["fedcref.new-links"]),
                   reuse_communities=bool(cfg["fedcref.reuse-communities"]),
                   warm_start=bool(cfg["fedcref.warm-start"]),
                   warm_rounds=int(cfg["fedcref.warm-rounds"]))


@dataclass(frozen=True)
class SystemSettings:
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

    dataset: str
    data_dir: str
    num_clients: int
    seed: int
    samples_per_cluster: int
    k_min: int
    k_max: int
    overlap: float
    split: str
    k49_min_count: int

    @property
    def samples(self) -> int:
        """``S``: the configured value, or the automatic default (500; 30 for the small
        embedded 'digits')."""
        if self.samples_per_cluster > 0:
            return self.samples_per_cluster
        return 30 if self.dataset == "digits" else 500

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> SystemSettings:
        """The settings of a validated run config."""
        return cls(dataset=str(cfg["dataset"]), data_dir=str(cfg["data-dir"]),
                   num_clients=int(cfg["num-clients"]), seed=int(cfg["seed"]),
                   samples_per_cluster=int(cfg["fedcref.samples-per-cluster"]),
                   k_min=int(cfg["fedcref.k-min"]), k_max=int(cfg["fedcref.k-max"]),
                   overlap=float(cfg["fedcref.overlap"]), split=str(cfg["fedcref.split"]),
                   k49_min_count=int(cfg["fedcref.k49-min-count"]))


@dataclass(frozen=True)
class ClientSettings:
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

    system: SystemSettings
    init: str
    dirtiness: float
    estimate_k: bool
    k_estimate_max: int
    dec_pretrain_epochs: int
    dec_maxiter: int
    ae_hidden: tuple[int, ...]
    ae_init: str
    ae_epochs: int
    ae_patience: int
    batch_size: int
    lr: float
    min_cluster_size: int
    warm_start: bool
    warm_epochs: int
    fl_local_epochs: int
    assoc_rule: str
    holdout: float
    theta: float
    alpha: float
    margin: float
    best_margin: float
    best_margin_growth: float
    beta: float
    epsilon: float
    ratio_quantile: float
    lam: float
    assoc_best_per_client: bool
    refine: str
    wire: str
    torch_threads: int
    evaluate: bool
    seed: int
    device: str = "cpu"

    @property
    def hidden(self) -> list[int]:
        """The encoder layer sizes as a list."""
        return list(self.ae_hidden)

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
        return cls(system=SystemSettings.from_config(cfg), init=str(cfg["fedcref.init"]),
                   dirtiness=float(cfg["fedcref.dirtiness"]),
                   estimate_k=bool(cfg["fedcref.estimate-k"]),
                   k_estimate_max=int(cfg["fedcref.k-estimate-max"]),
                   dec_pretrain_epochs=int(cfg["fedcref.dec-pretrain-epochs"]),
                   dec_maxiter=int(cfg["fedcref.dec-maxiter"]),
                   ae_hidden=tuple(int(v) for v in str(cfg["fedcref.ae-hidden"]).split(",")),
                   ae_init=str(cfg["fedcref.ae-init"]), ae_epochs=int(cfg["fedcref.ae-epochs"]),
                   ae_patience=int(cfg["fedcref.ae-patience"]),
                   batch_size=int(cfg["fedcref.batch-size"]), lr=float(cfg["fedcref.lr"]),
                   min_cluster_size=int(cfg["fedcref.min-cluster-size"]),
                   warm_start=bool(cfg["fedcref.warm-start"]),
                   warm_epochs=int(cfg["fedcref.warm-epochs"]),
                   fl_local_epochs=int(cfg["fedcref.fl-local-epochs"]),
                   assoc_rule=str(cfg["fedcref.assoc-rule"]),
                   holdout=float(cfg["fedcref.holdout"]), theta=float(cfg["fedcref.theta"]),
                   alpha=float(cfg["fedcref.alpha"]), margin=float(cfg["fedcref.margin"]),
                   best_margin=float(cfg["fedcref.best-margin"]),
                   best_margin_growth=float(cfg["fedcref.best-margin-growth"]),
                   beta=float(cfg["fedcref.beta"]), epsilon=float(cfg["fedcref.epsilon"]),
                   ratio_quantile=float(cfg["fedcref.ratio-quantile"]),
                   lam=float(cfg["fedcref.lambda"]),
                   assoc_best_per_client=bool(cfg["fedcref.assoc-best-per-client"]),
                   refine=str(cfg["fedcref.refine"]), wire=str(cfg["fedcref.wire"]),
                   torch_threads=int(cfg["fedcref.torch-threads"]),
                   evaluate=bool(cfg["evaluate"]), seed=int(cfg["seed"]),
                   device=str(cfg["fedcref.device"]))


def capacity(cfg: Mapping[str, Any]) -> Capacity:
    """What every client's rows must hold: ``fedcref.k-min`` clusters (at least 2)."""
    return Capacity("fedcref", "fedcref.k-min", max(2, int(cfg.get("fedcref.k-min", 2))),
                    per_client=True)
