"""ClientApp handlers of EMD-CFL (paper 001) and its clustered-FL baselines.

Actions (message type → what the client does → what it sends back):

- ``train.emdcfl_local``: trains the received model for ``emdcfl.local-epochs`` on its train
  split → the new weights and its train-set size; on request it first makes its X25519 key
  pair (private key kept in ``context.state``) and sends the **public** key. A deployed node's
  pair is fresh from the OS; a simulated node's (``partition-id``, no ``data-path``) derives from
  the run seed and its partition id, so the same seed gives the same run (not secret: for
  experiments only).
- ``query.emdcfl_embed``: receives every participant's model and public key; for each peer
  ``c`` derives the pair projection ``R`` from the X25519 shared secret (HKDF; the server never
  sees it) and sends projected, subsampled embeddings: its own train under its own model
  (``src``) and its val under ``c``'s model (``tgt``), plus the scalar reference
  ``W(train, val)`` under its own model and ``R`` (metric record ``reference``), computed here
  from the same ``src`` subsample; its own-model val embeddings never leave. One message for
  all pairs.
- ``train.emdcfl_ifca``: IFCA — picks the cluster model with the lowest validation loss, trains
  it → weights, choice.
- ``evaluate.emdcfl_eval``: test accuracy of the received model (ground truth returned only
  when ``evaluate=true``). This is the final message: it carries the node's cluster model and
  (config record ``"result"``) its cluster id and the server's results folder; the node keeps
  ``model.pt``, ``predict.json`` and ``result.json`` for its data owner (never sent).
- ``query.emdcfl_group``: ground-truth cluster (Oracle baseline; only when ``evaluate=true``).
- ``query.emdcfl_pacfl``: PACFL baseline — the client's class subspaces (orthonormal columns
  from the SVD of each class's validation images; labels stay on the client).

Clients never send samples or labels; only models, projected embeddings, counts and metrics.
Training, embedding and evaluation run on ``emdcfl.device`` (``cpu`` with one torch thread,
``cuda``, or ``auto``); ``cuda`` without a GPU fails with a ConfigError (an error reply).
"""

from __future__ import annotations

from functools import lru_cache
from itertools import chain
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord

from client_apps.base import app
from client_apps.common import reply, run_config
from client_apps.data import node_data_path

SPLIT_KEYS = ("dataset", "emdcfl.rotation", "emdcfl.samples", "emdcfl.test-samples",
              "emdcfl.val-fraction", "seed", "data-dir", "emdcfl.backdoor-colours")


def _device(cfg: dict[str, Any], context: Context | None = None) -> str:
    """Torch device of this node (``emdcfl.device``); on the CPU, torch runs one thread.

    On a GPU, a simulated node (``context`` given, node config with ``partition-id``) also
    turns cuDNN's autotuner off and asks for its deterministic kernels (reproducible runs).

    Raises a ConfigError naming the key when ``cuda`` is requested but unavailable (the
    reply is then an error reply and the server drops the node with that reason).
    """
    from fedclust.emdcfl.keys import resolve_device

    device = resolve_device(cfg["emdcfl.device"])
    if device == "cpu":
        import torch

        # 2 threads thrash on a shared 2-core box; one thread also fixes the reduction order
        torch.set_num_threads(1)
    elif context is not None and _is_simulated(context, cfg):
        import torch

        torch.backends.cudnn.benchmark = False
        torch.backends.cudnn.deterministic = True
    return device


def _is_simulated(context: Context, cfg: dict[str, Any]) -> bool:
    """Whether this node reads data the run config determines (a partition, or a site file of
    ``dataset='files'``): :func:`fedclust.data.sites.is_simulated`."""
    from fedclust.data.sites import is_simulated

    return is_simulated(context.node_config, cfg)


@lru_cache(maxsize=64)
def _simulated(items: tuple[tuple[str, Any], ...], partition: int, num_parts: int):
    from fedclust.emdcfl.data import client_split
    from fedclust.emdcfl.keys import dataset_name

    cfg = dict(items)
    return client_split(dataset_name(cfg), cfg["emdcfl.rotation"], partition, num_parts,
                        cfg["emdcfl.samples"], cfg["emdcfl.test-samples"],
                        cfg["emdcfl.val-fraction"], cfg["seed"], cfg["data-dir"],
                        cfg["emdcfl.backdoor-colours"])


SPLITS = {"x_train": "y_train", "x_val": "y_val", "x_test": "y_test"}


@lru_cache(maxsize=4)
def _from_file(path: str, image_shape: tuple[int, ...], n_classes: int):
    """Deployment (and ``dataset='files'``): an ``.npz`` with x_train, y_train, x_val, y_val,
    x_test, y_test (optional ``cluster`` for the evaluation path), read through the node data
    door (:func:`fedclust.data.local.load_image_arrays`): images of ``image_shape`` with
    pixel values 0..255, labels ``0..n_classes-1``, size limits, data-free errors."""
    from fedclust.data.local import load_image_arrays
    from fedclust.emdcfl.data import ClientSplit

    d = load_image_arrays(path, SPLITS, [image_shape], n_classes, optional=("cluster",))
    return ClientSplit(d["x_train"], d["y_train"], d["x_val"], d["y_val"], d["x_test"],
                       d["y_test"], -1, int(d["cluster"]) if "cluster" in d else -1)


def client_data(context: Context, cfg: dict[str, Any]):
    path = node_data_path(context, cfg)
    if path is not None:
        spec = model_spec(cfg)
        shape = ((spec.size, spec.size) if spec.in_channels == 1 else
                 (spec.size, spec.size, spec.in_channels))
        return _from_file(path, shape, spec.num_classes)
    node = context.node_config
    return _simulated(tuple((k, cfg[k]) for k in SPLIT_KEYS), int(node["partition-id"]),
                      int(node["num-partitions"]))


def model_spec(cfg: dict[str, Any]):
    from fedclust.emdcfl.model import spec_from_config

    return spec_from_config(cfg)


def weights_from_record(record) -> list[np.ndarray]:
    """The model layers of an ArrayRecord (torch is imported on first use, not with the app)."""
    from fedclust.emdcfl.model import weights_from_record as read

    return read(record)


def _train_seed(cfg: dict[str, Any], context: Context, rnd: int) -> int:
    """Seed of the minibatch order of round ``rnd``: from the run seed and the partition id on
    a simulated node (Flower's simulated node ids change from run to run), else the node id."""
    who = (int(context.node_config["partition-id"]) if _is_simulated(context, cfg)
           else int(context.node_id) % (2**31))
    return int(np.random.SeedSequence([cfg["seed"], rnd, who]).generate_state(1)[0])


def _train(cfg, context, weights, rnd, device="cpu"):
    from fedclust.emdcfl.model import train_local

    data = client_data(context, cfg)
    epochs = (cfg["emdcfl.round0-epochs"] or cfg["emdcfl.local-epochs"]) if rnd == 0 \
        else cfg["emdcfl.local-epochs"]
    return train_local(model_spec(cfg), weights, data.x_train, data.y_train, epochs,
                       cfg["emdcfl.lr"], cfg["emdcfl.batch-size"],
                       _train_seed(cfg, context, rnd), device=device), len(data.y_train)


KEY_STATE = "emdcfl_keys"


def _ensure_keys(context: Context, cfg: dict[str, Any]) -> bytes:
    """Public key of this node's per-run X25519 pair (created on first use): fresh from the OS
    on a deployed node, derived from the run seed and partition id on a simulated one
    (:func:`fedclust.emdcfl.privacy.node_keypair`; reproducible, not secret)."""
    from fedclust.emdcfl.privacy import node_keypair

    if KEY_STATE not in context.state.config_records:
        private, public = node_keypair(context.node_config, int(cfg["seed"]), cfg)
        context.state[KEY_STATE] = ConfigRecord({"private": private, "public": public})
    return bytes(context.state.config_records[KEY_STATE]["public"])


@app.train("emdcfl_local")
def train_local_handler(msg: Message, context: Context) -> Message:
    cfg = run_config(context)
    device = _device(cfg, context)
    conf = msg.content.config_records["config"]
    start = weights_from_record(msg.content.array_records["model"])
    (weights, loss), n = _train(cfg, context, start, int(conf["round"]), device)
    arrays = {"model": {str(i): w for i, w in enumerate(weights)}}
    if bool(conf.get("keygen", False)):
        arrays["pub"] = {"key": np.frombuffer(_ensure_keys(context, cfg), dtype=np.uint8)}
    return reply(msg, arrays=arrays, metrics={"num-examples": n, "train-loss": loss})


@app.query("emdcfl_embed")
def embed_handler(msg: Message, context: Context) -> Message:
    from fedclust.emdcfl.excess import Solver, reference_distance
    from fedclust.emdcfl.model import embed, embed_many
    from fedclust.emdcfl.privacy import PairContext

    cfg = run_config(context)
    device = _device(cfg, context)
    spec, data = model_spec(cfg), client_data(context, cfg)
    peers = msg.content.array_records["peers"]
    ids = peers["ids"].numpy().astype(np.uint64)
    pubs = peers["pub"].numpy().astype(np.uint8)
    me = int(context.node_id)
    if KEY_STATE not in context.state.config_records:
        raise RuntimeError("no X25519 key pair: train.emdcfl_local with keygen must come first")
    private = bytes(context.state.config_records[KEY_STATE]["private"])
    simulated = _is_simulated(context, cfg)
    if simulated:    # pair seeds name keys, not node ids (random in every simulation run)
        from fedclust.emdcfl.privacy import key_id

        me_in_pair = key_id(bytes(context.state.config_records[KEY_STATE]["public"]))
    else:
        me_in_pair = me
    own = weights_from_record(msg.content.array_records[f"m:{me}"])
    e_train = embed(spec, own, data.x_train, device=device)
    others = [int(i) for i in ids.tolist() if int(i) != me]
    pub_of = {int(i): p.tobytes() for i, p in zip(ids.tolist(), pubs)}
    # own val under every model (own first): images converted once, no module per peer,
    # peer models deserialised one at a time
    models = chain([own], (weights_from_record(msg.content.array_records[f"m:{peer}"])
                           for peer in others))
    e_vals = embed_many(spec, models, data.x_val, device=device)
    e_val = e_vals[0]
    cap, ratio = cfg["emdcfl.max-samples"], cfg["emdcfl.proj-ratio"]
    solver = Solver.from_config(cfg)
    src, tgt, reference = {}, {}, {}
    for peer, e_peer in zip(others, e_vals[1:]):
        peer_in_pair = key_id(pub_of[peer]) if simulated else peer
        pair = PairContext(private, me_in_pair, peer_in_pair, pub_of[peer], spec.embed_dim,
                           ratio, cfg["emdcfl.projection"])
        src[str(peer)] = pair.project(e_train, cap)        # W(train_me, ·) source cloud
        own_val = pair.project(e_val, cap)                 # never sent
        tgt[str(peer)] = pair.project(e_peer, cap)         # val_me under peer's model
        # the paper's reference W(train_me, val_me), under R of this pair, from the same
        # source subsample the server gets: only the scalar leaves the node
        reference[str(peer)] = reference_distance(src[str(peer)], own_val, solver)
    out = reply(msg, arrays={"src": src, "tgt": tgt}, metrics={"num-pairs": len(src)})
    out.content["reference"] = MetricRecord(reference)
    return out


@app.train("emdcfl_ifca")
def ifca_handler(msg: Message, context: Context) -> Message:
    from fedclust.emdcfl.model import evaluate

    cfg = run_config(context)
    device = _device(cfg, context)
    spec, data = model_spec(cfg), client_data(context, cfg)
    conf = msg.content.config_records["config"]
    k = int(conf["k"])
    models = [weights_from_record(msg.content.array_records[f"c:{j}"]) for j in range(k)]
    losses = np.array([evaluate(spec, w, data.x_val, data.y_val, device=device)[0]
                       for w in models])
    choice = int(np.argmin(losses))
    (weights, loss), n = _train(cfg, context, models[choice], int(conf["round"]), device)
    return reply(msg, arrays={"model": {str(i): w for i, w in enumerate(weights)}},
                 metrics={"num-examples": n, "train-loss": loss, "choice": choice,
                          "val-losses": losses.tolist()})


@app.query("emdcfl_pacfl")
def pacfl_handler(msg: Message, context: Context) -> Message:
    """PACFL baseline: this client's class subspaces ``U`` (the first ``emdcfl.pacfl-basis``
    left singular vectors of each class's validation images, as the model sees them). The
    labels stay here; the columns are principal directions of the client's own images."""
    from fedclust.emdcfl.model import to_tensor
    from fedclust.emdcfl.pacfl import class_subspaces

    cfg = run_config(context)
    data = client_data(context, cfg)
    u = class_subspaces(to_tensor(data.x_val).numpy(), data.y_val, cfg["emdcfl.pacfl-basis"])
    return reply(msg, arrays={"subspace": {"u": u}})


def keep_owner_results(msg: Message, context: Context, cfg: dict[str, Any], spec, data,
                       weights: list[np.ndarray], test: tuple[float, float]) -> None:
    """Write this node's results for its data owner (never sent): ``model.pt`` (its cluster's
    final model, a torch ``state_dict``), ``predict.json`` (so that ``fedclust predict`` can use
    the folder) and ``result.json`` last. Nothing happens when the message names no cluster
    (an older server) or no owner folder can be found."""
    from client_apps import results
    from fedclust.emdcfl.predict import OWNER_MODEL, SPEC_KEYS, save_model, spec_dict

    rec = msg.content.config_records.get(results.RESULT_RECORD)
    if rec is None or "cluster" not in rec:
        return
    folder = results.owner_dir(msg, context)
    if folder is None:
        return
    cluster = int(rec["cluster"])
    save_model(folder / OWNER_MODEL, weights)
    results.write_predict_info(folder, "emdcfl", {k: cfg[k] for k in SPEC_KEYS},
                          model=OWNER_MODEL, spec=spec_dict(spec), cluster=cluster)
    results.write_result(folder, {
        "method": "emdcfl", "algorithm": cfg["emdcfl.algorithm"], "run_id": context.run_id,
        "cluster": cluster, "num_clusters": int(rec.get("num-clusters", 0)),
        "test_accuracy": test[1], "test_loss": test[0], "num_test": int(len(data.y_test)),
        "num_train": int(len(data.y_train)), "files": [OWNER_MODEL, "predict.json"]})


@app.evaluate("emdcfl_eval")
def eval_handler(msg: Message, context: Context) -> Message:
    """Test accuracy of the received model (the node's final cluster model).

    The final model arrives here: the node also keeps its owner's results
    (:func:`keep_owner_results`); the reply carries the same metrics as before (with
    ``evaluate=false`` only ``num-test``).
    """
    from fedclust.emdcfl.model import evaluate

    cfg = run_config(context)
    device = _device(cfg, context)
    spec, data = model_spec(cfg), client_data(context, cfg)
    weights = weights_from_record(msg.content.array_records["model"])
    metrics: dict[str, Any] = {"num-test": len(data.y_test)}
    # the owner's own test labels: its accuracy stays on the node unless evaluate=true
    loss, acc = evaluate(spec, weights, data.x_test, data.y_test, device=device)
    keep_owner_results(msg, context, cfg, spec, data, weights, (loss, acc))
    if cfg["evaluate"]:
        metrics.update({"test-loss": loss, "test-acc": acc, "cluster": data.cluster,
                        "set": data.set_id})
        if data.x_test_bd is not None and data.set_id == 0:
            metrics["backdoor-acc"] = evaluate(spec, weights, data.x_test_bd, data.y_test,
                                               device=device)[1]
    return reply(msg, metrics=metrics)


@app.query("emdcfl_group")
def group_handler(msg: Message, context: Context) -> Message:
    cfg = run_config(context)
    if not cfg["evaluate"]:
        raise RuntimeError("ground truth is only available with evaluate=true")
    return reply(msg, metrics={"cluster": client_data(context, cfg).cluster})
