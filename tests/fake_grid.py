"""Test-side name of the in-process Grid (see :mod:`server_app.inprocess`)."""

from server_app.inprocess import InProcessGrid, run_server

__all__ = ["InProcessGrid", "run_server"]
