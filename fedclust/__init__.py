"""fedclust: federated clustering algorithms (Flower-free core)."""

__version__ = "0.1.0"
