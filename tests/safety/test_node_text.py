"""Text from a node never writes into the server's log or files as it likes.

A node chooses the reason of its error replies. Printed verbatim, a reason with a newline and
terminal escape codes could forge a line of the server's log (``fedclust INFO done …``),
recolour the terminal or fill the log. Every reason a node gives enters the server quoted, cut
to :data:`strategies.wire.replies.NODE_TEXT_LIMIT` characters and stripped of control
characters, before it is logged or stored (``history.jsonl``, ``summary.json``).
"""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import Error, Message

from client_apps.app import app as client_app
from server_app.app import run_method
from server_app.inprocess import InProcessGrid
from strategies.wire.replies import NODE_TEXT_LIMIT, node_text

FORGED = ("boom\n12:00:00 fedclust INFO done in 0.1s: {'objective': 0.0}\r\x1b[32mall good"
          "\x1b[0m\u202e" + "x" * 5000)
BAD = 1000
CASES = {
    "exact-fcm": ({"method": "exact-fcm", "fcm.max-rounds": 2}, "query.fcm_sums"),
    "secagg": ({"method": "exact-fcm", "fcm.max-rounds": 2, "fcm.secure-aggregation": True},
               "train"),
    "fedfcm": ({"method": "fedfcm", "fedfcm.k-max": 3, "fedfcm.max-rounds": 2},
               "train.fedfcm_local"),
}


class _All(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_node_text_is_one_quoted_clean_bounded_field():
    text = node_text(FORGED)
    assert text.startswith('"') and text.endswith('"')
    assert not any(ch in text for ch in "\n\r\x1b\u202e")
    assert len(text) < NODE_TEXT_LIMIT + 60 and "more characters" in text
    assert node_text('say "hi"') == '"say \\"hi\\""'


@pytest.mark.parametrize("case", list(CASES))
def test_a_node_cannot_write_into_the_servers_log(tmp_path, case):
    cfg, message_type = CASES[case]
    cfg = {**cfg, "num-clients": 3, "plots": False, "output-dir": str(tmp_path / "run")}

    def app(msg: Message, context) -> Message:
        if context.node_id == BAD and msg.metadata.message_type == message_type:
            return Message(Error(code=0, reason=FORGED), reply_to=msg)
        return client_app(msg, context)

    handler = _All()
    logging.getLogger("fedclust").addHandler(handler)
    try:
        summary = run_method(InProcessGrid(app, 3, cfg), cfg)
    finally:
        logging.getLogger("fedclust").removeHandler(handler)
    node_lines = [line for line in handler.lines if "boom" in line]
    assert node_lines, handler.lines[-5:]
    for line in node_lines:
        assert not any(ch in line for ch in "\n\r\x1b\u202e"), repr(line)
        assert '"boom 12:00:00 fedclust INFO done' in line
        assert "x" * (NODE_TEXT_LIMIT + 1) not in line
    stored = (tmp_path / "run" / "history.jsonl").read_text() + json.dumps(summary)
    assert "boom" in stored
    for raw in ("\\n12:00", "\\u001b", "\\r", "\\u202e", "x" * (NODE_TEXT_LIMIT + 1)):
        assert raw not in stored, raw
