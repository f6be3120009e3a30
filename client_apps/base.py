"""The ClientApp object of fedclust, its mods and the node question.

Handlers of each method live in ``client_apps/<method>_handlers.py`` and register named actions
on :data:`app` (``@app.query("fcm_sums")`` handles message type ``"query.fcm_sums"``);
:mod:`client_apps.app` (what Flower loads) imports them all.

:func:`engine_mod` runs before every handler and makes a simulated node look like a deployed
one where the run asks for it, so that every method has one data path:

- ``num-clients = 0`` (as many as the engine has): a simulated node sees ``num-clients`` =
  its ``num-partitions``;
- ``dataset = "files"``: simulated client ``i`` gets node config ``data-path`` = the ``i``-th
  site file of ``data-dir`` (and ``data-format``/``label-column`` from ``files.*``), read by
  the loader a deployed node uses.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from flwr.app import ConfigRecord, Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

from fedclust.common import setting
from fedclust.errors import FedclustError

# The record of a message that carries the server's run config, and its two keys: the config
# as JSON text (the first message of a run to this node) and the digest that names it (every
# message). The same names as strategies.common, which sends them.
CONFIG_RECORD = "fedclust.run-config"
CONFIG_JSON = "json"
CONFIG_DIGEST = "digest"


class RunConfigMissing(FedclustError, RuntimeError):
    """A message names a run config (by its digest) that this node does not hold: the server
    sends it again with the next message (the message says nothing of the node's data)."""

    data_free = True


class RunConfig(dict):
    """A run config taken from the server's messages: read-only, named by ``key`` (the digest
    of the server's config, and the node's own count where ``num-clients = 0`` took it), so
    that :func:`client_apps.common.run_config` validates it once per process."""

    def __init__(self, values: Mapping[str, Any], key: str) -> None:
        super().__init__(values)
        self.key = key

    def __reduce__(self) -> tuple[Any, ...]:     # copies and pickles build it, not mutate it
        return (type(self), (dict(self), self.key))

    def _read_only(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("the run config a node took from the server is read-only: copy it "
                        "(dict(cfg)) to change it")

    __setitem__ = __delitem__ = __ior__ = _read_only       # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = _read_only  # type: ignore[assignment]


# The configs this process took from the server, by key: a node process serves many messages
# (the in-process grid, a Ray actor), and every message of a run names the same config.
_CONFIGS: OrderedDict[str, RunConfig] = OrderedDict()
_KEEP = 16


def _remember(cfg: RunConfig) -> RunConfig:
    _CONFIGS[cfg.key] = cfg
    _CONFIGS.move_to_end(cfg.key)
    while len(_CONFIGS) > _KEEP:
        _CONFIGS.popitem(last=False)
    return cfg


def _parse(text: str) -> RunConfig:
    """The config of a JSON text, named by the digest the node computes itself."""
    digest = hashlib.sha256(text.encode()).hexdigest()[:32]
    known = _CONFIGS.get(digest)
    if known is not None:
        return known
    values = json.loads(text)
    if not isinstance(values, dict):
        raise ValueError("the run config the server sent is not a mapping of keys to values")
    return _remember(RunConfig(values, digest))


def carried_config(msg: Message, context: Context) -> RunConfig | None:
    """The server's run config this message names (None: it names none; then the node's own
    ``context.run_config`` applies).

    The whole config comes with the first message of a run to this node; the node keeps it in
    this process and in ``context.state`` (which outlives a ClientApp process in deployment),
    and later messages only name it by digest.

    Raises
    ------
    RunConfigMissing
        The message names a config this node does not hold.
    """
    if CONFIG_RECORD not in msg.content:
        return None
    rec = msg.content[CONFIG_RECORD]
    if not isinstance(rec, ConfigRecord):
        raise ValueError(f"record {CONFIG_RECORD!r} is not a config record")
    digest = str(rec.get(CONFIG_DIGEST, ""))
    if CONFIG_JSON in rec:
        cfg = _parse(str(rec[CONFIG_JSON]))
        if digest and digest != cfg.key:
            raise ValueError("the run config the server sent does not match its digest")
        held = context.state.get(CONFIG_RECORD)
        if not isinstance(held, ConfigRecord) or held.get(CONFIG_DIGEST) != cfg.key:
            context.state[CONFIG_RECORD] = ConfigRecord({CONFIG_JSON: rec[CONFIG_JSON],
                                                         CONFIG_DIGEST: cfg.key})
        return cfg
    if digest in _CONFIGS:
        return _CONFIGS[digest]
    held = context.state.get(CONFIG_RECORD)
    if isinstance(held, ConfigRecord) and held.get(CONFIG_DIGEST) == digest:
        return _parse(str(held[CONFIG_JSON]))
    raise RunConfigMissing("this node does not hold the run config the message names (it "
                           "restarted, or missed the run's first message); the server sends "
                           "it again")


def _with_clients(cfg: Mapping[str, Any], parts: int) -> Mapping[str, Any]:
    """``cfg`` with ``num-clients`` = ``parts`` (the node's count for ``num-clients = 0``)."""
    if not isinstance(cfg, RunConfig):
        return {**cfg, "num-clients": parts}
    key = f"{cfg.key}/num-clients={parts}"
    known = _CONFIGS.get(key)
    return known if known is not None else _remember(
        RunConfig({**cfg, "num-clients": parts}, key))


def engine_mod(msg: Message, context: Context, call_next) -> Message:
    """Take the run config the message names (the server's, :func:`carried_config`), and
    resolve ``num-clients = 0`` and ``dataset = "files"`` from this node's engine config."""
    node, run = context.node_config, context.run_config
    # Flower refuses a changed run config after the message: change it for the handler only.
    carried = carried_config(msg, context)
    cfg: Mapping[str, Any] = run if carried is None else carried
    if "num-partitions" in node and int(setting(cfg, "num-clients") or 0) == 0:
        cfg = _with_clients(cfg, int(node["num-partitions"]))
    context.run_config = cfg     # type: ignore[assignment]
    if cfg.get("dataset") == "files" and "partition-id" in node:
        from fedclust.data.sites import site_file

        path = site_file(cfg, int(node["partition-id"]))
        context.node_config = {**node, "data-path": str(path),
                               "data-format": str(setting(cfg, "files.format")),
                               "label-column": str(setting(cfg, "files.label-column"))}
    try:
        return call_next(msg, context)
    finally:
        context.node_config, context.run_config = node, run


LOG = logging.getLogger("fedclust.node")


def error_mod(msg: Message, context: Context, call_next) -> Message:
    """Every error reply carries an error class and a data-free, path-free message; the
    details (the traceback, which may quote a cell of the node's data, and the path of the
    file at fault) stay in the node's own log."""
    try:
        return call_next(msg, context)
    except Exception as exc:
        return error_reply(msg, exc)


def error_reply(msg: Message, exc: Exception) -> Message:
    """The error reply of :func:`error_mod` to ``msg`` for ``exc`` (logged here)."""
    exc = _missing_extra(exc, msg)
    name = type(exc).__name__
    LOG.error("action %s failed on this node", msg.metadata.message_type,
              exc_info=(type(exc), exc, exc.__traceback__))
    detail = getattr(exc, "detail", None)
    if isinstance(detail, str) and detail != str(exc):
        # the reply names no path and no content; the operator needs both
        LOG.warning("%s on this node: %s", name, detail)
    # a data-free error (FedclustError.data_free) names keys, the kind of file, row and column
    # numbers and counts, never a value of the data nor a path: its text may reach the server
    reason = (f"{name}: {exc}" if isinstance(exc, FedclustError) and exc.data_free else
              f"{name} in {msg.metadata.message_type} (details in this node's log)")
    return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                   reply_to=msg)


def _missing_extra(exc: Exception, msg: Message) -> Exception:
    """A package of an optional extra missing on this node (``import torch`` in a FedCRef
    handler of a core install) as the ``pip install`` line the operator types."""
    from fedclust.registry import EXTRAS, METHODS

    if not isinstance(exc, ModuleNotFoundError) or not exc.name:
        return exc
    top = exc.name.split(".")[0]
    action = msg.metadata.message_type.partition(".")[2]
    for method, spec in METHODS.items():
        if top in spec.needs and action.startswith(method):
            from fedclust.config import MissingExtraError, extra_message

            return MissingExtraError(extra_message(f"method={method!r} on this node", [top],
                                                   spec.extra, EXTRAS[spec.extra]))
    return exc


app = ClientApp(mods=[error_mod, engine_mod])

#: A node's answer in a batch: its reply, or the exception its part raised.
Answer = Message | Exception
#: message type -> handler of several nodes' messages of one phase at once (:func:`batched`)
BATCHED: dict[str, Callable[[list[tuple[Message, Context]]], list[Answer]]] = {}


def batched(message_type: str) -> Callable[[Callable[..., list[Answer]]],
                                          Callable[..., list[Answer]]]:
    """Register the batched form of the handler of ``message_type`` (e.g.
    ``"train.emdcfl_local"``): it takes ``(message, context)`` of several nodes, each as the
    handler would see it (after the mods), and returns every node's answer, in order. It
    computes what the handler computes for each node; only the layout on the device differs
    (one computation for all). Only an in-process engine serving many nodes calls it
    (:func:`serve_batch`)."""
    def register(fn: Callable[..., list[Answer]]) -> Callable[..., list[Answer]]:
        BATCHED[message_type] = fn
        return fn

    return register


def batchable(client_app: ClientApp, messages: list[Message]) -> bool:
    """Whether :func:`serve_batch` may answer ``messages`` together: fedclust's app, one
    message type, and a batched handler for it."""
    kinds = {m.metadata.message_type for m in messages}
    return client_app is app and len(kinds) == 1 and kinds.pop() in BATCHED


def serve_batch(client_app: ClientApp, items: list[tuple[Message, Context]]
                ) -> list[Message] | None:
    """One phase's messages (one type) to several nodes of this process, answered together.

    Each message goes through this app's mods (its run config, its node config, an error
    reply of its own when that fails), then the batched handler answers all of them at once;
    a node whose part raises gets the error reply :func:`error_mod` would give. Returns None
    (answer each message on its own instead) when ``client_app`` is not fedclust's app, the
    message type has no batched handler, or the batched handler itself fails.
    """
    if len(items) < 2 or not batchable(client_app, [m for m, _ in items]):
        return None
    kind = items[0][0].metadata.message_type
    handler = BATCHED[kind]
    replies: list[Message | None] = [None] * len(items)
    ready: list[tuple[int, Message, Context]] = []
    for k, (msg, context) in enumerate(items):
        seen: list[Context] = []

        def capture(m: Message, c: Context, seen: list[Context] = seen) -> Message:
            seen.append(Context(run_id=c.run_id, node_id=c.node_id, node_config=c.node_config,
                                state=c.state, run_config=c.run_config))
            return m

        reply = error_mod(msg, context, lambda m, c, capture=capture: engine_mod(m, c, capture))
        if seen:
            ready.append((k, msg, seen[0]))
        else:
            replies[k] = reply
    if ready:
        try:
            answers = handler([(m, c) for _, m, c in ready])
        except Exception:
            LOG.warning("batched %s failed; answering each message on its own", kind,
                        exc_info=True)
            return None
        for (k, msg, _), answer in zip(ready, answers, strict=True):
            replies[k] = answer if isinstance(answer, Message) else error_reply(msg, answer)
    return None if any(r is None for r in replies) else list(replies)  # type: ignore[arg-type]


@app.query("fedclust_node")
def node_info(msg: Message, context: Context) -> Message:
    """What the engine told this node: ``num-partitions`` in simulation, 0 on a deployed node
    (which reads its own ``data-path``). Nothing about its data."""
    node = context.node_config
    parts = int(node["num-partitions"]) if "num-partitions" in node else 0
    return Message(RecordDict({"metrics": MetricRecord({"num-partitions": parts})}),
                   reply_to=msg)
