"""An in-process Flower ``Grid`` that calls the real ClientApp.

Used by the tests (fast server-loop tests), by ``fedclust.simulate`` and by ``fedclust-sweep``
(its default engine): the same ServerApp main and ClientApp handlers, without an engine.

Messages are passed to ``client_app(message, context)`` exactly as Flower's engines do, minus
serialisation. ``drop`` makes chosen nodes fail (no reply) from a given phase on, to test that
server loops survive dropouts; ``inspect`` sees every reply (privacy tests).

Every node lives in this process, so one phase's messages (one ``send_and_receive``) can be
answered together: where fedclust's ClientApp has a batched form of the phase's handler
(:func:`client_apps.base.batched`: EMD-CFL's training, IFCA, embedding and evaluation,
FedCRef's local and community training, exact FCM's sums, the FCM family's final phase),
all nodes' answers are computed as one batched
computation on the method's device, and each node still gets its own reply, checked by the
server like any other (``batch=False``: one message after another).

Like every engine, it honours the reply ``timeout`` of :meth:`InProcessGrid.send_and_receive`:
the handlers run in a worker thread, one message after the other in the order sent (or one
batched computation), and each message gets ``timeout`` seconds from the start of its own
handler (the nodes of a real engine run side by side, each with the whole timeout; a batch gets
``timeout`` as a whole). A handler that overruns counts as no reply and the next messages are
served by a fresh worker; its node, still inside the handler (hung), gets no further message
answered until it returns, as a hung SuperNode would. All its nodes exist from the start
(:attr:`InProcessGrid.complete`), so a run never waits for more nodes to connect.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import itertools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
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

    #: every node exists from the start: nothing is gained by waiting for more to connect
    complete = True
    #: its nodes are simulated in this process: a run's files are made durable once, at its end
    simulated = True

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
        self.busy: set[int] = set()      # nodes whose handler still runs past a deadline
        self._lock = threading.Lock()
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
        ids = self._assign_ids(messages)
        if not self._batched(messages, ids, lambda: True):
            for mid, msg in zip(ids, messages, strict=True):
                self._answer(mid, msg, lambda: True)
        return ids

    def _assign_ids(self, messages: list[Message]) -> list[str]:
        ids = []
        for msg in messages:
            mid = f"{next(self._ids):032x}"
            msg.metadata.__dict__["_message_id"] = mid
            if self.keep_sent:
                self.sent.append(msg)
            ids.append(mid)
        return ids

    def _batched(self, messages: list[Message], ids: list[str], wanted: Callable[[], bool]
                 ) -> bool:
        """Answer ``messages`` as one batched computation where the ClientApp has one for their
        phase (module docstring); False when it has none (answer them one by one)."""
        if not (self.batch and len(messages) > 1):
            return False
        from client_apps.base import batchable, serve_batch

        if not batchable(self.client_app, messages):
            return False
        todo = [(mid, m) for mid, m in zip(ids, messages, strict=True)
                if self.drop is None or not self.drop(m.metadata.dst_node_id, m)]
        with self._lock:
            todo = [(mid, m) for mid, m in todo if m.metadata.dst_node_id not in self.busy]
            nodes = {m.metadata.dst_node_id for _, m in todo}
            self.busy |= nodes
        try:
            replies = serve_batch(self.client_app, [(m, self.contexts[
                m.metadata.dst_node_id]) for _, m in todo])
        finally:
            with self._lock:
                self.busy -= nodes
        for k, (mid, msg) in enumerate(todo):
            self._answer(mid, msg, wanted, None if replies is None else replies[k], ask=False)
        return True

    def _answer(self, mid: str, msg: Message, wanted: Callable[[], bool],
                reply: Message | None = None, ask: bool = True) -> None:
        """Keep the node's reply to ``msg`` (``reply``, or the ClientApp's answer now) while
        ``wanted()`` (the caller still waits for it)."""
        nid = msg.metadata.dst_node_id
        if reply is None:
            # drop is asked just before the node gets its message (tests restart nodes there)
            if ask and self.drop is not None and self.drop(nid, msg):
                return
            with self._lock:
                if nid in self.busy:          # still inside an earlier handler: no answer
                    return
                self.busy.add(nid)
            try:
                reply = self.client_app(msg, self.contexts[nid])
            except Exception as exc:  # the engines turn handler exceptions into error replies
                reply = Message(Error(code=0, reason=repr(exc)), reply_to=msg)
            finally:
                with self._lock:
                    self.busy.discard(nid)
        if self.inspect is not None:
            self.inspect(msg, reply)
        if wanted():
            with self._lock:
                self._replies[mid] = reply

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:  # noqa: D102
        with self._lock:
            return [self._replies.pop(i) for i in list(message_ids) if i in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *,  # noqa: D102
                         timeout: float | None = None) -> Iterable[Message]:
        # One worker thread serves the messages in the order sent (or as one batch). Each
        # handler gets `timeout` seconds from its own start: one that overruns is abandoned —
        # its node stays busy — and a fresh worker serves the messages after it.
        messages = list(messages)
        ids = self._assign_ids(messages)
        cond = threading.Condition()
        k = 0
        while k < len(messages):
            abandoned = threading.Event()
            progress: dict[str, Any] = {"k": k, "t": time.monotonic(), "error": None}
            ctx = contextvars.copy_context()    # the caller's context vars reach the handlers

            def wanted(abandoned: threading.Event = abandoned) -> bool:
                return not abandoned.is_set()

            def work(first: int = k, progress: dict[str, Any] = progress,
                     ctx: contextvars.Context = ctx, wanted: Callable[[], bool] = wanted
                     ) -> None:
                try:
                    if first == 0 and ctx.run(self._batched, messages, ids, wanted):
                        first = len(messages)
                    for j in range(first, len(messages)):
                        if not wanted():
                            return
                        with cond:
                            progress["k"], progress["t"] = j, time.monotonic()
                            cond.notify_all()
                        ctx.run(self._answer, ids[j], messages[j], wanted)
                except BaseException as exc:  # noqa: BLE001 - raised again in the caller
                    progress["error"] = exc
                with cond:
                    progress["k"] = len(messages)
                    cond.notify_all()

            threading.Thread(target=work, name="fedclust-inprocess", daemon=True).start()
            with cond:
                while progress["k"] < len(messages):
                    if timeout is None:
                        cond.wait()
                        continue
                    left = progress["t"] + max(0.0, float(timeout)) - time.monotonic()
                    if left <= 0:
                        break
                    cond.wait(left)
                done = progress["k"] >= len(messages)
                k = progress["k"] + 1
            if progress["error"] is not None:
                raise progress["error"]
            if done:
                break
            abandoned.set()     # message k - 1 (or the batch) overran its timeout
        return self.pull_messages(ids)


_FROZEN = {"depth": 0}
_FROZEN_LOCK = threading.Lock()


@contextlib.contextmanager
def heap_frozen() -> Iterator[None]:
    """Within: the objects alive at entry are kept out of the cyclic garbage collector's passes
    (:func:`gc.freeze`), and are handed back to it at exit (:func:`gc.unfreeze`).

    An in-process run makes and drops tens of thousands of small objects per phase (a message
    and its records per node), which sets off full collections every few rounds; each one
    walked the whole heap (the process's modules, a notebook's data: 65 ms each with 1,000
    clients, 8 % of the run). Frozen, a full collection walks only the run's own objects.
    Nothing is leaked: garbage among the frozen objects is collected after the run. Nested or
    concurrent runs unfreeze at the last exit; a process that froze its heap itself (e.g. a
    server before ``fork``) is left as it is.
    """
    with _FROZEN_LOCK:
        mine = _FROZEN["depth"] > 0 or gc.get_freeze_count() == 0
        if mine:
            _FROZEN["depth"] += 1
            if _FROZEN["depth"] == 1:
                gc.freeze()
    try:
        yield
    finally:
        if mine:
            with _FROZEN_LOCK:
                _FROZEN["depth"] -= 1
                if _FROZEN["depth"] == 0:
                    gc.unfreeze()


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
    with heap_frozen():
        return strategy.start(grid, run_config=rest).summary, grid
