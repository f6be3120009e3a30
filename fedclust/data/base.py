"""The tabular dataset record every loader returns, and its error."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from fedclust.errors import BadInputError


class DatasetError(BadInputError, ValueError):
    """A dataset cannot be loaded; the message says which file is missing and where to get it."""

    data_free = True


@dataclass
class Dataset:
    name: str
    x: NDArray[np.float64]
    y: NDArray[np.int64]
    groups: dict[str, NDArray[np.int64]] = field(default_factory=dict)
    feature_names: list[str] = field(default_factory=list)
    recipe: list[dict[int, int]] | None = None   # explicit per-client label counts
    n_classes: int = 0

    def __post_init__(self) -> None:
        self.x = np.ascontiguousarray(self.x, dtype=np.float64)
        self.y = np.asarray(self.y, dtype=np.int64)
        self.n_classes = int(np.unique(self.y).size)
