"""The torch device of a method's client computations (``emdcfl.device``,
``fedcref.device``): ``cpu``, ``cuda``, or ``auto`` (CUDA when torch sees a GPU). Resolved
where the work runs (a node, or the in-memory clients): a CPU-only server with GPU nodes is a
valid deployment."""

from __future__ import annotations

from fedclust.schema import ConfigError

DEVICES = ("cpu", "cuda", "auto")


def check_cuda(key: str) -> None:
    """Raise a :class:`ConfigError` naming run-config ``key`` when it asks for ``cuda`` and
    torch sees no GPU."""
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(
            f"run config '{key}' = 'cuda' is invalid (torch.cuda.is_available() is "
            f"False: torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}). "
            "Allowed: 'cpu', or 'cuda' on a machine with a CUDA GPU and a CUDA build of torch, "
            f"or 'auto' (cuda when available, else cpu). Fix: pass {key}=\"auto\" or "
            f"{key}=\"cpu\", or install a CUDA build of torch.")


def resolve_device(name: str, key: str) -> str:
    """Torch device of run-config ``key`` = ``name``: ``auto`` → ``cuda`` if available, else
    ``cpu``.

    Raises
    ------
    ConfigError
        ``cuda`` requested but not available, or an unknown name.
    """
    if name == "cpu":
        return "cpu"
    if name == "cuda":
        check_cuda(key)
        return "cuda"
    if name != "auto":
        raise ConfigError(f"run config '{key}' = {name!r} is invalid. Allowed: "
                          f"{', '.join(map(repr, DEVICES))}. Fix: pass {key}=\"cpu\".")
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
