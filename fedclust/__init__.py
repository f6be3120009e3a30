"""fedclust: federated clustering algorithms (Flower-free core).

``fedclust.simulate`` (:func:`fedclust.api.simulate`) runs a method on arrays in a notebook;
it is imported on first use, so ``import fedclust`` stays light.
"""

from typing import Any

__version__ = "0.1.0"
__all__ = ["simulate"]


def __getattr__(name: str) -> Any:
    if name == "simulate":
        from fedclust.api import simulate

        return simulate
    raise AttributeError(f"module 'fedclust' has no attribute {name!r}")
