"""Reading logs in bounded pieces: a growing file while a trial runs, a whole file afterwards."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from sweep.parsers.lines import Measurement, first_break

DEFAULT_CHUNK = 1 << 20


class Parser(Protocol):
    def feed(self, chunk: bytes) -> list[Measurement]: ...

    def close(self) -> list[Measurement]: ...


class LogTail:
    """What a log file gained since the last call, at most chunk_size bytes at a time (read_new), or all of it (drain).

    The file may not exist yet (the job has not started), may be truncated in
    place (copytruncate, or a restarted job reopening it with "w") or replaced
    (rotated, deleted and recreated); reading then starts again at byte 0 of
    the file now at `path`, and `restarts` counts it. A replaced file is
    drained to its end first, so nothing written before the switch is lost.
    """

    def __init__(self, path: str | os.PathLike[str], chunk_size: int = DEFAULT_CHUNK) -> None:
        if chunk_size < 1:
            raise ValueError(f"chunk_size={chunk_size} must be >= 1")
        self.path = Path(path)
        self.chunk_size = chunk_size
        self.offset = 0  # bytes read from the current file
        self.restarts = 0
        self._file: BinaryIO | None = None
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the open file

    def read_new(self) -> bytes:
        """Up to chunk_size new bytes; b"" when there is nothing new (yet)."""
        if self._file is None and not self._open():
            return b""
        assert self._file is not None
        if os.fstat(self._file.fileno()).st_size < self.offset:
            self._file.seek(0)
            self.offset = 0
            self.restarts += 1
        data = self._read()
        if data or not self._replaced():
            return data
        self.close()
        self.restarts += 1
        return self._read() if self._open() else b""

    def drain(self) -> Iterator[bytes]:
        """Every byte the file has now, chunk_size at a time (memory: one chunk): what was written
        before the call, so a command writing faster than it is read cannot keep the caller here."""
        size = self._size()
        data = self.read_new()
        while data:
            yield data
            if self._file is not None and self.offset >= size:
                return
            data = self.read_new()

    def _size(self) -> int:
        try:
            return os.stat(self.path).st_size
        except OSError:
            return 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None
        self._identity = None
        self.offset = 0

    def __enter__(self) -> LogTail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> bool:
        try:
            f = open(self.path, "rb", buffering=0)  # unbuffered: each read is one bounded read(2)
        except (FileNotFoundError, IsADirectoryError, PermissionError):
            return False
        st = os.fstat(f.fileno())
        self._file, self._identity, self.offset = f, (st.st_dev, st.st_ino), 0  # type: ignore[assignment]
        return True

    def _read(self) -> bytes:
        assert self._file is not None
        data = self._file.read(self.chunk_size) or b""
        self.offset += len(data)
        return data

    def _replaced(self) -> bool:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._identity


def iter_file(
    path: str | os.PathLike[str], parser: Parser, chunk_size: int = DEFAULT_CHUNK
) -> Iterator[Measurement]:
    """Stream a whole log through a parser, chunk_size bytes at a time, and close the parser."""
    with open(path, "rb", buffering=0) as f:
        while chunk := f.read(chunk_size):
            yield from parser.feed(chunk)
    yield from parser.close()


def scan_file(path: str | os.PathLike[str], parser: Parser, chunk_size: int = DEFAULT_CHUNK) -> list[Measurement]:
    """Every measurement in a log file, read in bounded chunks (memory: one chunk plus the results)."""
    return list(iter_file(path, parser, chunk_size))


def read_tail(path: str | os.PathLike[str], max_bytes: int = 64 << 10, start: int = 0) -> str:
    """The last max_bytes of a log as text, from its first whole line; "" if it cannot be read.

    Enough for a traceback and the lines before it, whatever the log's size. start: nothing before this
    byte (a warm worker's log holds its earlier trials' lines before the offset where this trial's begin).
    """
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, start, size - max_bytes)
            # One byte more, to see whether `start` falls at the beginning of a line.
            f.seek(max(0, start - 1))
            data = f.read(max_bytes + (start > 0))
    except OSError:  # missing, unreadable, a directory, a vanished network mount: no tail to show
        return ""
    if start > 0:
        cut = first_break(data)  # drop the torn first line (or just the line break before `start`)
        data = data[cut + 1 :] if cut >= 0 else data
    return data.decode("utf-8", errors="replace")
