"""Habits of the Flower and scikit-learn ecosystems on the Strategy objects and their result:
unknown keyword arguments to a constructor or to ``start()`` are refused with the close match
(Flower's ``num_rounds`` included, before any message), and ``repr(RunResult)`` is one short
line, not the arrays' bytes."""

from __future__ import annotations

import numpy as np
import pytest

import fedclust
from client_apps.app import app as client_app
from fedclust.config import ConfigError
from fedclust.schema import UnknownArgumentError
from server_app.inprocess import InProcessGrid
from strategies.methods import EMDCFL, ExactFCM, FedCRef, FedFCM


@pytest.mark.parametrize(("make", "match"), [
    (lambda: ExactFCM(n_cluster=3), "ExactFCM.. got unknown keyword argument.s. 'n_cluster' "
                                    r"\(did you mean 'n_clusters'\?\)"),
    (lambda: FedFCM(kmax=5), r"'kmax' \(did you mean 'k_max'\?\)"),
    (lambda: FedCRef(max_iteration=2), r"'max_iteration' \(did you mean 'max_iterations'\?\)"),
    (lambda: EMDCFL(epsilonn=0.1), r"'epsilonn' \(did you mean 'epsilon'\?\)"),
])
def test_unknown_constructor_arguments_name_the_close_match(make, match):
    with pytest.raises(UnknownArgumentError, match=match) as err:
        make()
    assert isinstance(err.value, TypeError) and isinstance(err.value, ConfigError)


def test_start_refuses_flowers_round_arguments_before_any_message():
    strategy = ExactFCM(n_clusters=2)
    grid = InProcessGrid(client_app, 2, strategy.full_run_config(), keep_sent=True)
    with pytest.raises(UnknownArgumentError, match=r"ExactFCM.start\(\) got unknown keyword "
                       r"argument\(s\) 'num_rounds' \(Flower's round count: .* "
                       r"ExactFCM\(max_rounds=5\)\)"):
        strategy.start(grid, num_rounds=5)
    with pytest.raises(UnknownArgumentError, match=r"'seeds' \(did you mean 'seed'\?\)"):
        strategy.start(grid, seeds=3)
    with pytest.raises(UnknownArgumentError, match=r"'n_clusters' \(a parameter of ExactFCM"):
        strategy.start(grid, n_clusters=3)
    assert grid.sent == []


def test_run_result_repr_is_one_short_line(tmp_path):
    rng = np.random.default_rng(0)
    xs = [rng.normal(size=(400, 3)) + 4 * (i % 2) for i in range(3)]
    res = fedclust.simulate("exact-fcm", xs, [np.full(400, i % 2) for i in range(3)],
                            n_clusters=2, output_dir=tmp_path / "run",
                            run_config={"plots": False})
    text = repr(res)
    assert "\n" not in text and len(text) < 500, text
    assert text.startswith("RunResult(method='exact-fcm', dataset='arrays', clients=3")
    assert "eval_ari=" in text and "centers=(2, 3)" in text and str(res.run_dir) in text
    assert "array(" not in text and "\\x" not in text
