"""Run the real app through Flower's Simulation Engine (private SuperLink) for smoke tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from server_app.engine import RunOutcome, SimulationSuperLink


def run_flwr(run_config: dict[str, Any], num_supernodes: int, timeout: float = 900
             ) -> tuple[RunOutcome, dict[str, Any] | None]:
    """``flwr run`` on a fresh simulation SuperLink; return (outcome, summary.json or None).

    ``run_config`` must contain an absolute ``output-dir``.
    """
    with SimulationSuperLink() as link:
        outcome = link.run(run_config, num_supernodes, timeout=timeout)
    summary_path = Path(run_config["output-dir"]) / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else None
    return outcome, summary
