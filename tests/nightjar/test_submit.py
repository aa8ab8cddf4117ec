"""``nightjar submit`` against a stand-in gateway on loopback: the key goes as a Bearer token."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from nightjar.submit import stream_completion

KEY = "sk-test"


class _Gateway(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Authorization") != f"Bearer {KEY}":
            body = json.dumps({"error": {"message": "missing or unknown API key", "code": "unauthorized"}})
            self.send_response(401)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for text in ("Once", " upon"):
            self.wfile.write(f"data: {json.dumps({'choices': [{'text': text}]})}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Gateway)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    thread.join(5)


def test_submit_sends_the_api_key(gateway: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert stream_completion(gateway, {"prompt": "x"}, False, api_key=KEY) == 0
    assert capsys.readouterr().out == "Once upon\n"


def test_submit_without_the_key_is_one_line_and_exit_2(
    gateway: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert stream_completion(gateway, {"prompt": "x"}, False) == 2
    err = capsys.readouterr().err
    assert err == "nightjar: error: 401: missing or unknown API key\n"
