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
- ``evaluate.emdcfl_eval``: test accuracy of the received model, sent (with the ground-truth
  group) only when the run asks ``evaluate=true`` **and** the node allows it
  (:func:`client_apps.evaluation.allows_evaluation`: a deployed node needs node config
  ``allow-evaluation=true``); otherwise only ``num-test``. This is the final message: it
  carries the node's cluster model and (config record ``"result"``) its cluster id and the
  server's results folder; the node keeps ``model.pt``, ``predict.json`` and ``result.json``
  for its data owner (never sent).
- ``query.emdcfl_group``: ground-truth cluster (Oracle baseline; only when the node may
  evaluate, as above).
- ``query.emdcfl_pacfl``: PACFL baseline — the client's class subspaces (orthonormal columns
  from the SVD of each class's validation images; labels stay on the client).

The computations are :mod:`fedclust.emdcfl.client`'s, the messages (both ends)
:mod:`strategies.wire.emdcfl`'s. Clients never send samples or labels; only models, projected
embeddings, counts and metrics. Training, embedding and evaluation run on ``emdcfl.device``
(``cpu`` with one torch thread, ``cuda``, or ``auto``); ``cuda`` without a GPU fails with a
ConfigError (an error reply).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message

from client_apps.base import app, batched
from client_apps.common import run_config
from client_apps.data import node_data_path
from client_apps.evaluation import allows_evaluation
from strategies.wire import emdcfl as wire


def _settings(context: Context) -> tuple[Any, dict[str, Any]]:
    """This run's :class:`~fedclust.emdcfl.keys.EMDCFLSettings` and its validated config."""
    from fedclust.emdcfl.keys import EMDCFLSettings

    cfg = run_config(context)
    return EMDCFLSettings.from_config(cfg), cfg


def _device(s: Any, context: Context, cfg: dict[str, Any]) -> str:
    """Torch device of this node (:func:`fedclust.emdcfl.client.device_for`)."""
    from fedclust.emdcfl.client import device_for

    return device_for(s.device, _is_simulated(context, cfg))


def _is_simulated(context: Context, cfg: dict[str, Any]) -> bool:
    """Whether this node reads data the run config determines (a partition, or a site file of
    ``dataset='files'``): :func:`fedclust.data.sites.is_simulated`."""
    from fedclust.data.sites import is_simulated

    return is_simulated(context.node_config, cfg)


@lru_cache(maxsize=4)
def _from_file(path: str, image_shape: tuple[int, ...], n_classes: int):
    """Deployment (and ``dataset='files'``): an ``.npz`` with x_train, y_train, x_val, y_val,
    x_test, y_test (optional ``cluster`` for the evaluation path), read through the node data
    door (:func:`fedclust.emdcfl.data.read_node_file`)."""
    from fedclust.emdcfl.data import ClientSplit, read_node_file

    d = read_node_file(path, image_shape, n_classes)
    return ClientSplit(d["x_train"], d["y_train"], d["x_val"], d["y_val"], d["x_test"],
                       d["y_test"], -1, int(d["cluster"]) if "cluster" in d else -1)


def client_data(context: Context, cfg: dict[str, Any]):
    """This node's :class:`~fedclust.emdcfl.data.ClientSplit`: its ``data-path`` file, or its
    partition of the run's simulated dataset."""
    from fedclust.emdcfl.client import simulated_split
    from fedclust.emdcfl.keys import EMDCFLSettings

    s = EMDCFLSettings.from_config(cfg)
    path = node_data_path(context, cfg)
    if path is not None:
        from fedclust.emdcfl.data import file_image_shape

        spec = s.spec
        return _from_file(path, file_image_shape(spec.in_channels, spec.size),
                          spec.num_classes)
    node = context.node_config
    return simulated_split(s, int(node["partition-id"]), int(node["num-partitions"]))


def _train_seed(cfg: dict[str, Any], context: Context, rnd: int) -> int:
    """Seed of the minibatch order of round ``rnd``: from the run seed and the partition id on
    a simulated node (Flower's simulated node ids change from run to run), else the node id."""
    from fedclust.emdcfl.client import train_seed

    who = (int(context.node_config["partition-id"]) if _is_simulated(context, cfg)
           else int(context.node_id) % (2**31))
    return train_seed(int(cfg["seed"]), rnd, who)


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
    from fedclust.emdcfl import client

    s, cfg = _settings(context)
    device = _device(s, context, cfg)
    start, rnd, keygen = wire.read_train(msg.content)
    weights, loss, n = client.train(s, client_data(context, cfg), start, rnd,
                                    _train_seed(cfg, context, rnd), device)
    pub = _ensure_keys(context, cfg) if keygen else None
    return Message(wire.train_reply(weights, n, loss, pub), reply_to=msg)


@app.query("emdcfl_embed")
def embed_handler(msg: Message, context: Context) -> Message:
    from fedclust.emdcfl import client
    from fedclust.emdcfl.privacy import key_id

    s, cfg = _settings(context)
    device = _device(s, context, cfg)
    data = client_data(context, cfg)
    me = int(context.node_id)
    own, peers, pubs, models = wire.read_embed(msg.content, me)
    if KEY_STATE not in context.state.config_records:
        raise RuntimeError("no X25519 key pair: train.emdcfl_local with keygen must come first")
    keys = context.state.config_records[KEY_STATE]
    if _is_simulated(context, cfg):  # pair seeds name keys, not node ids (random per run)
        me_in_pair = key_id(bytes(keys["public"]))

        def in_pair(peer: int) -> int:
            return key_id(pubs[peer])
    else:
        me_in_pair = me

        def in_pair(peer: int) -> int:
            return peer
    src, tgt, reference = client.embed_pairs(s, data, own, peers, pubs, models(),
                                             bytes(keys["private"]), me_in_pair, in_pair,
                                             device)
    return Message(wire.embed_reply(src, tgt, reference), reply_to=msg)


@app.train("emdcfl_ifca")
def ifca_handler(msg: Message, context: Context) -> Message:
    from fedclust.emdcfl import client

    s, cfg = _settings(context)
    device = _device(s, context, cfg)
    models, rnd = wire.read_ifca(msg.content)
    weights, loss, n, choice, losses = client.ifca(s, client_data(context, cfg), models, rnd,
                                                   _train_seed(cfg, context, rnd), device)
    return Message(wire.ifca_reply(weights, n, loss, choice, losses), reply_to=msg)


@app.query("emdcfl_pacfl")
def pacfl_handler(msg: Message, context: Context) -> Message:
    """PACFL baseline: this client's class subspaces ``U`` (the first ``emdcfl.pacfl-basis``
    left singular vectors of each class's validation images, as the model sees them). The
    labels stay here; the columns are principal directions of the client's own images."""
    from fedclust.emdcfl import client

    s, cfg = _settings(context)
    return Message(wire.pacfl_reply(client.subspaces(s, client_data(context, cfg))),
                   reply_to=msg)


def keep_owner_results(msg: Message, context: Context, cfg: dict[str, Any], s: Any, data,
                       weights: list, test: tuple[float, float]) -> None:
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
                               model=OWNER_MODEL, spec=spec_dict(s.spec), cluster=cluster)
    results.write_result(folder, {
        "method": "emdcfl", "algorithm": s.algorithm, "run_id": context.run_id,
        "cluster": cluster, "num_clusters": int(rec.get("num-clusters", 0)),
        "test_accuracy": test[1], "test_loss": test[0], "num_test": int(len(data.y_test)),
        "num_train": int(len(data.y_train)), "files": [OWNER_MODEL, "predict.json"]})


@app.evaluate("emdcfl_eval")
def eval_handler(msg: Message, context: Context) -> Message:
    """Test accuracy of the received model (the node's final cluster model).

    The final model arrives here: the node also keeps its owner's results
    (:func:`keep_owner_results`). The reply carries ``num-test`` and, only when the run asks
    ``evaluate=true`` and the node allows it (:func:`client_apps.evaluation.allows_evaluation`),
    the evaluation metrics (test accuracy, ground-truth group).
    """
    from fedclust.emdcfl import client

    s, cfg = _settings(context)
    device = _device(s, context, cfg)
    data = client_data(context, cfg)
    weights = wire.read_final(msg.content)
    # the owner's own test labels: its accuracy stays on the node unless it may evaluate
    result = client.test(s, data, weights, device)
    keep_owner_results(msg, context, cfg, s, data, weights, result)
    evaluation = (client.evaluation(s, data, weights, result, device)
                  if allows_evaluation(context, cfg) else None)
    return Message(wire.final_reply(len(data.y_test), evaluation), reply_to=msg)


@app.query("emdcfl_group")
def group_handler(msg: Message, context: Context) -> Message:
    cfg = run_config(context)
    if not allows_evaluation(context, cfg):
        raise RuntimeError("ground truth is only available with evaluate=true on a node that "
                           "allows evaluation (node config allow-evaluation=true)")
    return Message(wire.group_reply(client_data(context, cfg).cluster), reply_to=msg)


# ---------------------------------------------------------------------------------------------
# batched forms: an in-process engine answers one phase of many nodes at once
# (client_apps.base.serve_batch); each computes what the handler above computes per node.

def _batching() -> Any:
    from fedclust.emdcfl import batched

    return batched.DEFAULT


def _decoded(record: Any, cache: dict[int, Any]) -> Any:
    """A model record's weights, decoded once per batch (the in-process engine shares one
    record among every message that carries the same model)."""
    key = id(record)
    if key not in cache:
        cache[key] = wire.read_model(record)
    return cache[key]


def _grouped(items: list[tuple[Message, Context]], read: Any) -> tuple[dict, list]:
    """``read(msg, context)`` of each node, grouped by its settings and device (and what
    ``read`` returns first); a node whose part raises gets its exception as its answer."""
    answers: list[Any] = [None] * len(items)
    groups: dict[tuple, list] = {}
    for k, (msg, context) in enumerate(items):
        try:
            s, cfg = _settings(context)
            key, job = read(msg, context, s, cfg)
            groups.setdefault((s, _device(s, context, cfg), key), []).append((k, cfg, job))
        except Exception as exc:
            answers[k] = exc
    return groups, answers


@batched("train.emdcfl_local")
def train_local_batch(items: list[tuple[Message, Context]]) -> list[Any]:
    from fedclust.emdcfl.batched import train_many

    def read(msg: Message, context: Context, s: Any, cfg: dict[str, Any]) -> tuple:
        start, rnd, keygen = wire.read_train(msg.content)
        return rnd, (client_data(context, cfg), start, _train_seed(cfg, context, rnd), keygen)

    groups, answers = _grouped(items, read)
    for (s, device, rnd), jobs in groups.items():
        new, losses = train_many(s, [j[0] for _, _, j in jobs], [j[1] for _, _, j in jobs],
                                 rnd, [j[2] for _, _, j in jobs], device, _batching())
        for (k, cfg, (data, _, _, keygen)), weights, loss in zip(jobs, new, losses,
                                                                 strict=True):
            msg, context = items[k]
            try:
                pub = _ensure_keys(context, cfg) if keygen else None
                answers[k] = Message(wire.train_reply(weights, len(data.y_train), loss, pub),
                                     reply_to=msg)
            except Exception as exc:
                answers[k] = exc
    return answers


@batched("train.emdcfl_ifca")
def ifca_batch(items: list[tuple[Message, Context]]) -> list[Any]:
    from fedclust.emdcfl.batched import ifca_many

    cache: dict[int, Any] = {}

    def read(msg: Message, context: Context, s: Any, cfg: dict[str, Any]) -> tuple:
        conf = msg.content.config_records["config"]
        records = tuple(msg.content.array_records[f"c:{j}"] for j in range(int(conf["k"])))
        return (int(conf["round"]), tuple(id(r) for r in records)), (
            client_data(context, cfg), _train_seed(cfg, context, int(conf["round"])),
            records)

    groups, answers = _grouped(items, read)
    for (s, device, (rnd, _)), jobs in groups.items():
        models = [_decoded(r, cache) for r in jobs[0][2][2]]
        got = ifca_many(s, [j[0] for _, _, j in jobs], models, rnd, [j[1] for _, _, j in jobs],
                        device, _batching())
        for (k, _, _), (weights, loss, n, choice, losses) in zip(jobs, got,
                                                                           strict=True):
            answers[k] = Message(wire.ifca_reply(weights, n, loss, choice, losses),
                                 reply_to=items[k][0])
    return answers


@batched("query.emdcfl_embed")
def embed_batch(items: list[tuple[Message, Context]]) -> list[Any]:
    from fedclust.emdcfl.batched import EmbedJob, SecretCache, embed_jobs
    from fedclust.emdcfl.privacy import key_id

    cache: dict[int, Any] = {}
    secrets = SecretCache()

    def read(msg: Message, context: Context, s: Any, cfg: dict[str, Any]) -> tuple:
        me = int(context.node_id)
        rd = msg.content
        ids = rd.array_records["peers"]["ids"].numpy().astype(np.uint64)
        pubs = rd.array_records["peers"]["pub"].numpy().astype(np.uint8)
        pub_of = {int(i): p.tobytes() for i, p in zip(ids.tolist(), pubs, strict=True)}
        peers = [int(i) for i in ids.tolist() if int(i) != me]
        if KEY_STATE not in context.state.config_records:
            raise RuntimeError("no X25519 key pair: train.emdcfl_local with keygen must come "
                               "first")
        keys = context.state.config_records[KEY_STATE]
        private, public = bytes(keys["private"]), bytes(keys["public"])
        simulated = _is_simulated(context, cfg)
        me_in_pair = key_id(public) if simulated else me

        def pair(peer: int) -> Any:
            return secrets.pair(private, public, me_in_pair, pub_of[peer],
                                key_id(pub_of[peer]) if simulated else peer, s)

        job = EmbedJob(client_data(context, cfg), _decoded(rd.array_records[f"m:{me}"], cache),
                       peers, [_decoded(rd.array_records[f"m:{p}"], cache) for p in peers],
                       pair)
        return None, job

    groups, answers = _grouped(items, read)
    for (s, device, _), jobs in groups.items():
        got = embed_jobs(s, [j for _, _, j in jobs], device, _batching())
        for (k, _, _), (src, tgt, reference) in zip(jobs, got, strict=True):
            answers[k] = Message(wire.embed_reply(src, tgt, reference), reply_to=items[k][0])
    return answers


@batched("evaluate.emdcfl_eval")
def eval_batch(items: list[tuple[Message, Context]]) -> list[Any]:
    from fedclust.emdcfl.batched import test_many

    def read(msg: Message, context: Context, s: Any, cfg: dict[str, Any]) -> tuple:
        return None, (client_data(context, cfg), wire.read_final(msg.content),
                      allows_evaluation(context, cfg))

    groups, answers = _grouped(items, read)
    for (s, device, _), jobs in groups.items():
        data = [j[0] for _, _, j in jobs]
        tests = test_many(s, data, [j[1] for _, _, j in jobs], device, _batching())
        bd = [n for n, (_, _, j) in enumerate(jobs)
              if j[2] and j[0].x_test_bd is not None and j[0].set_id == 0]
        bd_acc = dict(zip(bd, (r[1] for r in test_many(
            s, [data[n] for n in bd], [jobs[n][2][1] for n in bd], device, _batching(),
            "x_test_bd")), strict=True))
        for n, ((k, cfg, (d, weights, allowed)), result) in enumerate(zip(jobs, tests,
                                                                          strict=True)):
            msg, context = items[k]
            try:
                keep_owner_results(msg, context, cfg, s, d, weights, result)
                evaluation = None
                if allowed:
                    evaluation = {"test-loss": result[0], "test-acc": result[1],
                                  "cluster": d.cluster, "set": d.set_id}
                    if n in bd_acc:
                        evaluation["backdoor-acc"] = bd_acc[n]
                answers[k] = Message(wire.final_reply(len(d.y_test), evaluation), reply_to=msg)
            except Exception as exc:
                answers[k] = exc
    return answers
