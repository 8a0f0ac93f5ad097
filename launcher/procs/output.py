"""Workers' output: torchrun's --redirects / --tee maps, and the pump that prefixes console lines.

One pump thread serves every pipe of a launcher through a selector (no thread per pipe, no busy
loop). Console lines get the ``[rank N]: `` prefix and are written whole, so ranks interleave by
line, never inside one; tee'd bytes go to the log file as they arrive. ``watch`` lets the
launcher see the console lines that carry a marker (the examples' ``resumed from step N``), and
take them off the console (a big job's Ctrl-C lines, which npurun prints grouped).
"""
from __future__ import annotations

import enum
import os
import selectors
import sys
import threading
from collections import deque

from launcher.errors import ConfigError

MAX_LINE = 1 << 16  # a longer line without a newline is written in pieces of this size


class Std(enum.IntFlag):
    """Which standard streams (torchrun's values: 0 none, 1 stdout, 2 stderr, 3 both)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3

    @classmethod
    def parse(cls, text: str, flag: str = "--redirects") -> "Std | dict[int, Std]":
        """``"3"`` -> Std.ALL for every rank; ``"0:3,1:1"`` -> {0: ALL, 1: OUT} per local rank."""
        text = str(text).strip()

        def one(value: str) -> Std:
            if value not in ("0", "1", "2", "3"):
                raise ConfigError(f"{flag} {text!r}: {value!r} is not 0 (none), 1 (stdout), "
                                  f"2 (stderr) or 3 (both)")
            return cls(int(value))

        if ":" not in text:
            return one(text)
        out: dict[int, Std] = {}
        for item in text.split(","):
            rank, sep, value = item.strip().partition(":")
            if not sep or not rank.strip().isdigit():
                raise ConfigError(f"{flag} {text!r}: {item!r} is not LOCAL_RANK:VALUE "
                                  f"(e.g. 0:3,1:1)")
            out[int(rank)] = one(value.strip())
        return out


def std_for(spec: "Std | dict[int, Std]", local_rank: int) -> Std:
    """The Std of one local rank under a parsed --redirects / --tee value."""
    if isinstance(spec, dict):
        return spec.get(local_rank, Std.NONE)
    return spec


class _Stream:
    __slots__ = ("fd", "prefix", "console", "logfile", "buf", "watches")

    def __init__(self, fd: int, prefix: str, console: str | None, logfile,
                 watches: list | None = None):
        self.fd, self.prefix, self.console, self.logfile = fd, prefix, console, logfile
        self.buf = b""
        self.watches = [] if watches is None else watches   # the pump's (marker, callback) list

    def feed(self, data: bytes) -> None:
        if self.logfile is not None:
            self.logfile.write(data)
            self.logfile.flush()
        if self.console is None:
            return
        self.buf += data
        cut = self.buf.rfind(b"\n")
        if cut < 0 and len(self.buf) < MAX_LINE:
            return
        if cut < 0:
            cut = len(self.buf) - 1
        lines, self.buf = self.buf[:cut + 1], self.buf[cut + 1:]
        for marker, callback in self.watches:
            if marker in lines:      # one scan of the chunk: the common case has no marker
                kept = []
                for line in lines.splitlines(keepends=True):
                    if marker not in line or not callback(
                            self.prefix, line.decode("utf-8", "replace").rstrip("\n")):
                        kept.append(line)
                lines = b"".join(kept)
        if lines:
            self._write(lines)

    def finish(self) -> None:
        if self.console is not None and self.buf:
            self._write(self.buf + b"\n")
            self.buf = b""
        if self.logfile is not None:
            self.logfile.close()
            self.logfile = None

    def _write(self, chunk: bytes) -> None:
        text = chunk.decode("utf-8", "backslashreplace")
        out = "".join(self.prefix + line for line in text.splitlines(keepends=True))
        stream = getattr(sys, self.console)  # looked up late: tests swap sys.stdout
        try:
            stream.write(out)
            stream.flush()
        except (OSError, ValueError):
            pass  # the console is gone (closed pipe): keep draining the worker


class OutputPump:
    """Reads workers' pipes in one thread; ``add`` hands it a pipe, ``wait_idle`` waits for EOF."""

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._pending: deque[_Stream] = deque()
        self._open: dict[int, _Stream] = {}
        self._cond = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None
        self._watches: list = []

    def watch(self, marker: bytes, callback) -> None:
        """Call ``callback(prefix, line)`` in the pump's thread for every console line that
        contains ``marker`` (before the line is written); a true result keeps the line off the
        console (the launcher says it another way: a big job's Ctrl-C lines, grouped)."""
        self._watches.append((marker, callback))

    def add(self, fd: int, prefix: str, console: str | None, logfile=None) -> None:
        """Pump ``fd`` (the read end of a worker's pipe; the pump closes it at EOF).

        ``console`` is "stdout", "stderr" or None; ``logfile`` a binary file to tee into (closed
        by the pump at EOF) or None.
        """
        os.set_blocking(fd, False)
        with self._cond:
            stream = _Stream(fd, prefix, console, logfile, self._watches)
            self._open[fd] = stream
            self._pending.append(stream)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="npurun-output",
                                                daemon=True)
                self._thread.start()
        self._wake()

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending:
                    s = self._pending.popleft()
                    self._sel.register(s.fd, selectors.EVENT_READ, s)
                if self._closing and not self._open:
                    return
            for key, _ in self._sel.select():
                stream = key.data
                if stream is None:
                    try:
                        os.read(self._wake_r, 4096)
                    except BlockingIOError:
                        pass
                    continue
                try:
                    data = os.read(stream.fd, 65536)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if data:
                    stream.feed(data)
                else:
                    self._retire(stream)

    def _retire(self, stream: _Stream) -> None:
        try:
            self._sel.unregister(stream.fd)
        except (KeyError, ValueError):
            pass
        stream.finish()
        os.close(stream.fd)
        with self._cond:
            self._open.pop(stream.fd, None)
            self._cond.notify_all()

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every pipe reached EOF; True if they did within ``timeout`` seconds."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._open, timeout)

    def close(self, timeout: float = 2.0) -> None:
        """Drain what is left (up to ``timeout`` s), then stop the thread and close every pipe."""
        self.wait_idle(timeout)
        with self._cond:
            self._closing = True
            if self._thread is None:
                leftovers = list(self._open.values())
                self._open.clear()
            else:
                leftovers = []
        for s in leftovers:
            s.finish()
            os.close(s.fd)
        self._wake()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
            if self._thread.is_alive():  # a grandchild still holds a pipe open: give up on it
                return
        self._sel.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
