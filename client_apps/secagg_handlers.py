"""Client side of exact federated FCM with secure aggregation (SecAgg+).

Flower's ``secaggplus_mod`` only wraps the default ``"train"`` action, and the legacy server
workflow sends the round payload as ``FitIns`` (parameters ``[centers, shift, scale]`` and a
config with the public divisor ``S`` and the number of limbs). This handler computes the FCM
local sums ``U = Σ u^m`` and ``WS = Σ u^m x`` exactly as :func:`client_apps.fcm_handlers.fcm_sums`
and returns them, limb-encoded (see :mod:`strategies.secure_fcm`), in the legacy ``FitRes``
layout; ``secaggplus_mod`` then masks the vector and *clears the plain arrays* before anything
leaves the node. The weight is always 1 (the client's number of points is not revealed).

Under the privacy guard (``N ≤ C(F+1)/F``) the client contributes zeros, so the server cannot
tell that it withheld.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.client.mod import secaggplus_mod

from client_apps.base import app
from client_apps.common import run_config
from client_apps.data import load_client_data
from client_apps.fcm_handlers import guard_withholds, keep_owner_results, secure_final_vector
from fedclust import fcm
from fedclust.data import scaling
from fedclust.fcm.secagg import LIMBS, PHASE_FINAL, PHASE_SUMS, pack


@app.train(mods=[secaggplus_mod])
def secure_fcm_sums(msg: Message, context: Context) -> Message:
    """FCM local sums (fit config ``fedclust.phase="sums"``) or the final phase's objective and
    evaluation table (``"final"``) for one SecAgg+ round (stage "collect masked vectors")."""
    cfg = run_config(context)
    data = load_client_data(context, cfg)
    params = msg.content.array_records["fitins.parameters"]
    centers, shift, scale = (a.numpy() for a in params.values())
    fit_cfg = msg.content.config_records["fitins.config"]
    divisor = float(fit_cfg["fedclust.secure-scale"])
    limbs = int(fit_cfg.get("fedclust.limbs", LIMBS))
    x = scaling.apply(data.x, shift, scale)
    c, f = centers.shape
    if fit_cfg.get("fedclust.phase", PHASE_SUMS) == PHASE_FINAL:
        keep_owner_results(msg, context, cfg, x, centers, shift, scale,
                           str(fit_cfg.get("fedclust.run-dir", "")))
        vec = secure_final_vector(data, x, centers, cfg["fcm.m"], dict(fit_cfg))
    else:
        if guard_withholds(cfg, x):
            u, ws, n = np.zeros(c), np.zeros((c, f)), 0
        else:
            (u, ws), n = fcm.local_sums(x, centers, cfg["fcm.m"]), x.shape[0]
        # the row count rides along (the server learns only the round's total, and checks
        # ΣU against it)
        vec = pack(u, ws, divisor, limbs,
                   scale_u=float(fit_cfg.get("fedclust.secure-scale-u", divisor)),
                   n=n if fit_cfg.get("fedclust.with-rows") else None)
    return Message(RecordDict({
        "fitres.parameters": ArrayRecord([vec]),
        "fitres.num_examples": MetricRecord({"num_examples": 1}),
        "fitres.metrics": ConfigRecord({}),
        "fitres.status": ConfigRecord({"code": 0, "message": "ok"}),
    }), reply_to=msg)
