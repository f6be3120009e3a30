"""What every method's predictor returns (:class:`Prediction`), its error, and the shared width
check; the package (:mod:`fedclust.predict`) dispatches to the predictors of each method
(:data:`fedclust.registry.METHODS`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from fedclust.errors import BadInputError

#: the fix every refusal of a damaged or unknown run folder names
FIX_RUN = ("point RUN_DIR at the unchanged results folder of a finished run (or a site's own "
           "results folder), or run the federation again")


#: a row farther than this many center spreads from its nearest center is far outside the data
FAR_FACTOR = 10.0


class PredictError(BadInputError, ValueError):
    """The run folder or the rows cannot be used for prediction."""


@dataclass
class Prediction:
    """Rows out of :func:`predict`: ``table`` has one line per input row, ``header`` names its
    columns (the same as the run's ``assignments.csv``)."""

    header: list[str]
    table: np.ndarray
    fmt: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def labels(self) -> np.ndarray:
        return self.table[:, 1].astype(np.int64)


def check_width(x: np.ndarray, expected: int, what: str) -> None:
    """Refuse rows of the wrong width with a message naming both widths."""
    if x.shape[1] != expected:
        raise PredictError(f"the rows have {x.shape[1]} features but the run's {what} "
                           f"{expected}. Allowed: rows with the {expected} features the run "
                           f"was fitted on, in the same order and units (with a label "
                           f"column, name it: --label-column)")
