"""The errors fedclust raises on purpose, under one base class.

Every :class:`FedclustError` names what was wrong, what is allowed and how to fix it.

- :class:`BadInputError`: the input a user gave is at fault (a key or value, a data file, an
  output folder, a system size, a run folder to report or predict from). Every launcher
  (``flwr run``, ``fedclust sweep``, ``fedclust deploy``, the other commands) prints its
  message alone, without a traceback, and exits with status 2.
- ``data_free``: the message quotes no value read from a node's data and none of its paths,
  so a node sends it to the server in its error reply. For any other error the reply names
  the class only, and the details stay in the node's log.
"""

from __future__ import annotations

from typing import ClassVar


class FedclustError(Exception):
    """Base of every error fedclust raises on purpose."""

    #: the message may leave a node (it names no data value and no path)
    data_free: ClassVar[bool] = False


class BadInputError(FedclustError):
    """The user's input is at fault; the message says what, what is allowed and the fix."""
