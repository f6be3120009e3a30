"""Stacked fully connected autoencoders (paper 000 §5.2: d-100-64-32 and mirrored).

A client owns several small autoencoders (one per local cluster, one per community it takes
part in). They are trained *together*: the weights of M models are stacked into tensors of shape
``(M, in, out)`` and every layer is one batched matmul (``torch.baddbmm``). Each model still
sees only its own data, takes its own mini-batch steps and has its own Adam state and early
stopping, exactly as if it were trained alone (a per-model step mask keeps models with fewer
batches, or stopped early, untouched).

Architecture: ReLU hidden layers, sigmoid output, MSE loss, Adam (lr 1e-3 by default).
Reconstruction error of a sample = mean squared error over its features (the reference code's
``mean((pred - x)^2, axis=1)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

Params = list[torch.Tensor]   # [W0, b0, W1, b1, ...]; W_l (M, in, out), b_l (M, 1, out)


def layer_sizes(n_features: int, hidden: Sequence[int]) -> list[int]:
    """``[d, h1, ..., hk, ..., h1, d]`` — the encoder and its mirrored decoder."""
    hidden = list(hidden)
    return [n_features, *hidden, *hidden[-2::-1], n_features]


def init_params(n_models: int, sizes: Sequence[int], seed: int, kind: str = "keras") -> Params:
    """Independent initialisation of each stacked model.

    ``kind="keras"`` (the reference code's Keras ``Dense`` defaults): weights glorot-uniform
    U(±√(6/(fan_in+fan_out))), biases zero. ``kind="torch"`` (PyTorch ``nn.Linear``): weights
    and biases U(±1/√fan_in).
    """
    if kind not in ("keras", "torch"):
        raise ValueError(f"unknown autoencoder init {kind!r}: expected 'keras' or 'torch'")
    gen = torch.Generator().manual_seed(int(seed) & 0x7FFF_FFFF_FFFF_FFFF)
    params: Params = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:], strict=False):
        if kind == "keras":
            limit = float(np.sqrt(6.0 / (fan_in + fan_out)))
            params.append((torch.rand(n_models, fan_in, fan_out, generator=gen) * 2 - 1) * limit)
            params.append(torch.zeros(n_models, 1, fan_out))
        else:
            bound = 1.0 / float(np.sqrt(fan_in))
            params.append((torch.rand(n_models, fan_in, fan_out, generator=gen) * 2 - 1) * bound)
            params.append((torch.rand(n_models, 1, fan_out, generator=gen) * 2 - 1) * bound)
    return params


def forward(params: Params, x: torch.Tensor) -> torch.Tensor:
    """Reconstruct ``x`` of shape ``(M, B, d)`` with the M stacked models."""
    h = x
    n_layers = len(params) // 2
    for layer in range(n_layers):
        h = torch.baddbmm(params[2 * layer + 1], h, params[2 * layer])
        h = torch.sigmoid(h) if layer == n_layers - 1 else torch.relu(h)
    return h


def to_numpy(params: Params) -> dict[str, NDArray[np.float32]]:
    """Named float32 arrays ``W0, b0, ...`` (stacked over models) for messages."""
    return {f"{'W' if i % 2 == 0 else 'b'}{i // 2}": p.detach().cpu().numpy().astype(np.float32)
            for i, p in enumerate(params)}


def from_numpy(arrays: dict[str, NDArray]) -> Params:
    """Inverse of :func:`to_numpy`."""
    n_layers = sum(1 for k in arrays if k.startswith("W"))
    out: Params = []
    for layer in range(n_layers):
        out.append(torch.as_tensor(np.asarray(arrays[f"W{layer}"], dtype=np.float32)))
        out.append(torch.as_tensor(np.asarray(arrays[f"b{layer}"], dtype=np.float32)))
    return out


def select(params: Params, index: Sequence[int] | NDArray[np.int64]) -> Params:
    """The stacked models at positions ``index``."""
    idx = torch.as_tensor(np.asarray(index, dtype=np.int64))
    return [p.index_select(0, idx).clone() for p in params]


def concat(parts: Sequence[Params]) -> Params:
    """Stack several model stacks into one."""
    parts = [p for p in parts if p and p[0].shape[0] > 0]
    return [torch.cat([p[i] for p in parts], 0) for i in range(len(parts[0]))]


def n_models(params: Params) -> int:
    return int(params[0].shape[0]) if params else 0


def fedavg(stacks: Sequence[Params], weights: Sequence[float]) -> Params:
    """FedAvg: the weighted mean of the same model(s) trained by several clients.

    ``stacks[c]`` holds client c's version of the M models (shape ``(M, ...)``); ``weights[c]``
    its sample count. Returns the aggregate ``Σ_c w_c θ_c / Σ_c w_c``.
    """
    w = torch.as_tensor(np.asarray(weights, dtype=np.float64), dtype=torch.float64)
    w = w / w.sum()
    return [sum(float(w[c]) * stacks[c][i].double() for c in range(len(stacks))).float()
            for i in range(len(stacks[0]))]


@dataclass
class TrainInfo:
    epochs: NDArray[np.int64]        # epochs actually run per model
    final_loss: NDArray[np.float64]  # last epoch's mean training loss per model
    steps: int                       # stacked optimizer steps taken


def train(call: TrainCall, streams: Sequence[tuple[int, int]] | None = None,
          device: str = "cpu", fused: bool | None = None) -> tuple[Params, TrainInfo]:
    """Train M stacked autoencoders, model m on ``datasets[m]`` only (MSE, Adam).

    Each epoch model m visits a fresh permutation of its own samples in ⌈n_m / B⌉ mini-batches
    (model m's shuffling stream depends only on ``seed`` and m, or on ``streams[m]``).
    Early stopping (``patience > 0``, Keras ``EarlyStopping(monitor="loss")``): a model whose
    epoch loss has not improved for ``patience`` epochs stops and keeps its current weights.

    Parameters
    ----------
    call : :class:`TrainCall`
        ``params``: the stacked parameters (modified copies are returned, on the CPU; inputs
        untouched); ``datasets``: M arrays ``(n_m, d)`` in [0, 1]; ``epochs`` (an int, or one
        per model), ``batch_size``, ``lr``, ``patience``, ``seed``.
    streams : M pairs ``(seed, index)``, optional
        Model m's shuffling stream is ``default_rng([seed, index])`` (default ``(seed, m)``):
        models of several clients trained together keep the streams each client's own call
        would give them, so the result is each client's own training.
    device : str
        Torch device of the training. Every step runs on it without waiting for the host:
        the batches and step masks of an epoch go over once, the losses come back once per
        epoch (with early stopping) or once at the end.
    fused : bool, optional
        One parameter buffer for all layers (default: on CUDA); the same numbers either way.

    Returns
    -------
    params, TrainInfo
    """
    params, datasets, epochs, lr, seed = call.params, call.datasets, call.epochs, call.lr, call.seed
    m_count = n_models(params)
    assert len(datasets) == m_count, "one dataset per stacked model"
    dev = torch.device(device)
    opt = _Adam(params, dev, fused if fused is not None else dev.type == "cuda")
    t_step = torch.zeros(m_count, device=dev)
    sizes = np.array([len(d) for d in datasets], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)
    xcat = torch.as_tensor(np.concatenate([np.asarray(d, dtype=np.float32)
                                           for d in datasets])).to(dev)
    if streams is None:
        streams = [(int(seed), m) for m in range(m_count)]
    rngs = [np.random.default_rng([int(s) & 0xFFFF_FFFF, int(j)]) for s, j in streams]
    limit = np.broadcast_to(np.asarray(epochs, dtype=np.int64), (m_count,))
    bsz = int(call.batch_size)
    steps_m = np.maximum(1, -(-sizes // bsz))
    stop = _EarlyStop(sizes, (sizes > 0) & (limit > 0), call.patience)
    running = stop.running
    ran = np.zeros(m_count, dtype=np.int64)
    pending: list[tuple[Any, NDArray[np.bool_]]] = []   # epoch losses not read back yet
    n_steps = 0
    for epoch in range(int(limit.max(initial=0))):
        running &= limit > epoch
        if not running.any():
            break
        s_max = int(steps_m[running].max())
        idx = np.zeros((m_count, s_max * bsz), dtype=np.int64)
        wts = np.zeros((m_count, s_max * bsz), dtype=np.float32)
        for m in np.flatnonzero(running):
            perm = rngs[m].permutation(sizes[m]) + offsets[m]
            idx[m, :sizes[m]] = perm
            wts[m, :sizes[m]] = 1.0
        # which models step: a model with no samples left in this step, or stopped, does not
        steps_on = (wts.reshape(m_count, s_max, bsz).sum(2) > 0) & running[:, None]
        n_on = int(steps_on.any(0).sum())       # steps with a model on (a prefix)
        idx_t, wts_t = torch.as_tensor(idx).to(dev), torch.as_tensor(wts).to(dev)
        on_t = torch.as_tensor(steps_on.T.astype(np.float32)).to(dev)   # (s_max, M)
        ep_loss = torch.zeros(m_count, dtype=torch.float64, device=dev)
        for s in range(n_on):
            sl = slice(s * bsz, (s + 1) * bsz)
            w = wts_t[:, sl]
            cnt = w.sum(1)
            a = on_t[s]
            xb = xcat[idx_t[:, sl]]
            layers = opt.layers()
            rec = forward(layers, xb)
            per_sample = ((rec - xb) ** 2).mean(2)                     # (M, B)
            per_model = (per_sample * w).sum(1) / cnt.clamp(min=1)      # (M,)
            loss = (per_model * a).sum()
            grads = torch.autograd.grad(loss, layers)
            ep_loss += (per_sample.detach() * w).sum(1).double()
            with torch.no_grad():
                t_step += a
                tt = t_step.clamp(min=1)
                opt.step(list(grads), a, 1 - _Adam.beta1 ** tt, 1 - _Adam.beta2 ** tt, lr)
            n_steps += 1
        ran[running] += 1
        pending.append((ep_loss, running.copy()))
        if call.patience > 0:
            stop.epoch_ends(pending)
    stop.epoch_ends(pending)
    return opt.result(), TrainInfo(ran, stop.last, n_steps)


class _Adam:
    """The stacked models' parameters and Adam state (Keras defaults), per-model steps.

    ``fused``: every model's parameters in one ``(M, P)`` buffer with the layers as views of
    it, so a step is a few whole-buffer operations whatever the number of layers (a GPU runs
    them without waiting on launches); else one tensor per layer (faster on the CPU, where
    the strided views cost copies). Both apply the same arithmetic to every element."""

    beta1, beta2, eps = 0.9, 0.999, 1e-7

    def __init__(self, params: Params, dev: torch.device, fused: bool) -> None:
        self.fused, self.m = fused, n_models(params)
        self.shapes = [tuple(p.shape) for p in params]
        if fused:
            widths = [int(np.prod(s[1:], dtype=np.int64)) for s in self.shapes]
            self.cuts = np.concatenate([[0], np.cumsum(widths)]).astype(int).tolist()
            self.flat = torch.cat([p.detach().reshape(self.m, -1) for p in params], 1).to(dev)
            self.m1, self.m2 = torch.zeros_like(self.flat), torch.zeros_like(self.flat)
        else:
            self.params = [p.detach().to(dev).clone().requires_grad_(True) for p in params]
            self.m1s = [torch.zeros_like(p) for p in self.params]
            self.m2s = [torch.zeros_like(p) for p in self.params]

    def layers(self) -> Params:
        """The parameters to differentiate this step."""
        if not self.fused:
            return self.params
        return [self.flat[:, self.cuts[j]:self.cuts[j + 1]].view(s).detach()
                .requires_grad_(True) for j, s in enumerate(self.shapes)]

    def step(self, grads: Params, a: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor,
             lr: float) -> None:
        """One Adam step of the models that ``a`` (M,) marks; ``c1``, ``c2`` (M,): the bias
        corrections."""
        b1, b2, eps = self.beta1, self.beta2, self.eps
        if self.fused:
            g = torch.cat([gr.reshape(self.m, -1) for gr in grads], 1)
            af, c1, c2 = a.view(-1, 1), c1.view(-1, 1), c2.view(-1, 1)
            self.m1.mul_(1 - af * (1 - b1)).add_(af * (1 - b1) * g)
            self.m2.mul_(1 - af * (1 - b2)).add_(af * (1 - b2) * g * g)
            self.flat.sub_(af * (lr * (self.m1 / c1) / ((self.m2 / c2).sqrt() + eps)))
            return
        for p, g, mm, vv in zip(self.params, grads, self.m1s, self.m2s, strict=True):
            shape = (self.m,) + (1,) * (p.dim() - 1)
            af = a.view(shape)
            mm.mul_(1 - af * (1 - b1)).add_(af * (1 - b1) * g)
            vv.mul_(1 - af * (1 - b2)).add_(af * (1 - b2) * g * g)
            step = lr * (mm / c1.view(shape)) / ((vv / c2.view(shape)).sqrt() + eps)
            p.sub_(af * step)

    def result(self) -> Params:
        """The trained parameters, on the CPU."""
        if not self.fused:
            return [p.detach().cpu() for p in self.params]
        flat = self.flat.cpu()
        return [flat[:, self.cuts[j]:self.cuts[j + 1]].reshape(s).clone()
                for j, s in enumerate(self.shapes)]


class _EarlyStop:
    """Keras ``EarlyStopping(monitor="loss")`` per model: ``running[m]`` turns False once
    model m's epoch loss has not improved for ``patience`` epochs (never with 0)."""

    def __init__(self, sizes: NDArray[np.int64], running: NDArray[np.bool_],
                 patience: int) -> None:
        self.sizes, self.running, self.patience = sizes, running, patience
        self.best = np.full(len(sizes), np.inf)
        self.wait = np.zeros(len(sizes), dtype=np.int64)
        self.last = np.full(len(sizes), np.nan)          # the last epoch's mean loss

    def epoch_ends(self, pending: list[tuple[Any, NDArray[np.bool_]]]) -> None:
        """Read back the epoch losses of ``pending`` (in order) and apply early stopping."""
        for ep_loss, ran in pending:
            loss = ep_loss.cpu().numpy() / np.maximum(self.sizes, 1)
            for m in np.flatnonzero(ran):
                self.last[m] = loss[m]
                if loss[m] < self.best[m]:
                    self.best[m], self.wait[m] = loss[m], 0
                else:
                    self.wait[m] += 1
                    if self.patience > 0 and self.wait[m] >= self.patience:
                        self.running[m] = False
        pending.clear()


@dataclass
class TrainCall:
    """One :func:`train` call, to run alone or together with others (:func:`train_calls`):
    the stacked models, one dataset per model, and the training's hyperparameters."""

    params: Params
    datasets: Sequence[NDArray[np.float32]]
    epochs: int | Sequence[int]
    batch_size: int = 128
    lr: float = 1e-3
    patience: int = 0
    seed: int = 0

    def run(self, device: str = "cpu") -> Params:
        return train(self, device=device)[0]


def train_calls(calls: Sequence[TrainCall], device: str = "cpu", merge: bool = True
                ) -> list[Params]:
    """Every call's trained models. With ``merge``, the calls with the same batch size,
    learning rate and patience run as one stacked :func:`train`, each model keeping the
    shuffling stream and epochs its own call gives it, so that every model trains as in its
    own call (one computation for several clients' models, e.g. on a GPU)."""
    out: list[Params | None] = [None] * len(calls)
    if not merge:
        return [c.run(device) for c in calls]
    groups: dict[tuple[int, float, int], list[int]] = {}
    for i, c in enumerate(calls):
        if n_models(c.params):
            groups.setdefault((c.batch_size, c.lr, c.patience), []).append(i)
        else:
            out[i] = list(c.params)
    for (batch, lr, patience), members in groups.items():
        parts = [calls[i] for i in members]
        streams = [(c.seed, j) for c in parts for j in range(n_models(c.params))]
        epochs = [c.epochs for c in parts for _ in range(n_models(c.params))]
        merged = TrainCall(concat([c.params for c in parts]),
                           [d for c in parts for d in c.datasets], epochs, batch, lr, patience)
        trained, _ = train(merged, streams=streams, device=device)
        start = 0
        for i, c in zip(members, parts, strict=True):
            stop = start + n_models(c.params)
            out[i] = [p[start:stop].clone() for p in trained]
            start = stop
    return [o if o is not None else [] for o in out]


@torch.no_grad()
def errors(params: Params | Sequence[Params], x: NDArray[np.float32] | torch.Tensor,
           max_elems: int = 1 << 24, device: str = "cpu") -> NDArray[np.float32]:
    """Per-sample reconstruction error of every stacked model on every sample: ``(M, N)``.

    One forward pass per model over all samples (each layer one GEMM ``addmm`` over the whole
    batch, activations in place); samples are processed in chunks so that a reconstruction
    never exceeds ``max_elems`` floats. (Measured on this machine, this beats a single batched
    ``bmm`` over all models, which has to copy the permuted first-layer output: see
    bench/bench_fedcref_ae.py.) ``params`` may also be a sequence of stacks, taken as their
    concatenation (without copying them into one). On ``device`` (the errors come back to
    the host once).
    """
    stacks = ([params] if not params or isinstance(params[0], torch.Tensor)
              else [s for s in params if s])
    dev = torch.device(device)
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32)).to(dev)
    m_count, (n, d) = sum(n_models(s) for s in stacks), xt.shape
    out = torch.empty((m_count, n), dtype=torch.float32, device=dev)
    if m_count == 0 or n == 0:
        return out.cpu().numpy()
    n_chunk = max(1, min(n, max_elems // max(d, 1)))
    row = 0
    for stack in stacks:
        stack = [p.to(dev) for p in stack]
        n_layers = len(stack) // 2
        for m in range(n_models(stack)):
            for n0 in range(0, n, n_chunk):
                xb = xt[n0:n0 + n_chunk]
                h = xb
                for layer in range(n_layers):
                    h = torch.addmm(stack[2 * layer + 1][m], h, stack[2 * layer][m])
                    if layer == n_layers - 1:
                        torch.sigmoid_(h)
                    else:
                        torch.relu_(h)
                h.sub_(xb).square_()
                out[row, n0:n0 + xb.shape[0]] = h.mean(1)
            row += 1
    return out.cpu().numpy()
