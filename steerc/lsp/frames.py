"""Reading LSP's ``Content-Length`` frames from a byte stream, recovering from broken ones.

pygls reads a header line at a time and trusts what it finds: after one
frame without a ``Content-Length`` (or with a wrong one) it takes each later
body as a header line, glued to the next frame's header, and never answers
again. Here a header block is read whole (up to the blank line); one that is
not a ``Content-Length`` frame is skipped up to the next ``Content-Length:``
in the stream, with a warning in the log, so the next well-formed frame is
read as it was sent. A frame longer than MAX_LSP_FRAME_BYTES ends the server
with a message (its body cannot be skipped without reading it, and no
document needs it).

>>> import io
>>> stream = io.BytesIO(b'Content-Type: x\\r\\n\\r\\n{"bad"}Content-Length: 2\\r\\n\\r\\n{}'
...                     b'content-length:3\\r\\nContent-Type: y\\r\\n\\r\\n[1]')
>>> frames = Frames(stream)
>>> frames.next(), frames.next(), frames.next()
(b'{}', b'[1]', None)
>>> frames.skipped
1
"""

from __future__ import annotations

import logging
import re

from steerc.core.limits import MAX_LSP_FRAME_BYTES

log = logging.getLogger("steerc.lsp")

MAX_HEADER_BYTES = 8192  # a header block is two short lines
_END = b"\r\n\r\n"
_LENGTH = re.compile(rb"content-length[ \t]*:", re.I)
_HEADER = re.compile(rb"([!#$%&'*+.^_`|~0-9A-Za-z-]+)[ \t]*:[ \t]*([\x20-\x7e\t]*?)[ \t]*")
_CHUNK = 65536


class FrameTooLarge(Exception):
    """A frame says it is longer than MAX_LSP_FRAME_BYTES."""


class Frames:
    """The bodies of the frames of ``stream`` (a binary stream), one per :meth:`next`."""

    def __init__(self, stream, limit: int = MAX_LSP_FRAME_BYTES):
        self.stream, self.limit = stream, limit
        self.buf = bytearray()
        self.eof = False
        self.skipped = 0  # broken header blocks skipped

    def next(self) -> bytes | None:
        """The next frame's body (whatever bytes it holds); None at the end of the stream. Raises
        FrameTooLarge."""
        while True:
            end = self.buf.find(_END, 0, MAX_HEADER_BYTES + len(_END))
            if end < 0:
                if len(self.buf) > MAX_HEADER_BYTES:  # no header block this long: not one
                    self._skip(1)
                elif not self._fill():
                    if self.buf.strip():
                        log.warning("the stream ended inside a frame header; %d bytes dropped", len(self.buf))
                    return None
                continue
            length = self._length(bytes(self.buf[:end]))
            if length is None:
                self._skip(1)
                continue
            if length > self.limit:
                raise FrameTooLarge(f"a frame of {length:,} bytes is longer than the limit "
                                    f"({self.limit:,} bytes, MAX_LSP_FRAME_BYTES)")
            del self.buf[: end + len(_END)]
            if len(self.buf) < length and not self.eof:  # the rest of the body in one read (at most the limit)
                rest = self.stream.read(length - len(self.buf))
                self.eof = len(rest) < length - len(self.buf)
                self.buf += rest
            if len(self.buf) < length:
                log.warning("the stream ended inside a frame body (%d of %d bytes)", len(self.buf), length)
                return None
            body = bytes(self.buf[:length])
            del self.buf[:length]
            return body

    @staticmethod
    def _length(block: bytes) -> int | None:
        """The Content-Length of a header block, or None when it is not a frame's header."""
        length = None
        for line in block.split(b"\r\n"):
            m = _HEADER.fullmatch(line)
            if m is None:
                return None
            if m.group(1).lower() == b"content-length":
                if not m.group(2).isdigit():
                    return None
                length = int(m.group(2)[:40])  # 40 digits are past any limit: not a quadratic int()
        return length

    def _skip(self, at_least: int) -> None:
        """Drop the start of the buffer up to the next ``Content-Length:`` after ``at_least`` bytes."""
        m = _LENGTH.search(self.buf, at_least)
        if m is not None:
            cut = m.start()
        else:  # keep a tail that may be the start of one
            cut = max(at_least, len(self.buf) - len(b"content-length:"))
        if self.buf[:cut].strip():
            self.skipped += 1
            shown = bytes(self.buf[: min(cut, 60)])
            log.warning("skipped %d bytes that are not an LSP frame: %r%s", cut, shown, "..." if cut > 60 else "")
        del self.buf[:cut]

    def _fill(self) -> bool:
        if self.eof:
            return False
        read = getattr(self.stream, "read1", None) or self.stream.read
        chunk = read(_CHUNK)
        if not chunk:
            self.eof = True
            return False
        self.buf += chunk
        return True
