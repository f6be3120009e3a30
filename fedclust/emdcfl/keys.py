"""Run-config keys of EMD-CFL (``method=emdcfl``) and its clustered-FL baselines, and the
typed settings built from them once per run (:class:`EMDCFLSettings`): the server loop, the
client steps and the node handlers read the settings, never the run config's keys."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fedclust.common import common
from fedclust.emdcfl.data import DATASETS, PALETTES, ROTATIONS
from fedclust.schema import Key, KeyedSettings, param, require, settings

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from fedclust.emdcfl.excess import Solver
    from fedclust.emdcfl.model import ModelSpec

ALGORITHMS = ("emdcfl", "oracle", "fedavg", "local", "ifca", "cfl", "pacfl")
AUTO = "auto"


def _epsilon_problem(value: str) -> str | None:
    """``emdcfl.epsilon``: ``auto`` or a finite number >= 0."""
    if value == AUTO:
        return None
    try:
        eps = float(value)
    except ValueError:
        return "neither 'auto' nor a number"
    if not math.isfinite(eps) or eps < 0:
        return "a number must be finite and >= 0"
    return None


def epsilon_value(value: Any) -> float | str:
    """The ε of a validated ``emdcfl.epsilon``: ``"auto"`` or a float."""
    return AUTO if value == AUTO else float(value)


DEVICES = ("cpu", "cuda", "auto")
RECLUSTER = ("on-join", "every-round")


def _dataset(name: str) -> str:
    """The EMD-CFL dataset of run config ``dataset`` (the project default 'blobs' maps to
    'rotdigits')."""
    return "rotdigits" if name == "blobs" else name


@settings(prefix="emdcfl.")
class EMDCFLSettings(KeyedSettings):
    """EMD-CFL (paper 001) and its baselines, typed: each field declares its run-config key
    ``emdcfl.<field>`` (``-`` for ``_``), or holds a common key. The server loop, the client
    steps and the node handlers read these, never the run config's keys."""

    algorithm: str = param("emdcfl", "emdcfl, or a baseline on the same data/model/budget: oracle "
                           "(ground-truth clusters; needs evaluate=true), fedavg, local, ifca, "
                           "cfl, pacfl", choices=ALGORITHMS)
    rotation: str = param("max", "rotation group of rotmnist/rotfmnist/rotdigits (max "
                          "0/90/180/270, min -3/-1/1/3, two -3/3/177/183, no 0/0/0/0)",
                          choices=tuple(ROTATIONS))
    clients_per_group: int = param(0, "clients per data group (rotation or Backdoor set; the "
                                   "paper: 10): num-clients must then equal it times the groups "
                                   "(4, Backdoor 3); 0 = derive the groups from num-clients "
                                   "(client i in group i % groups)", low=0)
    backdoor_colours: str = param("wide", "Backdoor MNIST palette: authors (the notebook's green "
                                  "(0.26,0.63,0.4), summer(y/39) shades, purple (149,52,235)/255) "
                                  "or wide (summer(0.5), summer(y/9), (0.5,0,0.5): a deviation, "
                                  "used by the reported rows)", choices=PALETTES)
    samples: int = param(150, "images per client (train + validation)", low=2)
    test_samples: int = param(100, "test images per client", low=1)
    val_fraction: float = param(0.1, "share of a client's images used for validation", low=0.0,
                                high=0.9, low_open=True)
    rounds: int = param(3, "global rounds (epochs) including round 0 (local training before "
                        "clustering)", low=1)
    local_epochs: int = param(1, "local epochs per round", low=1)
    round0_epochs: int = param(0, "local epochs of round 0, whose models EMD-CFL compares (every "
                               "algorithm trains round 0 with it, so budgets stay equal); 0 = "
                               "local-epochs", low=0)
    lr: float = param(0.01, "SGD learning rate (momentum 0.9, weight decay 1e-6)", low=0.0,
                      low_open=True)
    batch_size: int = param(32, "local minibatch size", low=1)
    conv1: int = param(64, "channels of the first conv layer (paper: 64)", low=1)
    conv2: int = param(128, "channels of the second conv layer (paper: 128)", low=1)
    embed_dim: int = param(128, "width of the penultimate (embedding) layer", low=2)
    epsilon: float | str = param(
        "auto", "tolerance ε: edge c→o when W(train_c,val_o) - W(train_c,val_c) < ε; a number "
        ">= 0 (the paper: 0.1), or auto: read from the run's own excesses (the clearest gap "
        "above the near-zero mode, at most the clients' median W(train_c,val_c))",
        check=_epsilon_problem, allowed_text="'auto' or a number >= 0", convert=epsilon_value,
        render=str)
    proj_ratio: float = param(0.9, "random projection dimension / embedding dimension", low=0.0,
                              high=1.0, low_open=True)
    projection: str = param("gaussian", "random projection R of each pair: gaussian (the authors': "
                            "randn / sqrt(d), rows normalised) or orthogonal (an orthonormal basis "
                            "of the same draw: keeps lengths and angles in the subspace)",
                            choices=("gaussian", "orthogonal"))
    max_samples: int = param(512, "points per embedding cloud (subsample)", low=2)
    metric: str = param("cosine", "ground cost of the EMD",
                        choices=("cosine", "euclidean", "sqeuclidean"))
    solver_name: str = param("emd", "exact EMD (ot.emd2) or entropic Sinkhorn",
                             choices=("emd", "sinkhorn"), name="solver")
    sinkhorn_reg: float = param(0.1, "Sinkhorn regularisation (relative to max cost)", low=0.0,
                                low_open=True)
    num_itermax: int = param(1_000_000, "OT solver iteration limit (non-convergence is an error)",
                             low=1000)
    embed_batch: int = param(0, "peer models per embedding message (0 = all in one message; the "
                             "paper CNN is 12.5 MiB, so 40 peers make 0.5 GiB per message). "
                             "Batches give the same distances in more, smaller messages", low=0)
    workers: int = param(2, "server processes computing the EMD matrix", low=1)
    full_matrix: bool = param(False, "solve both directions of every pair (the full EMD matrix for "
                              "heatmaps and ε sweeps above the run's ε); false skips a pair's "
                              "second direction once the first failed ε, and any direction whose "
                              "dual lower bound already fails ε (same clusters, fewer solves)")
    recluster: str = param("on-join", "when to recompute the clusters: on-join (when clients take "
                           "part for the first time; one-shot under full participation, the "
                           "paper's Alg. 1) or every-round (every round among all clients seen so "
                           "far, as the authors' partial-participation code)", choices=RECLUSTER)
    clients_per_round: int = param(0, "partial participation: clients sampled per round (0 = all)",
                                   low=0)
    num_clusters: int = param(0, "k for IFCA (0 = max(2, ground-truth clusters of the simulated "
                              "dataset))", low=0)
    cfl_eps1: float = param(0.4, "CFL EPS_1 (split when mean update norm < EPS_1)", low=0.0)
    cfl_eps2: float = param(1.6, "CFL EPS_2 (and max update norm > EPS_2)", low=0.0)
    pacfl_threshold: float = param(20.0, "PACFL: merge clusters while their average smallest "
                                   "principal angle is <= this many degrees (chosen on held-out "
                                   "seed 100 for Rotated MNIST max; Backdoor MNIST: 3)", low=0.0,
                                   low_open=True)
    pacfl_basis: int = param(3, "PACFL: left singular vectors per class that a client sends (the "
                             "PACFL code: 3)", low=1)
    device: str = param("cpu", "torch device of client training, embedding and evaluation: cpu "
                        "(one thread), cuda, or auto (cuda if torch.cuda.is_available())",
                        choices=DEVICES)
    preflight: bool = param(True, "check on the server that the base image files exist before any "
                            "message (false: a deployment whose nodes all read `data-path`)")
    dataset: str = common("dataset", "the EMD-CFL dataset (the project default blobs is "
                          "rotdigits)", convert=_dataset)
    seed: int = common("seed", "run seed: the initial model, partial participation, the "
                       "equal-size subsamples of the EMD, the simulated data and the simulated "
                       "nodes' keys and minibatch orders")
    evaluate: bool = common("evaluate", "whether the nodes report test accuracy and ground "
                            "truth")
    data_dir: str = common("data-dir", "where the simulated clients find the base image files")
    plots: bool = common("plots", "draw the EMD heatmap")

    def epochs(self, rnd: int) -> int:
        """Local epochs of round ``rnd`` (``round0-epochs`` in round 0 when set)."""
        return (self.round0_epochs or self.local_epochs) if rnd == 0 else self.local_epochs

    @property
    def spec(self) -> ModelSpec:
        """The CNN's shape: the dataset's images, the conv and embedding widths, 10 classes."""
        return _spec(self.dataset, self.conv1, self.conv2, self.embed_dim)

    @property
    def solver(self) -> Solver:
        """How each ``W`` is solved (ground cost, EMD or Sinkhorn, limits, workers, seed)."""
        from fedclust.emdcfl.excess import Solver

        return Solver(self.metric, self.solver_name, int(self.num_itermax),
                      float(self.sinkhorn_reg), int(self.workers), self.seed)


KEYS: list[Key] = EMDCFLSettings.keys()


def model_spec(cfg: Mapping[str, Any]) -> ModelSpec:
    """The CNN's shape from a run config's ``dataset`` and ``emdcfl.conv1``, ``emdcfl.conv2``,
    ``emdcfl.embed-dim`` (all a saved run config needs; raises KeyError when one is missing)."""
    return _spec(dataset_name(cfg), int(cfg["emdcfl.conv1"]), int(cfg["emdcfl.conv2"]),
                 int(cfg["emdcfl.embed-dim"]))


def _spec(dataset: str, conv1: int, conv2: int, embed_dim: int) -> ModelSpec:
    from fedclust.emdcfl.data import image_shape
    from fedclust.emdcfl.model import ModelSpec

    channels, side = image_shape(dataset)
    return ModelSpec(channels, side, int(conv1), int(conv2), int(embed_dim), 10)


def check(cfg: dict[str, Any]) -> None:
    """Cross-key rules; raise ConfigError before any work. The project default
    ``dataset=blobs`` resolves to the embedded ``rotdigits`` (what the run records)."""
    cfg["dataset"] = dataset_name(cfg)
    require(cfg["dataset"] in DATASETS + ("blobs", "files", "local"), "dataset", cfg["dataset"],
            "for method=emdcfl one of " + ", ".join(DATASETS)
            + " ('blobs', the project default, means rotdigits), 'files' (one labelled .npz "
            "per client in data-dir) or 'local' (each node's data-path)",
            "pass dataset=\"rotdigits\" (no files) or dataset=\"rotmnist\" with data-dir")
    if cfg["num-clients"] == 0:   # as many as the engine has: checked once the server knows it
        return
    require(cfg["num-clients"] >= 2, "num-clients", cfg["num-clients"], ">= 2 clients",
            "pass num-clients=8 or more")
    per_group, groups = cfg["emdcfl.clients-per-group"], num_groups(cfg)
    require(per_group == 0 or cfg["num-clients"] == per_group * groups,
            "emdcfl.clients-per-group", per_group,
            f"0 (derive from num-clients) or num-clients / {groups} groups of "
            f"{dataset_name(cfg)!r} (num-clients is {cfg['num-clients']})",
            f"pass num-clients={per_group * groups} (and as many SuperNodes), or "
            "emdcfl.clients-per-group=0")
    p = cfg["emdcfl.clients-per-round"]
    require(p <= cfg["num-clients"], "emdcfl.clients-per-round", p,
            f"0 (all) or 1..num-clients ({cfg['num-clients']})",
            "lower emdcfl.clients-per-round or raise num-clients")
    require(cfg["evaluate"] or cfg["emdcfl.algorithm"] != "oracle", "emdcfl.algorithm",
            "oracle", "oracle only with evaluate=true (it reads the ground-truth clusters)",
            "pass evaluate=true or choose another algorithm")
    require(cfg["emdcfl.max-samples"] >= 2, "emdcfl.max-samples", cfg["emdcfl.max-samples"],
            ">= 2", "pass emdcfl.max-samples=512")
    algorithm = cfg["emdcfl.algorithm"]
    require(algorithm == "emdcfl" or p in (0, cfg["num-clients"]), "emdcfl.clients-per-round",
            p, f"0 (all clients) with emdcfl.algorithm={algorithm!r}: partial participation is "
            "implemented for emdcfl only; the baselines train every client every round",
            "pass emdcfl.clients-per-round=0, or emdcfl.algorithm=\"emdcfl\"")
    require(algorithm != "ifca" or cfg["evaluate"] or cfg["emdcfl.num-clusters"] > 0,
            "emdcfl.num-clusters", 0, "k >= 1 for IFCA with evaluate=false (0 reads the "
            "ground-truth cluster count, which a deployment does not have)",
            "pass emdcfl.num-clusters=<k>, e.g. emdcfl.num-clusters=4")
    # emdcfl.device=cuda is checked where the training runs (the nodes, resolve_device): a
    # CPU-only server with GPU SuperNodes is a valid deployment.


def check_cuda() -> None:
    """Raise a :class:`ConfigError` when ``emdcfl.device="cuda"`` but torch sees no GPU."""
    from fedclust.device import check_cuda as check

    check("emdcfl.device")


def resolve_device(name: str) -> str:
    """Torch device of ``emdcfl.device``: ``auto`` → ``cuda`` if available, else ``cpu``
    (:func:`fedclust.device.resolve_device`).

    Raises
    ------
    ConfigError
        ``cuda`` requested but not available.
    """
    from fedclust.device import resolve_device as resolve

    return resolve(name, "emdcfl.device")


def num_groups(cfg: dict[str, Any]) -> int:
    """Data-generating groups of the simulated dataset (4 rotations, or 3 Backdoor sets)."""
    from fedclust.emdcfl.data import num_sets

    return num_sets(dataset_name(cfg))


def uneven_groups(cfg: dict[str, Any]) -> str | None:
    """Warning text when ``num-clients`` is not a multiple of the number of groups."""
    n, s = cfg["num-clients"], num_groups(cfg)
    if n % s == 0:
        return None
    return (f"num-clients={n} is not a multiple of the {s} data groups of "
            f"{dataset_name(cfg)!r}: groups get {n // s + 1} or {n // s} clients (client i is "
            f"in group i % {s}); pass "
            + (f"num-clients={n - n % s} or {n - n % s + s}" if n > s else f"num-clients={s}")
            + " (in simulation with as many SuperNodes) for even groups (the paper uses 10 per "
            f"group: "
            f"emdcfl.clients-per-group=10 with num-clients={10 * s})")


def dataset_name(cfg: Mapping[str, Any]) -> str:
    """The EMD-CFL dataset of a run (the project default 'blobs' maps to 'rotdigits')."""
    return _dataset(cfg["dataset"])


def site_reader(cfg: Mapping[str, Any], data_format: str, label_column: str
                ) -> Callable[[str], NDArray[np.float32]]:
    """``path -> rows``: a site file read as EMD-CFL's node reads it (its labelled image
    splits; the train images, flattened), with the image shape of the run's settings."""
    from fedclust.emdcfl.data import file_image_shape, read_node_file

    spec = EMDCFLSettings.from_config(dict(cfg)).spec      # as the node builds it
    shape = file_image_shape(spec.in_channels, spec.size)

    def read(path: str) -> NDArray[np.float32]:
        x = read_node_file(path, shape, spec.num_classes)["x_train"]
        return x.reshape(len(x), -1)
    return read
