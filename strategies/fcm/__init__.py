"""Flower adapters of the FCM family: the two papers' loops (:mod:`fedclust.fcm.loop`,
:mod:`fedclust.fedfcm.loop`) run over Flower messages.

- :mod:`strategies.fcm.family`: the phases both methods share (scaling, final);
- :mod:`strategies.fcm.exact`: exact federated FCM with plain sums, and its ``run``;
- :mod:`strategies.fcm.secure`: exact federated FCM with SecAgg+ sums;
- :mod:`strategies.fcm.fedfcm`: FedFCM with FedFuzzDB, and its ``run``.

The messages themselves (both ends) are :mod:`strategies.wire.fcm` and
:mod:`strategies.wire.fedfcm`.
"""
