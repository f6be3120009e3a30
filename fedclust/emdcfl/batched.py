"""Every client of a round as one computation on one device: EMD-CFL's in-memory clients
batched (:class:`BatchedClients`), and the kernels that they and the in-process engine's
batched ClientApp handlers (:mod:`client_apps.emdcfl_handlers`) share.

A simulation on one machine has every client's data in one process, so a phase need not run
the clients one after another. What each client computes is unchanged: its own data, its own
minibatch order (from its own seed), its own optimiser state, its own pair projections; only
the way the arithmetic is laid out on the device changes.

**Stacked training** (:func:`train_stacked`, the default on CUDA): the ``N`` clients' models
are stacked (every parameter gets a leading client axis) and one SGD step trains all of them
at once. A step gathers every client's next minibatch (``B`` images each) into one
``(B, N·C, H, W)`` tensor; the convolutions are grouped convolutions (``groups = N``: client
``i``'s channels only meet client ``i``'s filters), the linear layers batched matrix products
(:class:`Batching`: on CUDA the fastest of three convolution layouts, timed on the first
minibatch, with TF32 tensor cores by default).
The loss is the sum of the clients' mean losses, so each client's gradient is exactly its own;
momentum SGD updates every client's parameters and momentum buffer with multi-tensor ops. The
minibatch orders of all epochs are drawn up front on the host (the same ``torch.randperm``
stream per client as :func:`fedclust.emdcfl.model.train_local`) and copied to the device once:
no step waits for the host, and the losses are read once at the end. Clients with fewer
batches, or fewer images than ``B``, are padded and masked (a masked client's parameters and
momentum do not move).

**Embedding and evaluation**, stacked: the images that one model must embed (its client's
train split, and every member's validation split) are concatenated and run through that model
in large chunks; evaluation groups the clients that share a (cluster) model the same way. The
clients' reference distances ``W(train_c, val_c)`` are solved in parallel worker processes
(``emdcfl.workers``) instead of one after another.

On the CPU the default is the per-client kernels, one client after another (the stacked
layout measured slower on one CPU thread, and these give bit-for-bit the numbers of the
per-client path); ``Batching(stack=True)`` forces the stacked layout anywhere (the tests check
it against the per-client path on the CPU).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedclust.emdcfl import client
from fedclust.emdcfl.clients import Clouds, Evaluation, Final, Trained, Weights
from fedclust.emdcfl.data import ClientSplit
from fedclust.emdcfl.inmemory import InMemoryClients
from fedclust.emdcfl.keys import EMDCFLSettings
from fedclust.emdcfl.privacy import PairContext, key_id, shared_secret

LOG = logging.getLogger("fedclust")
CONVS = ("auto", "grouped", "unfold", "loop")
PRECISIONS = ("tf32", "fp32", "bf16")


@dataclass(frozen=True)
class Batching:
    """How a batch of clients is laid out on the device.

    Attributes
    ----------
    stack : bool or None
        Stacked kernels (one computation for all clients) or the per-client kernels one
        client after another; None: stacked on CUDA, per client on the CPU.
    conv : {"auto", "grouped", "unfold", "loop"}
        Stacked training's convolutions: one grouped convolution for all clients; the second
        convolution as an unfold and a batched matrix product; or one convolution per client
        inside the same step. ``auto`` times the three on the first minibatch on CUDA and
        keeps the fastest (``grouped`` on the CPU).
    precision : {"tf32", "fp32", "bf16"}
        Stacked arithmetic on CUDA: float32 data with TF32 tensor cores for convolutions
        (PyTorch's default for cuDNN, which the per-client path uses) and matrix products;
        full float32 (TF32 off: the accuracy reference); or bf16 autocast of the forward pass
        (float32 weights, optimiser and loss). Embedding and evaluation use ``tf32`` for
        ``bf16``.
    chunk : int
        Images per forward pass of stacked embedding and evaluation.
    """

    stack: bool | None = None
    conv: str = "auto"
    precision: str = "tf32"
    chunk: int = 4096

    def __post_init__(self) -> None:
        if self.conv not in CONVS:
            raise ValueError(f"conv must be one of {CONVS}, got {self.conv!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")

    def stacked(self, device: str) -> bool:
        """Whether the stacked kernels run on ``device``."""
        return self.stack if self.stack is not None else str(device).startswith("cuda")


#: what the in-process engine's batched handlers use
DEFAULT = Batching()


# ------------------------------------------------------------------------------ arithmetic

@contextlib.contextmanager
def arithmetic(device: str, precision: str) -> Iterator[None]:
    """The stacked kernels' numerics on ``device``: TF32 on (``tf32``, ``bf16``) or off
    (``fp32``) for convolutions and matrix products, and on CUDA cuDNN's autotuner (the
    fastest kernels for the stacked shapes, not the deterministic ones a single simulated
    client asks for); restored on exit."""
    import torch

    cuda = str(device).startswith("cuda")
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic)
    try:
        torch.backends.cuda.matmul.allow_tf32 = precision != "fp32"
        torch.backends.cudnn.allow_tf32 = precision != "fp32"
        if cuda:
            torch.backends.cudnn.benchmark = True
            torch.backends.cudnn.deterministic = False
        yield
    finally:
        (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
         torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic) = saved


def _autocast(device: str, precision: str) -> Any:
    import torch

    if precision != "bf16":
        return contextlib.nullcontext()
    return torch.autocast("cuda" if str(device).startswith("cuda") else "cpu",
                          dtype=torch.bfloat16)


def _sync(device: str) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------------------ training

def _forward_grouped(p: list[Any], x: Any, n: int) -> Any:
    """Logits ``(n, B, classes)`` of the ``n`` stacked CNNs (``p``: parameters with a leading
    client axis) on ``x`` = ``(B, n·C, H, W)``, client ``i``'s images in channels
    ``i·C … i·C + C − 1``: grouped convolutions, batched linear layers. The layer order is
    :class:`~fedclust.emdcfl.model.CNN`'s."""
    from torch.nn import functional as F

    h = F.relu(F.conv2d(x, p[0].flatten(0, 1), p[1].flatten(), padding=1, groups=n))
    return _head(p, F.conv2d(h, p[2].flatten(0, 1), p[3].flatten(), padding=1, groups=n), n)


def _head(p: list[Any], h: Any, n: int) -> Any:
    """From the second convolution's output ``(B, n·c2, H, W)`` to the logits: max-pool,
    ReLU, the two linear layers as batched matrix products."""
    import torch
    from torch.nn import functional as F

    h = F.relu(F.max_pool2d(h, 2))
    h = h.reshape(h.shape[0], n, -1).transpose(0, 1)            # (n, B, features)
    h = F.relu(torch.baddbmm(p[5].unsqueeze(1), h, p[4].transpose(1, 2)))
    return torch.baddbmm(p[7].unsqueeze(1), h, p[6].transpose(1, 2))


def _forward_unfold(p: list[Any], x: Any, n: int) -> Any:
    """:func:`_forward_grouped` with the second convolution as an unfold and one batched
    matrix product per client (cuBLAS instead of a grouped convolution kernel)."""
    import torch
    from torch.nn import functional as F

    h = F.relu(F.conv2d(x, p[0].flatten(0, 1), p[1].flatten(), padding=1, groups=n))
    b, _, rows, cols = h.shape
    c2, c1 = p[2].shape[1], p[2].shape[2]
    patches = F.unfold(h, 3, padding=1).view(b, n, c1 * 9, rows * cols)
    out = torch.einsum("nok,bnkp->bnop", p[2].reshape(n, c2, c1 * 9), patches)
    out = out + p[3].view(1, n, c2, 1)
    return _head(p, out.reshape(b, n * c2, rows, cols), n)


def _forward_loop(p: list[Any], x: Any, n: int) -> Any:
    """:func:`_forward_grouped`'s result with one convolution per client (same step, same
    autograd graph): for a device whose grouped convolution kernels are slow."""
    import torch
    from torch.nn import functional as F

    c = x.shape[1] // n
    out = []
    for i in range(n):
        h = F.relu(F.conv2d(x[:, i * c:(i + 1) * c], p[0][i], p[1][i], padding=1))
        h = F.relu(F.max_pool2d(F.conv2d(h, p[2][i], p[3][i], padding=1), 2))
        h = F.relu(F.linear(h.flatten(1), p[4][i], p[5][i]))
        out.append(F.linear(h, p[6][i], p[7][i]))
    return torch.stack(out)


FORWARD: dict[str, Callable[[list[Any], Any, int], Any]] = {
    "grouped": _forward_grouped, "unfold": _forward_unfold, "loop": _forward_loop}
_CHOSEN: dict[tuple[Any, ...], str] = {}     # conv="auto": the faster per shape and device


@dataclass
class _Plan:
    """The minibatches of every epoch of a stacked training, on the device."""

    index: Any           # (E, S, B, n) rows of the concatenated data
    weight: Any | None   # (E, S, B, n) 1 for a real image, 0 for padding (None: no padding)
    active: Any | None   # (E, S, n) client takes this step (None: every client every step)
    count: NDArray[np.float64]   # images per client per epoch (the loss's denominator)


def _plan(sizes: Sequence[int], epochs: int, batch_size: int, seeds: Sequence[int],
          device: str) -> _Plan:
    """Every client's minibatches as :func:`~fedclust.emdcfl.model.train_local` draws them:
    one ``torch.randperm`` per epoch from a generator seeded with the client's seed, the tail
    batch dropped (one short batch when a client has at most ``batch_size`` images)."""
    import torch

    n, big = len(sizes), int(batch_size)
    per = [big if m > big else m for m in sizes]                 # images per batch
    steps = [m // big if m > big else (1 if m else 0) for m in sizes]
    s_max = max(steps, default=0)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    index = np.zeros((epochs, s_max, big, n), dtype=np.int64)
    weight = np.zeros((epochs, s_max, big, n), dtype=np.float32)
    for i, (m, b, k, seed) in enumerate(zip(sizes, per, steps, seeds, strict=True)):
        gen = torch.Generator().manual_seed(int(seed))
        for e in range(epochs):
            order = torch.randperm(m, generator=gen).numpy()
            if k:
                index[e, :k, :b, i] = offsets[i] + order[:k * b].reshape(k, b)
                weight[e, :k, :b, i] = 1.0
    full = all(b == big for b in per) and all(k == s_max for k in steps)
    active = weight.max(axis=2) > 0
    return _Plan(torch.from_numpy(index).to(device),
                 None if full else torch.from_numpy(weight).to(device),
                 None if full else torch.from_numpy(active).to(device),
                 np.array([k * b for k, b in zip(steps, per, strict=True)], dtype=np.float64))


def train_stacked(spec: Any, starts: Sequence[Weights], xs: Sequence[NDArray],
                  ys: Sequence[NDArray], epochs: int, lr: float, batch_size: int,
                  seeds: Sequence[int], device: str = "cpu", conv: str = "auto",
                  precision: str = "tf32", momentum: float = 0.9, weight_decay: float = 1e-6
                  ) -> tuple[list[Weights], list[float]]:
    """:func:`~fedclust.emdcfl.model.train_local` for ``n`` clients as one computation (see
    the module docstring): client ``i`` trains ``starts[i]`` on ``(xs[i], ys[i])`` with the
    minibatch order of ``seeds[i]``. Returns every client's new weights (numpy) and the mean
    training loss of its last epoch."""
    import torch
    from torch.nn import functional as F

    from fedclust.emdcfl.model import to_tensor

    n = len(starts)
    if n == 0:
        return [], []
    sizes = [len(y) for y in ys]
    plan = _plan(sizes, int(epochs), batch_size, seeds, device)
    x_all = torch.cat([to_tensor(x) for x in xs]).to(device)
    y_all = torch.cat([torch.from_numpy(np.asarray(y, dtype=np.int64)) for y in ys]).to(device)
    params = [torch.from_numpy(np.stack([np.asarray(w[j], dtype=np.float32) for w in starts]))
              .to(device).requires_grad_(True) for j in range(len(starts[0]))]
    bufs = [torch.zeros_like(p) for p in params]
    last = torch.zeros(n, dtype=torch.float64, device=device)
    e_count, s_count, big = plan.index.shape[:3]
    chans = spec.in_channels

    def batch(e: int, s: int) -> tuple[Any, Any, Any]:
        ix = plan.index[e, s]                                          # (B, n)
        x = x_all[ix].reshape(big, n * chans, spec.size, spec.size)
        return (x.contiguous(memory_format=torch.channels_last), y_all[ix.T],
                None if plan.weight is None else plan.weight[e, s].T)

    def losses(forward: Callable[..., Any], x: Any, y: Any, w: Any) -> tuple[Any, Any]:
        with _autocast(device, precision):
            logits = forward(params, x, n)
        ce = F.cross_entropy(logits.float().reshape(n * big, -1), y.reshape(-1),
                             reduction="none").view(n, big)
        if w is None:
            return ce.mean(1).sum(), ce.detach()
        ce = ce * w
        return (ce.sum(1) / w.sum(1).clamp(min=1.0)).sum(), ce.detach()

    with arithmetic(device, precision):
        first = batch(0, 0) if e_count and s_count else None
        forward = FORWARD[_conv(conv, spec, n, big, device, precision,
                                lambda f: torch.autograd.grad(losses(f, *first)[0], params))
                          if first is not None else "grouped"]
        for e in range(e_count):
            for s in range(s_count):
                x, y, w = batch(e, s)
                loss, ce = losses(forward, x, y, w)
                grads = torch.autograd.grad(loss, params)
                with torch.no_grad():
                    _sgd(params, list(grads), bufs, lr, momentum, weight_decay,
                         None if plan.active is None else plan.active[e, s])
                    if e == e_count - 1:
                        last += ce.sum(1, dtype=torch.float64)
        host = [p.detach().cpu().numpy() for p in params]
        total = last.cpu().numpy()
    weights = [[np.array(h[i], dtype=np.float32, order="C") for h in host] for i in range(n)]
    loss = [float(t / c) if c else (0.0 if e_count else float("nan"))
            for t, c in zip(total, plan.count, strict=True)]
    return weights, loss


def _sgd(params: list[Any], grads: list[Any], bufs: list[Any], lr: float, momentum: float,
         weight_decay: float, active: Any | None) -> None:
    """One step of torch.optim.SGD (momentum, weight decay, no dampening) for every client;
    with ``active`` (n,) only the clients it marks move."""
    import torch

    if active is None:
        torch._foreach_add_(grads, params, alpha=weight_decay)
        torch._foreach_mul_(bufs, momentum)
        torch._foreach_add_(bufs, grads)
        torch._foreach_add_(params, bufs, alpha=-lr)
        return
    for p, g, buf in zip(params, grads, bufs, strict=True):
        mask = active.view((-1,) + (1,) * (p.dim() - 1))
        step = buf.mul(momentum).add_(g.add(p, alpha=weight_decay))
        buf.copy_(torch.where(mask, step, buf))
        p.copy_(torch.where(mask, p - lr * step, p))


def _conv(conv: str, spec: Any, n: int, big: int, device: str, precision: str,
          trial: Callable[[Callable[..., Any]], Any]) -> str:
    """The convolution layout: ``conv``, or for ``auto`` on CUDA the fastest
    (:func:`tune`, remembered per shape; ``grouped`` on the CPU)."""
    if conv != "auto":
        return conv
    if not str(device).startswith("cuda"):
        return "grouped"
    key = (spec, n, big, str(device), precision)
    if key not in _CHOSEN:
        _CHOSEN[key], times = tune(device, trial)
        LOG.info("emdcfl batched training: conv=%s (seconds per 3 steps: %s)", _CHOSEN[key],
                 {k: round(v, 4) for k, v in times.items()})
    return _CHOSEN[key]


def tune(device: str, trial: Callable[[Callable[..., Any]], Any], steps: int = 3
         ) -> tuple[str, dict[str, float]]:
    """The fastest layout of :data:`FORWARD` for one training step (``trial(forward)``:
    forward and backward on the first minibatch), timed over ``steps`` after two warm-up
    steps; a layout that fails is left out. Returns it and every layout's seconds."""
    times = {}
    for name, forward in FORWARD.items():
        try:
            for _ in range(2):
                trial(forward)
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(steps):
                trial(forward)
            _sync(device)
            times[name] = time.perf_counter() - t0
        except RuntimeError as exc:          # e.g. no kernel for this layout, out of memory
            LOG.warning("emdcfl batched training: conv=%s failed (%s)", name, exc)
    return (min(times, key=times.__getitem__) if times else "grouped"), times


def time_step(spec: Any, n: int, batch_size: int, device: str, conv: str = "grouped",
              precision: str = "tf32", steps: int = 10, warmup: int = 3) -> float:
    """Seconds per stacked training step (forward, backward, SGD update) of ``n`` clients
    with ``batch_size`` random images each, for one layout and precision: the benchmark
    behind ``bench/gpu_check.py``'s comparison of the layouts."""
    import torch
    from torch.nn import functional as F

    from fedclust.emdcfl.model import init_weights

    w = init_weights(spec, 0)
    params = [torch.from_numpy(np.stack([a] * n)).to(device).requires_grad_(True) for a in w]
    bufs = [torch.zeros_like(p) for p in params]
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch_size, n * spec.in_channels, spec.size, spec.size, generator=gen)
    x = x.to(device).contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, spec.num_classes, (n, batch_size), generator=gen).to(device)
    forward = FORWARD[conv]
    with arithmetic(device, precision):
        def step() -> None:
            with _autocast(device, precision):
                logits = forward(params, x, n)
            loss = F.cross_entropy(logits.float().reshape(n * batch_size, -1),
                                   y.reshape(-1), reduction="none").view(n, -1).mean(1).sum()
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                _sgd(params, list(grads), bufs, 0.01, 0.9, 1e-6, None)

        for _ in range(warmup):
            step()
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        _sync(device)
    return (time.perf_counter() - t0) / max(steps, 1)


def train_many(s: EMDCFLSettings, data: Sequence[ClientSplit], starts: Sequence[Weights],
               rnd: int, seeds: Sequence[int], device: str, batching: Batching
               ) -> tuple[list[Weights], list[float]]:
    """Alg. 1 line 5 for several clients (:func:`fedclust.emdcfl.client.train` each):
    stacked, or the per-client kernels one client after another."""
    if not batching.stacked(device):
        out = [client.train(s, d, w, rnd, seed, device)
               for d, w, seed in zip(data, starts, seeds, strict=True)]
        return [o[0] for o in out], [o[1] for o in out]
    return train_stacked(s.spec, starts, [d.x_train for d in data], [d.y_train for d in data],
                         s.epochs(rnd), s.lr, s.batch_size, seeds, device, batching.conv,
                         batching.precision)


# ------------------------------------------------------------------------------ inference

def _tensor(x: NDArray, device: str) -> Any:
    from fedclust.emdcfl.model import to_tensor

    return to_tensor(x).to(device)


def _converter(device: str) -> Callable[[ClientSplit, str], Any]:
    """``(data, part) -> device tensor``, each split converted once per call site."""
    done: dict[tuple[int, str], Any] = {}

    def conv(d: ClientSplit, part: str) -> Any:
        key = (id(d), part)
        if key not in done:
            done[key] = _tensor(getattr(d, part), device)
        return done[key]

    return conv


def _chunks(weights: Weights, x: Any, chunk: int, head: bool, device: str) -> Iterator[Any]:
    """The embeddings (``head`` False) or logits of ``x`` under one model, chunk by chunk."""
    from torch.nn import functional as F

    from fedclust.emdcfl.model import _features, _tensors

    w = _tensors(weights, device)
    for s0 in range(0, len(x), chunk):
        h = _features(w, x[s0:s0 + chunk])
        yield F.linear(h, w[6], w[7]) if head else h


def embed_stacked(spec: Any, models: Sequence[Weights], images: Sequence[Sequence[Any]],
                  device: str, chunk: int = 4096, precision: str = "tf32"
                  ) -> list[list[NDArray[np.float32]]]:
    """Embeddings of ``images[k]`` (a list of image tensors already on ``device``, as
    :func:`fedclust.emdcfl.model.to_tensor` makes them) under ``models[k]``: per model one
    pass over the concatenated images in chunks of ``chunk``; host arrays, split back."""
    import torch

    out = []
    with torch.no_grad(), arithmetic(device, "fp32" if precision == "fp32" else "tf32"):
        for weights, xs in zip(models, images, strict=True):
            sizes = [len(x) for x in xs]
            if not sum(sizes):
                out.append([np.zeros((0, spec.embed_dim), np.float32) for _ in xs])
                continue
            x = torch.cat(list(xs)) if len(xs) > 1 else xs[0]
            e = torch.cat(list(_chunks(weights, x, chunk, False, device))).float().cpu()
            out.append([a.numpy() for a in torch.split(e, sizes)])
    return out


def evaluate_stacked(models: Sequence[Weights], sets: Sequence[Sequence[tuple[Any, Any]]],
                     device: str, chunk: int = 4096, precision: str = "tf32"
                     ) -> list[list[tuple[float, float]]]:
    """``(mean cross-entropy, accuracy)`` (:func:`fedclust.emdcfl.model.evaluate`) of
    ``models[k]`` on each ``(x, y)`` of ``sets[k]`` (tensors on ``device``): one pass per
    model over the concatenated sets; NaN for an empty set."""
    import torch
    from torch.nn import functional as F

    out = []
    with torch.no_grad(), arithmetic(device, "fp32" if precision == "fp32" else "tf32"):
        for weights, pairs in zip(models, sets, strict=True):
            sizes = [len(y) for _, y in pairs]
            if not sum(sizes):
                out.append([(float("nan"), float("nan")) for _ in pairs])
                continue
            x = torch.cat([x for x, _ in pairs])
            y = torch.cat([y for _, y in pairs])
            logits = torch.cat(list(_chunks(weights, x, chunk, True, device))).float()
            ce = F.cross_entropy(logits, y, reduction="none").double()
            hit = (logits.argmax(1) == y).double()
            seg = torch.repeat_interleave(torch.arange(len(sizes), device=device),
                                          torch.tensor(sizes, device=device))
            sums = torch.zeros((2, len(sizes)), dtype=torch.float64, device=device)
            sums[0].index_add_(0, seg, ce)
            sums[1].index_add_(0, seg, hit)
            sums = sums.cpu().numpy()
            out.append([(float(sums[0, j] / m), float(sums[1, j] / m)) if m
                        else (float("nan"), float("nan")) for j, m in enumerate(sizes)])
    return out


def ifca_many(s: EMDCFLSettings, data: Sequence[ClientSplit], models: Sequence[Weights],
              rnd: int, seeds: Sequence[int], device: str, batching: Batching,
              tensor: Callable[[ClientSplit, str], Any] | None = None
              ) -> list[tuple[Weights, float, int, int, list[float]]]:
    """IFCA's client step (:func:`fedclust.emdcfl.client.ifca`) for several clients: the
    validation loss of every cluster model on every client (stacked: one pass per model over
    all validation splits), each client's choice, then :func:`train_many`."""
    if not batching.stacked(device):
        return [client.ifca(s, d, models, rnd, seed, device)
                for d, seed in zip(data, seeds, strict=True)]
    conv = tensor or _converter(device)
    sets = [[(conv(d, "x_val"), _labels(d.y_val, device)) for d in data] for _ in models]
    val = np.array([[v[0] for v in row] for row in evaluate_stacked(
        models, sets, device, batching.chunk, batching.precision)])     # (k, clients)
    choice = [int(np.argmin(val[:, j])) for j in range(len(data))]
    new, loss = train_many(s, data, [models[c] for c in choice], rnd, seeds, device, batching)
    return [(w, ls, len(d.y_train), c, val[:, j].tolist())
            for j, (d, w, ls, c) in enumerate(zip(data, new, loss, choice, strict=True))]


def test_many(s: EMDCFLSettings, data: Sequence[ClientSplit], weights: Sequence[Weights],
              device: str, batching: Batching, part: str = "x_test",
              tensor: Callable[[ClientSplit, str], Any] | None = None
              ) -> list[tuple[float, float]]:
    """``(loss, accuracy)`` of ``weights[i]`` on client ``i``'s split ``part`` (``x_test``,
    or ``x_test_bd``, with ``y_test``): :func:`fedclust.emdcfl.client.test`, stacked as one
    pass per distinct model (the same object) over its clients' sets."""
    from fedclust.emdcfl.model import evaluate

    if not batching.stacked(device):
        return [evaluate(s.spec, w, getattr(d, part), d.y_test, device=device)
                for d, w in zip(data, weights, strict=True)]
    conv = tensor or _converter(device)
    groups: dict[int, list[int]] = {}
    for i, w in enumerate(weights):
        groups.setdefault(id(w), []).append(i)
    order = list(groups.values())
    rows = evaluate_stacked([weights[g[0]] for g in order],
                            [[(conv(data[i], part), _labels(data[i].y_test, device)) for i in g]
                             for g in order], device, batching.chunk, batching.precision)
    out: list[tuple[float, float]] = [(float("nan"), float("nan"))] * len(data)
    for g, row in zip(order, rows, strict=True):
        for i, r in zip(g, row, strict=True):
            out[i] = r
    return out


def _labels(y: NDArray, device: str) -> Any:
    import torch

    return torch.from_numpy(np.asarray(y, dtype=np.int64)).to(device)


@dataclass
class EmbedJob:
    """One client's part of the embedding exchange (:func:`fedclust.emdcfl.client.embed_pairs`
    's inputs): its data, its own model, its peers (in order) with their models, and its
    :class:`~fedclust.emdcfl.privacy.PairContext` with each peer. Models that are the same
    object in several jobs are embedded with once per image set."""

    data: ClientSplit
    own: Weights
    peers: list[int]
    models: list[Weights]
    pair: Callable[[int], PairContext]


def embed_jobs(s: EMDCFLSettings, jobs: Sequence[EmbedJob], device: str, batching: Batching,
               tensor: Callable[[ClientSplit, str], Any] | None = None,
               seconds: dict[str, float] | None = None
               ) -> list[tuple[dict[str, NDArray], dict[str, NDArray], dict[str, float]]]:
    """:func:`~fedclust.emdcfl.client.embed_pairs` for every job: ``(src, tgt, reference)``
    per job. Stacked: one pass per distinct model over every image set it embeds (its
    clients' train splits, every validation split it is sent with); per client: the
    per-client kernels. Either way the reference distances of all jobs are solved together
    (``emdcfl.workers`` processes). ``tensor(data, part)`` gives a split as a device tensor
    (default: converted here); ``seconds`` adds ``embed``/``project``/``reference`` times."""
    from fedclust.emdcfl.model import embed, embed_many

    t0 = time.perf_counter()
    e_train: list[NDArray] = [np.zeros(0)] * len(jobs)
    e_val: list[list[NDArray]] = [[] for _ in jobs]       # own model first, then the peers'
    if batching.stacked(device):
        conv = tensor or _converter(device)
        models: dict[int, Weights] = {}
        wants: dict[int, list[tuple[int, int]]] = {}      # model -> (job, -1 train | slot)
        for j, job in enumerate(jobs):
            for slot, w in enumerate([job.own, *job.models]):
                models[id(w)] = w
                wants.setdefault(id(w), []).append((j, slot))
            wants[id(job.own)].append((j, -1))
        for j in range(len(jobs)):
            e_val[j] = [np.zeros(0)] * (len(jobs[j].models) + 1)
        keys = list(models)
        got = embed_stacked(s.spec, [models[k] for k in keys],
                            [[conv(jobs[j].data, "x_train" if slot < 0 else "x_val")
                              for j, slot in wants[k]] for k in keys],
                            device, batching.chunk, batching.precision)
        for k, parts in zip(keys, got, strict=True):
            for (j, slot), e in zip(wants[k], parts, strict=True):
                if slot < 0:
                    e_train[j] = e
                else:
                    e_val[j][slot] = e
    else:                # the per-client kernels: exactly client.embed_pairs's embeddings
        for j, job in enumerate(jobs):
            e_train[j] = embed(s.spec, job.own, job.data.x_train, device=device)
            e_val[j] = embed_many(s.spec, [job.own, *job.models], job.data.x_val,
                                  device=device)
    t1 = time.perf_counter()
    out, pending = [], []
    for j, job in enumerate(jobs):
        src, tgt, own_val = client.pair_clouds(s, job.peers, e_train[j], e_val[j][0],
                                               e_val[j][1:], job.pair)
        out.append((src, tgt, {}))
        pending += [(j, str(o), src[str(o)], own_val[str(o)]) for o in job.peers]
    t2 = time.perf_counter()
    refs = s.solver.many([(p, q) for _, _, p, q in pending]) if pending else []
    for (j, o, _, _), value in zip(pending, refs, strict=True):
        out[j][2][o] = float(value)
    if seconds is not None:
        seconds["embed"] += t1 - t0
        seconds["project"] += t2 - t1
        seconds["reference"] += time.perf_counter() - t2
    return out


class SecretCache:
    """X25519 shared secrets by pair: both members of a pair derive the same, so an
    in-process simulation computes it once (keyed by the two public keys)."""

    def __init__(self) -> None:
        self._known: dict[frozenset[bytes], bytes] = {}

    def pair(self, private: bytes, public: bytes, me: int, peer_public: bytes, peer: int,
             s: EMDCFLSettings) -> PairContext:
        """The :class:`PairContext` of the owner of ``(private, public)`` with the peer of
        ``peer_public``; ``me``/``peer``: the ids that name them in the pair seed."""
        key = frozenset((bytes(public), bytes(peer_public)))
        if key not in self._known:
            self._known[key] = shared_secret(private, peer_public)
        return PairContext(private, me, peer, peer_public, s.spec.embed_dim, s.proj_ratio,
                           s.projection, secret=self._known[key])


# ------------------------------------------------------------------------------ the clients

class BatchedClients(InMemoryClients):
    """:class:`~fedclust.emdcfl.inmemory.InMemoryClients` whose phases run every client
    together (module docstring): the same clients, data, seeds and keys, so
    :func:`fedclust.emdcfl.loop.run` over them gives the per-client run's clusters (and, on
    the CPU with the default :class:`Batching`, bit for bit its numbers).

    Parameters
    ----------
    s : EMDCFLSettings
    data : sequence of ClientSplit
    batching : Batching, optional
        Stacked or per-client kernels, convolution layout, precision.

    Attributes
    ----------
    seconds : dict
        Wall seconds spent per part, summed over the run: ``train``, ``embed`` (the models'
        forward passes), ``project`` (pair keys, subsamples and projections), ``reference``
        (the clients' reference distances), ``evaluate``.
    """

    def __init__(self, s: EMDCFLSettings, data: Sequence[ClientSplit],
                 batching: Batching | None = None) -> None:
        super().__init__(s, data)
        self.batching = batching or Batching()
        self.seconds = {"train": 0.0, "embed": 0.0, "project": 0.0, "reference": 0.0,
                        "evaluate": 0.0}
        self._secrets = SecretCache()
        self._tensors: dict[tuple[int, str], Any] = {}
        self._index = {id(d): i for i, d in enumerate(self.data)}

    @classmethod
    def simulated(cls, s: EMDCFLSettings, n: int, batching: Batching | None = None
                  ) -> BatchedClients:
        """``n`` clients holding the partitions of the run's simulated dataset."""
        return cls(s, [client.simulated_split(s, i, n) for i in range(n)], batching)

    @property
    def stacked(self) -> bool:
        return self.batching.stacked(self.device)

    def _on_device(self, i: int, part: str) -> Any:
        """Client ``i``'s split ``part`` as a device tensor (converted once per run)."""
        key = (i, part)
        if key not in self._tensors:
            self._tensors[key] = _tensor(getattr(self.data[i], part), self.device)
        return self._tensors[key]

    def train(self, rnd: int, models: Mapping[int, Weights], keygen: bool) -> Trained:
        t0, out = time.perf_counter(), Trained()
        ids = sorted(models)
        new, losses = train_many(self.s, [self.data[i] for i in ids], [models[i] for i in ids],
                                 rnd, [self._seed(i, rnd) for i in ids], self.device,
                                 self.batching)
        for i, w, loss in zip(ids, new, losses, strict=True):
            out.models[i], out.losses[i], out.counts[i] = w, loss, len(self.data[i].y_train)
            if keygen:
                out.pubs[i] = self.keys[i][1]
        out.seconds = time.perf_counter() - t0
        self.seconds["train"] += out.seconds
        return out

    def ifca(self, rnd: int, models: Sequence[Weights]) -> Trained:
        t0, out = time.perf_counter(), Trained()
        got = ifca_many(self.s, self.data, models, rnd, [self._seed(i, rnd) for i in self.ids],
                        self.device, self.batching, self._tensor)
        for i, (w, loss, n, choice, _) in zip(self.ids, got, strict=True):
            out.models[i], out.losses[i], out.counts[i], out.choices[i] = w, loss, n, choice
        out.seconds = time.perf_counter() - t0
        self.seconds["train"] += out.seconds
        return out

    def _tensor(self, d: ClientSplit, part: str) -> Any:
        return self._on_device(self._index[id(d)], part)

    def embed(self, rnd: int, members: list[int], models: Mapping[int, Weights],
              pubs: Mapping[int, bytes]) -> Clouds:
        t0, out = time.perf_counter(), Clouds()
        jobs = []
        for c in members:
            peers = [o for o in members if o != c]
            private, public = self.keys[c]
            jobs.append(EmbedJob(
                self.data[c], models[c], peers, [models[o] for o in peers],
                lambda o, private=private, public=public: self._secrets.pair(
                    private, public, key_id(public), pubs[o], key_id(pubs[o]), self.s)))
        got = embed_jobs(self.s, jobs, self.device, self.batching, self._tensor, self.seconds)
        for c, (src, tgt, reference) in zip(members, got, strict=True):
            out.replies[c] = {"src": src, "tgt": tgt, "reference": reference}
        out.seconds = time.perf_counter() - t0
        return out

    def final(self, models: Mapping[int, Weights], found: Mapping[int, int]) -> Final:
        t0, out = time.perf_counter(), Final(answered=len(models))
        ids = sorted(models)
        data = [self.data[i] for i in ids]
        tests = test_many(self.s, data, [models[i] for i in ids], self.device, self.batching,
                          tensor=self._tensor)
        if self.s.evaluate:
            bd = [i for i in ids if self._backdoor(i)]
            bd_acc = dict(zip(bd, (r[1] for r in test_many(
                self.s, [self.data[i] for i in bd], [models[i] for i in bd], self.device,
                self.batching, "x_test_bd", self._tensor)), strict=True))
            for i, (_, acc) in zip(ids, tests, strict=True):
                out.evaluations[i] = Evaluation(acc, int(self.data[i].cluster),
                                                len(self.data[i].y_test), bd_acc.get(i))
        out.seconds = time.perf_counter() - t0
        self.seconds["evaluate"] += out.seconds
        return out

    def _backdoor(self, i: int) -> bool:
        d = self.data[i]
        return d.x_test_bd is not None and d.set_id == 0
