"""An in-process Flower ``Grid`` that calls the real ClientApp.

Used by the tests (fast server-loop tests), by ``fedclust.simulate`` and by ``fedclust-sweep``
(its default engine): the same ServerApp main and ClientApp handlers, without an engine.

Messages are passed to ``client_app(message, context)`` exactly as Flower's engines do, minus
serialisation. ``drop`` makes chosen nodes fail (no reply) from a given phase on, to test that
server loops survive dropouts; ``inspect`` sees every reply (privacy tests).

Every node lives in this process, so one phase's messages (one ``send_and_receive``) can be
answered together: where fedclust's ClientApp has a batched form of the phase's handler
(:func:`client_apps.base.batched`: EMD-CFL's training, IFCA, embedding and evaluation,
FedCRef's local and community training), all nodes' answers are computed as one batched
computation on the method's device, and each node still gets its own reply, checked by the
server like any other (``batch=False``: one message after another).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid
from flwr.supercore.task_identity import TaskIdentity


class InProcessGrid(Grid):
    """Grid whose nodes are in-process contexts served by ``client_app``.

    Parameters
    ----------
    client_app : ClientApp
    num_nodes : int
    run_config : mapping
        The flat run config every node sees.
    node_configs : list of mapping, optional
        Per-node ``node_config`` (default: ``partition-id``/``num-partitions``).
    drop : callable, optional
        ``(node_id, message) -> bool``; True means the node does not answer this message.
    inspect : callable, optional
        Called with every (instruction, reply) pair.
    keep_sent : bool, default False
        Keep every instruction in ``sent`` (for tests that inspect them). Off by default: a
        long run relays gigabytes of models, and keeping them all grows memory without bound.
    batch : bool, default True
        Answer a phase's messages together where the ClientApp has a batched handler
        (module docstring).
    """

    def __init__(self, client_app: ClientApp, num_nodes: int, run_config: Mapping[str, Any],
                 node_configs: list[Mapping[str, Any]] | None = None,
                 drop: Callable[[int, Message], bool] | None = None,
                 inspect: Callable[[Message, Message], None] | None = None,
                 keep_sent: bool = False, batch: bool = True) -> None:
        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1
        self.client_app, self.drop, self.inspect = client_app, drop, inspect
        self.keep_sent, self.batch = keep_sent, batch
        self._replies: dict[str, Message] = {}
        self._ids = itertools.count(1)     # message ids, unique within this grid
        self.sent: list[Message] = []
        self.contexts = {}
        for i in range(num_nodes):
            node_config = dict(node_configs[i]) if node_configs else {
                "partition-id": i, "num-partitions": num_nodes}
            self.contexts[1000 + i] = Context(run_id=1, node_id=1000 + i, node_config=node_config,
                                              state=RecordDict(), run_config=dict(run_config))

    def set_run(self, run: Any) -> None:  # noqa: D102
        pass

    @property
    def run(self) -> Any:  # noqa: D102
        return None

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None):  # noqa: D102
        return Message(content, dst_node_id, message_type, group_id=group_id, ttl=ttl)

    def get_node_ids(self) -> Iterable[int]:  # noqa: D102
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:  # noqa: D102
        messages = list(messages)
        ids = []
        for msg in messages:
            mid = f"{next(self._ids):032x}"
            msg.metadata.__dict__["_message_id"] = mid
            if self.keep_sent:
                self.sent.append(msg)
            ids.append(mid)
        if self.batch and len(messages) > 1:
            from client_apps.base import batchable, serve_batch

            if batchable(self.client_app, messages):
                todo = [(mid, m) for mid, m in zip(ids, messages, strict=True)
                        if self.drop is None or not self.drop(m.metadata.dst_node_id, m)]
                replies = serve_batch(self.client_app, [(m, self.contexts[
                    m.metadata.dst_node_id]) for _, m in todo])
                for k, (mid, msg) in enumerate(todo):
                    self._answer(mid, msg, None if replies is None else replies[k])
                return ids
        for mid, msg in zip(ids, messages, strict=True):
            # drop is asked just before the node gets its message (tests restart nodes there)
            if self.drop is None or not self.drop(msg.metadata.dst_node_id, msg):
                self._answer(mid, msg)
        return ids

    def _answer(self, mid: str, msg: Message, reply: Message | None = None) -> None:
        """Keep the node's reply to ``msg`` (``reply``, or the ClientApp's answer now)."""
        if reply is None:
            try:
                reply = self.client_app(msg, self.contexts[msg.metadata.dst_node_id])
            except Exception as exc:  # the engines turn handler exceptions into error replies
                reply = Message(Error(code=0, reason=repr(exc)), reply_to=msg)
        if self.inspect is not None:
            self.inspect(msg, reply)
        self._replies[mid] = reply

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,  # noqa: D102
                         timeout: float | None = None) -> Iterable[Message]:
        return self.pull_messages(self.push_messages(messages))


def run_server(run_config: Mapping[str, Any], num_nodes: int | None = None, **grid_kwargs: Any
               ) -> tuple[dict[str, Any], InProcessGrid]:
    """Run the method as the ServerApp does (the run config's Strategy object) against an
    :class:`InProcessGrid`; return (summary, grid)."""
    from client_apps.app import app as client_app
    from fedclust.data.sites import simulated_nodes
    from strategies.methods import from_run_config

    n = int(num_nodes if num_nodes is not None else simulated_nodes(run_config, 5))
    if n < 1:
        from fedclust.config import ConfigError

        raise ConfigError(f"run_server(num_nodes={n}): an in-process run needs at least one "
                          f"node (no node would ever connect; the run would wait 'timeout' "
                          f"for one). Fix: num_nodes=1 or more")
    grid = InProcessGrid(client_app, n, run_config, **grid_kwargs)
    strategy, rest = from_run_config(dict(run_config))
    return strategy.start(grid, run_config=rest).summary, grid
