"""Reading a file someone else wrote within a byte limit: a gzip stream is inflated only
up to the limit (a 2 MB file can inflate to 2 GiB), a plain file read only up to it.
Used by every reader that holds a whole file (Flight Recorder dumps in the node agent and
in ``ranksight import``, py-spy dumps); streamed formats bound what one event or line may
take instead (``importer/kineto.py``, ``importer/logs/read.py``)."""

from __future__ import annotations

import io
import re
import zlib

from ranksight.ground.words import counted

GZIP_MAGIC = b"\x1f\x8b"
_READ = 1 << 16
_LINE = re.compile(r"[^\n]*\n|[^\n]+")


class TooBig(ValueError):
    """What a file holds (decompressed) passes the reader's limit; the message names the
    file and the limit."""


def mib(n: int) -> str:
    """``n`` bytes as a person reads a limit: ``64 MiB``, ``512 KiB``, ``1,000 bytes``."""
    if n >= 1 << 20 and n % (1 << 20) == 0:
        return f"{n >> 20} MiB"
    if n >= 1 << 10 and n % (1 << 10) == 0:
        return f"{n >> 10} KiB"
    return counted(n, "byte", spec=",")


def read_bytes(path: str, limit: int, why: str = "") -> tuple[bytes, str]:
    """``(content, damage)`` of the file at ``path``: its bytes, inflated if it is gzip
    (by magic number; members one after another, as ``gzip.decompress``), and "" or what
    cut a damaged gzip stream short (what came before the damage is returned). Never holds
    more than ``limit`` bytes of content and one read block. Raises :class:`TooBig` naming
    ``path`` and ``limit`` (and ``why``: where the limit comes from) when the content
    passes ``limit``, OSError if the file cannot be read."""
    with open(path, "rb") as f:
        head = f.read(2)
        f.seek(0)
        if head != GZIP_MAGIC:
            data = f.read(limit + 1)
            if len(data) > limit:
                raise _too_big(path, limit, why, "")
            return data, ""
        return _inflate(f, path, limit, why)


def inflate(data: bytes, limit: int, source: str = "", why: str = "") -> tuple[bytes, str]:
    """:func:`read_bytes` of bytes already read (gzip or not)."""
    if data[:2] != GZIP_MAGIC:
        if len(data) > limit:
            raise _too_big(source, limit, why, "")
        return data, ""
    return _inflate(io.BytesIO(data), source, limit, why)


def _too_big(path: str, limit: int, why: str, how: str) -> TooBig:
    return TooBig(f"{path}: {how}more than {mib(limit)}{f' ({why})' if why else ''}: not read")


def _inflate(f, path: str, limit: int, why: str) -> tuple[bytes, str]:
    out = bytearray()
    d = None  # None: between members
    while block := f.read(_READ):
        pending = block
        while pending:
            if d is None:
                if not pending.startswith(GZIP_MAGIC):  # trailing bytes after the last member
                    return bytes(out), ""
                d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            try:
                out += d.decompress(pending, limit + 1 - len(out))
            except zlib.error as exc:
                return bytes(out), f"the gzip file is damaged ({exc})"
            if len(out) > limit:
                raise _too_big(path, limit, why, "inflates to ")
            pending = d.unused_data if d.eof else d.unconsumed_tail
            if d.eof:
                d = None
    if d is not None:
        return bytes(out), "the gzip file is damaged (it ends before its end-of-stream marker)"
    return bytes(out), ""


class Lines:
    """The lines of a binary stream as text (UTF-8, bad bytes replaced; ``\\r\\n`` and a
    lone ``\\r`` end a line too, as in Python's text mode), none longer than ``max_line``
    bytes: a longer line gives its first ``max_line`` bytes and the rest is skipped
    (counted in :attr:`cut`), so that a file of one 1 GiB line takes ``max_line``."""

    def __init__(self, stream, max_line: int) -> None:
        self.stream, self.max_line = stream, max_line
        self.cut = 0
        """Lines cut to ``max_line`` bytes."""

    def __iter__(self):
        readline, most = self.stream.readline, self.max_line
        while line := readline(most):
            if len(line) == most and not line.endswith(b"\n"):
                self.cut += 1
                while (more := readline(most)) and not more.endswith(b"\n"):
                    pass
            text = line.decode("utf-8", "replace")
            if "\r" not in text:
                yield text
                continue
            text = text.replace("\r\n", "\n").replace("\r", "\n")
            yield from _LINE.findall(text)
