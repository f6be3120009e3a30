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

import logging

from flwr.app import Context, Error, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import ErrorCode

# the record of a message that carries the run's config (strategies.common.CONFIG_RECORD)
CONFIG_RECORD = "fedclust.run-config"


def engine_mod(msg: Message, context: Context, call_next) -> Message:
    """Take the run config the message carries (the server's, ``fedclust.run-config``), and
    resolve ``num-clients = 0`` and ``dataset = "files"`` from this node's engine config."""
    node, run = context.node_config, context.run_config
    # Flower refuses a changed run config after the message: change it for the handler only.
    if CONFIG_RECORD in msg.content.config_records:
        context.run_config = dict(msg.content.config_records[CONFIG_RECORD])
    cfg = context.run_config
    if "num-partitions" in node and int(cfg.get("num-clients", 0) or 0) == 0:
        context.run_config = {**cfg, "num-clients": int(node["num-partitions"])}
    if cfg.get("dataset") == "files" and "partition-id" in node:
        from fedclust.data.sites import site_file

        path = site_file(cfg, int(node["partition-id"]))
        context.node_config = {**node, "data-path": str(path),
                               "data-format": str(cfg.get("files.format", "")),
                               "label-column": str(cfg.get("files.label-column", ""))}
    try:
        return call_next(msg, context)
    finally:
        context.node_config, context.run_config = node, run


# Errors whose messages are data-free and path-free by construction (they name keys, the kind
# of file, row and column numbers and counts, never a value read from the data nor the node's
# paths): their text may reach the server. A LocalDataError's ``detail`` (with the path) stays
# in the node's log.
PUBLIC_ERRORS = ("ConfigError", "LocalDataError", "SiteFilesError", "PartitionError",
                 "DatasetError")
LOG = logging.getLogger("fedclust.node")


def error_mod(msg: Message, context: Context, call_next) -> Message:
    """Every error reply carries an error class and a data-free, path-free message; the
    details (the traceback, which may quote a cell of the node's data, and the path of the
    file at fault) stay in the node's own log."""
    try:
        return call_next(msg, context)
    except Exception as exc:
        name = type(exc).__name__
        LOG.error("action %s failed on this node", msg.metadata.message_type, exc_info=True)
        detail = getattr(exc, "detail", None)
        if isinstance(detail, str) and detail != str(exc):
            # the reply names no path and no content; the operator needs both
            LOG.warning("%s on this node: %s", name, detail)
        reason = (f"{name}: {exc}" if name in PUBLIC_ERRORS else
                  f"{name} in {msg.metadata.message_type} (details in this node's log)")
        return Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=reason),
                       reply_to=msg)


app = ClientApp(mods=[error_mod, engine_mod])


@app.query("fedclust_node")
def node_info(msg: Message, context: Context) -> Message:
    """What the engine told this node: ``num-partitions`` in simulation, 0 on a deployed node
    (which reads its own ``data-path``). Nothing about its data."""
    node = context.node_config
    parts = int(node["num-partitions"]) if "num-partitions" in node else 0
    return Message(RecordDict({"metrics": MetricRecord({"num-partitions": parts})}),
                   reply_to=msg)
