"""Whether a node may send label-derived statistics (the evaluation path), shared by every
method's handlers.

Ground-truth labels on a node exist for evaluation only. Anything derived from them —
evaluation tables, per-cluster label histograms, the inputs of the server's ``eval_*``
metrics — leaves a node only when **both**

- the run asks for it: run config ``evaluate=true``, and
- the node allows it: a **simulated** node always does (its data is a partition of a public
  dataset the run config names); a **deployed** node only with node config
  ``allow-evaluation=true`` (default false), set by the data owner on its SuperNode::

      flower-supernode ... --node-config 'data-path="/data/mine.npz" allow-evaluation=true'

A node is *simulated* when it reads data the run config determines: node config
``partition-id`` and no ``data-path`` of its own, or ``dataset="files"`` (the engine then sets
``data-path`` to the run's ``partition-id``-th site file, :func:`client_apps.base.engine_mod`).
A node with a ``data-path`` of its own is *deployed*, whatever else its node config says. The
rule is :func:`fedclust.data.sites.is_simulated`, the one every method uses.

This module is imported by every ClientApp process: it imports nothing heavy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import Context

from fedclust.config import ConfigError
from fedclust.data.sites import is_simulated  # re-exported: the one rule for every method

ALLOW_KEY = "allow-evaluation"


def node_allows_evaluation(node_config: Mapping[str, Any], cfg: Mapping[str, Any]) -> bool:
    """The node's own permission: always on a simulated node; node config
    ``allow-evaluation`` (default false) on a deployed one.

    Raises
    ------
    ConfigError
        ``allow-evaluation`` is not a boolean (``true``/``false``, also as a string, or 1/0).
        The message names the key and the value the operator typed, never node data.
    """
    if is_simulated(node_config, cfg):
        return True
    raw = node_config.get(ALLOW_KEY, False)
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and raw.strip().lower() in ("true", "false", "1", "0"):
        return raw.strip().lower() in ("true", "1")
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    raise ConfigError(
        f"node config '{ALLOW_KEY}' = {raw!r} is invalid. Allowed: true or false (default "
        "false: this node sends no label-derived statistics). Fix: flower-supernode "
        f"--node-config '... {ALLOW_KEY}=true' (or drop the key).")


def allows_evaluation(context: Context, cfg: Mapping[str, Any]) -> bool:
    """Whether this node may use its labels for, and send, label-derived statistics: run
    config ``evaluate`` is true **and** the node allows it (:func:`node_allows_evaluation`).

    ``cfg`` is the validated run config of the handler (``evaluate`` typed as a bool).
    """
    return bool(cfg["evaluate"]) and node_allows_evaluation(context.node_config, cfg)
