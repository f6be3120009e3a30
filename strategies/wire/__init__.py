"""Message codecs: both ends of every message of a method in one module — what the server
sends (the builder), what a node reads from it (the parser), what the node replies, and how
the server checks and reads that reply.

This package sits *below* both :mod:`strategies` (the server) and :mod:`client_apps` (the
nodes): both import it, and it imports nothing of either
(``tests/architecture/test_layers.py``). It knows
Flower's records and nothing of grids, exchanges or server loops.

- :mod:`strategies.wire.records`: record builders every codec uses;
- :mod:`strategies.wire.replies`: the vocabulary of reply checks;
- :mod:`strategies.wire.fcm`: exact federated FCM (plain and SecAgg+), and the scaling and
  final messages FedFCM shares;
- :mod:`strategies.wire.fedfcm`: FedFCM's local-centers and FedFuzzDB messages;
- :mod:`strategies.wire.emdcfl`: EMD-CFL's and its baselines' messages;
- :mod:`strategies.wire.fedcref`: FedCRef's reply checks and array decoders (the nodes build
  the replies in :mod:`client_apps.fedcref_handlers`).
"""
