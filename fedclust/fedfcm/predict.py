"""``fedclust predict`` for FedFCM: the FCM family's predictor
(:func:`fedclust.fcm.predict.predict_fcm`, memberships to the centers of the chosen K) with
FedFCM's fuzzifier key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from fedclust.fcm.predict import predict_fcm
from fedclust.fedfcm.keys import FedFCMSettings
from fedclust.predict.base import Prediction


def predict_fedfcm(run_dir: Path, summary: dict[str, Any], x: np.ndarray,
                   options: dict[str, Any]) -> Prediction:
    """:func:`~fedclust.fcm.predict.predict_fcm` with ``fedfcm.m``."""
    return predict_fcm(run_dir, summary, x, options, FedFCMSettings.m_key)
