"""A task's output on its way to its logs: read in bounded chunks, its secrets masked.

Example:
    >>> from substrax.compute._pump import Redactor
    >>> redact = Redactor({"TOKEN": "tok-9f8e", "SHORT": "1"})
    >>> redact("step 1 token tok-9f8e")
    'step 1 token ***'
    >>> redact.too_short
    ('SHORT',)
"""

import codecs
import contextlib
import re
import sys
import threading
from collections.abc import Mapping
from typing import IO, BinaryIO


MIN_SECRET_LENGTH = 4
"""A secret whose value is shorter is not masked: it would mask those characters everywhere."""
CHUNK_BYTES = 64 * 1024
"""The most a pump reads of a task's pipe at once: output without newlines is never held whole."""
ECHO_LINE_CHARS = 16 * 1024
"""The longest line a pump echoes: a longer one (a progress bar without newlines) is cut."""
_LINE_END = re.compile(r"(\r?\n|\r)")  # a progress bar's \r ends what is shown, as \n does


class Redactor:
    """Replaces each secret's value with ``***`` in text that goes to a log.

    Args:
        secrets: The job's secrets, ``{variable: value}``. A value shorter than
            ``MIN_SECRET_LENGTH`` (``SHORT=1``) is not masked, since every ``1`` of every line
            would go; ``too_short`` names those variables (never their values).
    """

    def __init__(self, secrets: Mapping[str, str]) -> None:
        self.too_short = tuple(
            sorted(name for name, value in secrets.items() if 0 < len(value) < MIN_SECRET_LENGTH)
        )
        values = {value for value in secrets.values() if len(value) >= MIN_SECRET_LENGTH}
        ordered = sorted(values, key=len, reverse=True)  # the longest first, where two overlap
        self._pattern = re.compile("|".join(map(re.escape, ordered))) if ordered else None
        self._hold = max(map(len, ordered), default=1) - 1

    def __call__(self, text: str) -> str:
        return text if self._pattern is None else self._pattern.sub("***", text)

    def split(self, text: str, *, final: bool) -> tuple[str, str]:
        """``text`` as two parts: the masked part to write now, the rest to hold for more text.

        The rest is the tail that could begin a secret's value which the next chunk completes
        (none when ``final``).
        """
        if final or self._pattern is None:
            return self(text), ""
        cut = max(0, len(text) - self._hold)
        for match in self._pattern.finditer(text):
            if match.start() < cut < match.end():
                cut = match.end()  # a whole value, written masked now
        return self(text[:cut]), text[cut:]


def echo(prefix: str, line: str) -> bool:
    """Write ``line`` to stdout after ``prefix``; False when stdout is full or closed.

    A character stdout's encoding lacks (a C locale) is shown replaced, never an error.
    """
    text = f"{prefix}{line if line.endswith(chr(10)) else line + chr(10)}"
    try:
        try:
            sys.stdout.write(text)
        except UnicodeEncodeError:
            encoding = sys.stdout.encoding or "ascii"
            sys.stdout.write(text.encode(encoding, errors="replace").decode(encoding))
        sys.stdout.flush()
    except (OSError, ValueError):
        return False
    return True


class Pump(threading.Thread):
    r"""Copies one of a task's pipes to its log (and stdout) until the pipe closes; owns the log.

    It never stops reading, so the task never blocks on a full pipe, and reads at most
    ``CHUNK_BYTES`` at a time, so output without newlines (a progress bar's ``\r``) is written
    as it comes and never held whole. The log is written as UTF-8 whatever the locale
    (undecodable bytes replaced), secrets masked (:class:`Redactor`). The echo shows each line,
    each ``\r``-ended part of one, at most ``ECHO_LINE_CHARS`` long. Once a write to the log
    fails (a full disk, a file size limit), the rest of the output is discarded, and ``lost``
    counts its bytes (the chunk that failed included) and ``reason`` says why. An echo that
    fails ends the echo only.
    """

    def __init__(
        self, stream: IO[bytes], log: BinaryIO, name: str, prefix: str | None, redact: Redactor
    ) -> None:
        super().__init__(daemon=True)  # a process that left the task's group may hold its pipe
        self.stream, self.log, self.name = stream, log, name
        self.prefix, self.redact = prefix, redact
        self.lost = 0
        self.reason: str | None = None
        self._line = ""  # the echo's unfinished line

    def run(self) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        held = ""  # text that may begin a secret's value
        try:
            while True:
                raw = _read(self.stream)
                final = not raw
                if self.reason is not None:
                    self.lost += len(raw)
                else:
                    text, held = self.redact.split(
                        held + decoder.decode(raw, final=final), final=final
                    )
                    self._write(len(raw), text.encode())
                    self._echo(text, final=final)
                if final:
                    return
        finally:
            with contextlib.suppress(OSError):
                self.log.close()

    def _write(self, size: int, data: bytes) -> None:
        view = memoryview(data)
        try:
            while view:
                written = self.log.write(view) or 0
                if not written:
                    break
                view = view[written:]
        except OSError as error:
            self.reason = f"writing {self.name} failed: {error}"
        else:
            if view:
                self.reason = f"writing {self.name} failed: the file took no more bytes"
        if self.reason is not None:
            self.lost += size

    def _echo(self, text: str, *, final: bool) -> None:
        if self.prefix is None:
            return
        whole = self._line + text
        keep = "\r" if whole.endswith("\r") and not final else ""  # a \r\n cut in two
        parts = _LINE_END.split(whole[: len(whole) - len(keep)])
        pairs = zip(parts[:-1:2], parts[1::2], strict=True)  # (a line, how it ended)
        lines = [line for line, end in pairs if line or end != "\r"]  # not a bar's leading \r
        rest = parts[-1]
        if final and rest:
            lines.append(rest)
            rest = ""
        while len(rest) > ECHO_LINE_CHARS:  # held parts start ECHO_LINE_CHARS apart
            lines.append(rest[:ECHO_LINE_CHARS])
            rest = rest[ECHO_LINE_CHARS:]
        self._line = rest + keep
        for line in lines:  # cut where it falls, whatever the reads that brought it
            for start in range(0, max(len(line), 1), ECHO_LINE_CHARS):
                if not echo(self.prefix, line[start : start + ECHO_LINE_CHARS]):
                    self.prefix = None  # stdout is full or closed: the log holds the output
                    return


def _read(stream: IO[bytes]) -> bytes:
    """What ``stream`` holds now, ``CHUNK_BYTES`` at most; ``b""`` once it is closed."""
    read1 = getattr(stream, "read1", None)
    return read1(CHUNK_BYTES) if read1 is not None else stream.read(CHUNK_BYTES)
