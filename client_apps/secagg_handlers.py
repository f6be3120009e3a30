"""Client side of exact federated FCM with secure aggregation (SecAgg+).

Flower's ``secaggplus_mod`` only wraps the default ``"train"`` action, and the legacy server
workflow sends the round payload as ``FitIns`` (parameters ``[centers, shift, scale]`` and a
config with the public divisor ``S`` and the number of limbs: :class:`strategies.wire.fcm.
SecureRequest`). This handler computes the FCM local sums ``U = Σ u^m`` and ``WS = Σ u^m x``
exactly as :func:`client_apps.fcm_handlers.fcm_sums` and returns them, limb-encoded (see
:mod:`fedclust.fcm.secagg`), in the legacy ``FitRes`` layout; ``secaggplus_mod`` then masks the
vector and *clears the plain arrays* before anything leaves the node. The weight is always 1
(the client's number of points is not revealed).

Under the privacy guard (``N ≤ C(F+1)/F``) the client contributes zeros, so the server cannot
tell that it withheld.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message
from flwr.client.mod import secaggplus_mod

from client_apps.base import app
from client_apps.common import run_config
from client_apps.data import load_client_data
from client_apps.fcm_handlers import guard_withholds, keep_owner_results, secure_final_vector
from fedclust import fcm
from fedclust.data import scaling
from fedclust.fcm.keys import FCMSettings
from fedclust.fcm.secagg import LIMBS, pack
from strategies.wire import fcm as wire


@app.train(mods=[secaggplus_mod])
def secure_fcm_sums(msg: Message, context: Context) -> Message:
    """FCM local sums (a round's request) or the final phase's objective and evaluation table
    (the final request) for one SecAgg+ round (stage "collect masked vectors")."""
    cfg = run_config(context)
    s = FCMSettings.from_config(cfg)
    data = load_client_data(context, cfg)
    req = wire.read_secure_request(msg.content, LIMBS)
    centers = req.centers
    x = scaling.apply(data.x, req.shift, req.scale)
    c, f = centers.shape
    if req.final:
        keep_owner_results(msg, context, s, x, centers, req.shift, req.scale, req.run_dir)
        vec = secure_final_vector(data, x, centers, s.m, req)
    else:
        if guard_withholds(s, x):
            u, ws, n = np.zeros(c), np.zeros((c, f)), 0
        else:
            (u, ws), n = fcm.local_sums(x, centers, s.m), x.shape[0]
        # the row count rides along (the server learns only the round's total, and checks
        # ΣU against it)
        vec = pack(u, ws, req.divisor, req.limbs, scale_u=req.divisor_aux,
                   n=n if req.with_rows else None)
    return Message(wire.secure_reply(vec), reply_to=msg)
