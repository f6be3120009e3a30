"""The EMD-CFL model (paper 001, App. D.2) and its local training, evaluation and embedding.

The authors' ``CNN``: ``Conv(in, c1, 3, pad 1) + ReLU → Conv(c1, c2, 3, pad 1) + ReLU +
MaxPool 2 → Linear(c2·(H/2)·(W/2), 128) + ReLU`` (the **embedding**, penultimate layer) →
``Linear(128, classes)``, with ``c1 = 64, c2 = 128`` in the paper. Here ``c1``, ``c2`` and the
embedding width are parameters (the ``cpu`` configuration narrows the convolutions).

Optimiser as in the authors' code: SGD(lr, momentum 0.9, weight decay 1e-6), cross-entropy,
re-created at every local update (momentum restarts each round). Unlike the authors' code,
embeddings are computed in ``eval()`` mode under ``torch.no_grad()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class ModelSpec:
    """Shape of the CNN: input channels/size, conv widths, embedding width, classes."""

    in_channels: int = 1
    size: int = 28
    c1: int = 64
    c2: int = 128
    embed_dim: int = 128
    num_classes: int = 10


class CNN(nn.Module):
    """Two conv layers, a ``embed_dim`` penultimate layer (the embedding), a linear head."""

    def __init__(self, spec: ModelSpec) -> None:
        super().__init__()
        self.spec = spec
        half = spec.size // 2
        self.features = nn.Sequential(
            nn.Conv2d(spec.in_channels, spec.c1, 3, padding=1), nn.ReLU(),
            # MaxPool before ReLU: the same function as the authors' ReLU → MaxPool (ReLU and
            # max commute) with a quarter of the ReLU work; parameter names are unchanged
            nn.Conv2d(spec.c1, spec.c2, 3, padding=1), nn.MaxPool2d(2), nn.ReLU(),
            nn.Flatten(), nn.Linear(spec.c2 * half * half, spec.embed_dim), nn.ReLU())
        self.head = nn.Linear(spec.embed_dim, spec.num_classes)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        return self.features(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


Weights = list[NDArray[np.float32]]


# parameter names of :class:`CNN`'s ``state_dict`` in the order of the weight arrays
STATE_KEYS: tuple[str, ...] = ("features.0.weight", "features.0.bias", "features.2.weight",
                               "features.2.bias", "features.6.weight", "features.6.bias",
                               "head.weight", "head.bias")


def state_dict(weights: Weights) -> dict[str, torch.Tensor]:
    """The weight arrays as a :class:`CNN` ``state_dict`` (``CNN(spec).load_state_dict`` takes
    it; copies, so the arrays may change afterwards)."""
    if len(weights) != len(STATE_KEYS):
        raise ValueError(f"expected {len(STATE_KEYS)} weight arrays, got {len(weights)}")
    return {k: torch.tensor(np.asarray(w, dtype=np.float32)) for k, w in zip(STATE_KEYS, weights)}


def weights_from_state_dict(state: Mapping[str, Any]) -> Weights:
    """The weight arrays of a :class:`CNN` ``state_dict`` (inverse of :func:`state_dict`).

    Raises
    ------
    ValueError
        ``state`` does not hold exactly the CNN's parameters.
    """
    if list(state) != list(STATE_KEYS):
        raise ValueError(f"not an EMD-CFL CNN state_dict: keys {list(state)}, expected "
                         f"{list(STATE_KEYS)}")
    return [np.array(torch.as_tensor(state[k]).detach().cpu().numpy(), dtype=np.float32,
                     order="C") for k in STATE_KEYS]


def weights_from_record(record: Mapping[str, Any]) -> Weights:
    """A model's layers from a mapping ``"0" … "L-1"`` of array-likes with ``.numpy()`` (a
    Flower ``ArrayRecord`` as the client and the server receive it)."""
    return [record[str(i)].numpy() for i in range(len(record))]


def init_weights(spec: ModelSpec, seed: int) -> Weights:
    """The shared initial model (PyTorch default init under ``torch.manual_seed(seed)``)."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = CNN(spec)
    torch.random.set_rng_state(gen_state)
    return get_weights(model)


def get_weights(model: nn.Module) -> Weights:
    # C order whatever the tensors' memory format (training runs channels-last)
    return [np.array(p.detach().cpu().numpy(), dtype=np.float32, order="C", copy=True)
            for p in model.state_dict().values()]


def build(spec: ModelSpec, weights: Weights) -> CNN:
    model = CNN(spec)
    keys = list(model.state_dict())
    if len(keys) != len(weights):
        raise ValueError(f"expected {len(keys)} weight arrays, got {len(weights)}")
    model.load_state_dict({k: torch.from_numpy(np.asarray(w)) for k, w in zip(keys, weights)})
    return model


# the authors' transforms (src/data.py get_transform): grey MNIST images use the MNIST
# mean/std, colour ("CMNIST") images the per-channel ImageNet mean/std
GREY_MEAN_STD = (0.1307, 0.3081)
RGB_MEAN = (0.485, 0.456, 0.406)
RGB_STD = (0.229, 0.224, 0.225)


def to_tensor(x: NDArray) -> torch.Tensor:
    """(N, H, W) or (N, H, W, C) uint8 → normalised float (N, C, H, W).

    Grey images: ``(v − 0.1307) / 0.3081`` (MNIST). RGB images: per channel
    ``(v − mean_c) / std_c`` with the ImageNet statistics, as the authors' colour-MNIST
    transform. The per-channel statistics matter for Backdoor MNIST: with one mean/std for all
    channels, models trained on one uniform colour saw the other uniform colour as almost
    their own (smallest green ↔ purple excess 0.010; with per-channel statistics 0.16–0.57,
    measured by ``bench/bench_emdcfl_backdoor_gap.py``, now in the history only:
    ``git show 2e268cb:bench/bench_emdcfl_backdoor_gap.py``).
    """
    t = torch.from_numpy(np.ascontiguousarray(x)).float().div_(255.0)
    if t.ndim == 3:
        return t.unsqueeze(1).sub_(GREY_MEAN_STD[0]).div_(GREY_MEAN_STD[1])
    t = t.permute(0, 3, 1, 2).contiguous()
    if t.shape[1] != 3:
        raise ValueError(f"expected grey (N, H, W) or RGB (N, H, W, 3) images, "
                         f"got {tuple(x.shape)}")
    mean = torch.tensor(RGB_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(RGB_STD).view(1, 3, 1, 1)
    return t.sub_(mean).div_(std)


def train_local(spec: ModelSpec, weights: Weights, x: NDArray, y: NDArray, epochs: int,
                lr: float, batch_size: int, seed: int, momentum: float = 0.9,
                weight_decay: float = 1e-6, device: str = "cpu") -> tuple[Weights, float]:
    """ClientUpdate: ``epochs`` passes of minibatch SGD over ``(x, y)`` (tail batch dropped).

    Parameters
    ----------
    device : str, default "cpu"
        Torch device of the model and data (``"cuda"`` on a GPU). The minibatch order is drawn
        on the CPU from ``seed`` whatever the device.

    Returns
    -------
    weights, loss
        The new weights (numpy, on the host) and the mean training loss of the last epoch.
    """
    # channels-last: ~1.5x faster convolutions on one CPU thread (bench/bench_emdcfl_pipeline.py)
    model = build(spec, weights).to(device=device, memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum,
                          weight_decay=weight_decay)
    xt = to_tensor(x).to(device).contiguous(memory_format=torch.channels_last)
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(device)
    gen = torch.Generator().manual_seed(int(seed))
    loss_fn = nn.CrossEntropyLoss()
    last = float("nan")
    for _ in range(int(epochs)):
        order = torch.randperm(len(xt), generator=gen)
        total, count = 0.0, 0
        # a short tail batch is dropped (a 2-image step with momentum 0.9 was seen to undo an
        # epoch of progress); every image still gets sampled across epochs
        stop = len(xt) - len(xt) % batch_size if len(xt) > batch_size else len(xt)
        for start in range(0, stop, batch_size):
            idx = order[start:start + batch_size].to(device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(model(xt[idx].contiguous(memory_format=torch.channels_last)),
                           yt[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
            count += len(idx)
        last = total / max(count, 1)
    return get_weights(model), last


@torch.no_grad()
def evaluate(spec: ModelSpec, weights: Weights, x: NDArray, y: NDArray,
             batch_size: int = 128, device: str = "cpu") -> tuple[float, float]:
    """(mean cross-entropy loss, accuracy) of the model on ``(x, y)``; eval mode, no grads.

    ``device`` is the torch device the weights and images are moved to (default ``"cpu"``).
    """
    if len(x) == 0:
        return float("nan"), float("nan")
    w = _tensors(weights, device)
    xt = to_tensor(x).to(device)
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(device)
    loss, correct = 0.0, 0
    for s in range(0, len(xt), batch_size):
        out = F.linear(_features(w, xt[s:s + batch_size]), w[6], w[7])
        loss += float(F.cross_entropy(out, yt[s:s + batch_size], reduction="sum"))
        correct += int((out.argmax(1) == yt[s:s + batch_size]).sum())
    return loss / len(xt), correct / len(xt)


@torch.no_grad()
def predict_classes(spec: ModelSpec, weights: Weights, x: NDArray, batch_size: int = 128,
                    device: str = "cpu") -> NDArray[np.int64]:
    """Predicted class of every image of ``x`` (uint8-scaled pixels, as :func:`to_tensor`):
    the same computation and batches as :func:`evaluate`, so its accuracy is this mean."""
    if len(x) == 0:
        return np.zeros(0, np.int64)
    w = _tensors(weights, device)
    xt = to_tensor(x).to(device)
    parts = [F.linear(_features(w, xt[s:s + batch_size]), w[6], w[7]).argmax(1).cpu()
             for s in range(0, len(xt), batch_size)]
    return torch.cat(parts).numpy().astype(np.int64)


@torch.no_grad()
def embed_reference(spec: ModelSpec, weights: Weights, x: NDArray, batch_size: int = 1024
                    ) -> NDArray[np.float32]:
    """The module path (build a :class:`CNN`, load the weights, ``eval()``, ``embed``): the
    reference that :func:`embed_many` is tested and benchmarked against."""
    model = build(spec, weights).eval()
    xt = to_tensor(x)
    parts = [model.embed(xt[s:s + batch_size]) for s in range(0, len(xt), batch_size)]
    return torch.cat(parts).numpy().astype(np.float32) if parts else np.zeros(
        (0, spec.embed_dim), np.float32)


def _pool2(h: torch.Tensor) -> torch.Tensor:
    """2×2 max-pooling as the maximum of the four strided views (inference only).

    Equal to ``F.max_pool2d(h, 2)`` for even sizes, and ~5× faster on one CPU thread than
    PyTorch's kernel (which also tracks indices for the backward pass).
    """
    return torch.maximum(torch.maximum(h[:, :, 0::2, 0::2], h[:, :, 0::2, 1::2]),
                         torch.maximum(h[:, :, 1::2, 0::2], h[:, :, 1::2, 1::2]))


def _tensors(weights: Weights, device: str = "cpu") -> list[torch.Tensor]:
    """The weight arrays as tensors on ``device`` (on the CPU they share the arrays' memory:
    no module, no copy)."""
    return [torch.from_numpy(np.asarray(w, dtype=np.float32)).to(device) for w in weights]


def _features(w: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """The CNN's embedding computed functionally (no ``nn.Module`` is built).

    Same maths as :meth:`CNN.embed` in ``eval()`` mode; the second convolution runs
    channels-last and the ReLU after it is applied after pooling (ReLU and max commute).
    """
    h = F.relu(F.conv2d(x, w[0], w[1], padding=1))
    h = F.conv2d(h.contiguous(memory_format=torch.channels_last), w[2], w[3], padding=1)
    if h.shape[-1] % 2 or h.shape[-2] % 2:      # odd sizes: PyTorch floors; use its kernel
        h = F.max_pool2d(h, 2)
    else:
        h = _pool2(h)
    return F.relu(F.linear(F.relu(h).flatten(1), w[4], w[5]))


@torch.no_grad()
def embed(spec: ModelSpec, weights: Weights, x: NDArray | torch.Tensor, batch_size: int = 128,
          device: str = "cpu") -> NDArray[np.float32]:
    """Penultimate-layer embeddings of ``x`` (eval mode, no gradients), shape (N, embed_dim)."""
    return embed_many(spec, [weights], x, batch_size, device)[0]


@torch.no_grad()
def embed_many(spec: ModelSpec, models: Iterable[Weights], x: NDArray | torch.Tensor,
               batch_size: int = 128, device: str = "cpu") -> list[NDArray[np.float32]]:
    """Embeddings of the same images ``x`` under each model of ``models``.

    The images are converted to a tensor (on ``device``) once and every model runs
    functionally from its weight arrays (no module construction or state-dict loading per
    model). Chunks of 128 images keep the intermediate maps in cache (~1.7x faster than 1 024
    on one thread). The embeddings are returned as host (numpy) arrays.
    """
    xt = (x if isinstance(x, torch.Tensor) else to_tensor(x)).to(device)
    out = []
    for weights in models:
        if len(weights) != 8:
            raise ValueError(f"expected 8 weight arrays, got {len(weights)}")
        w = _tensors(weights, device)
        parts = [_features(w, xt[s:s + batch_size]) for s in range(0, len(xt), batch_size)]
        out.append(torch.cat(parts).cpu().numpy().astype(np.float32, copy=False) if parts
                   else np.zeros((0, spec.embed_dim), np.float32))
    return out
