"""The language server's framing: a broken frame is skipped, the next well-formed one answered; a frame too
long to read ends the server with a message. Over real standard input and output (tests/lsp_client.py)."""

from __future__ import annotations

import io
import json

import pytest
from lsp_client import Client

from steerc.core.limits import MAX_LSP_FRAME_BYTES
from steerc.lsp.frames import Frames, FrameTooLarge


def frame(body: bytes, length: int | None = None) -> bytes:
    return b"Content-Length: %d\r\n\r\n" % (len(body) if length is None else length) + body


def ping(ident: int) -> bytes:
    return frame(json.dumps({"jsonrpc": "2.0", "id": ident, "method": "steerc/ping"}).encode())


def answered(client: Client, ident: int, timeout: float = 10.0) -> dict:
    import time

    deadline = time.monotonic() + timeout
    while ident not in client.responses:
        assert time.monotonic() < deadline, f"no answer to request {ident}\n{client.log()}"
        client._pump(0.05)
    return client.responses.pop(ident)


@pytest.fixture
def server(tmp_path):
    client = Client(cwd=str(tmp_path))
    client.initialize()
    yield client
    client.kill()


def write(client: Client, data: bytes) -> None:
    client.proc.stdin.write(data)
    client.proc.stdin.flush()


@pytest.mark.parametrize("bad", [
    b'Content-Type: application/json\r\n\r\n{"jsonrpc": "2.0", "id": 7, "method": "shutdown"}',  # no length
    b'{"jsonrpc": "2.0", "id": 7, "method": "shutdown"}',  # no header at all
    b"Content-Length: abc\r\n\r\n{}",
    b"Content-Length: 2\r\n\r\n{}}}}} and more",  # a length shorter than the body
    b"\r\n\r\n\r\n",
    b"garbage\n\n\x00\xff",
])
def test_a_malformed_frame_is_skipped_and_the_next_request_answered(server, bad):
    """pygls took each later body for a header line after one frame without Content-Length: never answered."""
    write(server, bad)
    write(server, ping(1))
    assert "error" in answered(server, 1)  # an answer
    assert server.proc.poll() is None


def test_a_body_that_is_not_json_gets_a_parse_error(server):
    for body in (b"not json", b"\xff\xfe\x00", b"[" * 100_000, b""):
        write(server, frame(body))
    write(server, ping(2))
    assert "error" in answered(server, 2)
    assert server.responses[None]["error"]["code"] == -32700


@pytest.mark.parametrize("length", [MAX_LSP_FRAME_BYTES + 1, 10**30])
def test_a_frame_too_long_ends_the_server_with_a_message(server, length):
    write(server, b"Content-Length: %d\r\n\r\n{}" % length)
    assert server.proc.wait(10) == 1
    assert "longer than the limit" in server.log()


def test_frames_read_from_a_stream():
    data = (b"junk" + frame(b"{1}") + b"Content-Length: 3\r\nContent-Type: x\r\n\r\n{2}"
            + b"content-length:3\r\n\r\n{3}" + b"x" * 20_000 + frame(b"{4}") + frame(b"{5"))
    frames = Frames(io.BufferedReader(io.BytesIO(data)))
    assert [frames.next() for _ in range(5)] == [b"{1}", b"{2}", b"{3}", b"{4}", b"{5"]
    assert frames.next() is None and frames.skipped == 2
    with pytest.raises(FrameTooLarge):
        Frames(io.BytesIO(frame(b"{}", 101)), limit=100).next()
    assert Frames(io.BytesIO(frame(b"{}", 5))).next() is None  # the stream ends inside the body
