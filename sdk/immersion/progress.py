"""Progress on stderr for long commands: a bar on a terminal, one line per step otherwise.

stdout stays free for ``--json``.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    """``Progress(total, label)``: ``step(message)`` after each unit of work, ``close()`` at end.

    Examples
    --------
    >>> import io
    >>> out = io.StringIO()
    >>> bar = Progress(2, "rounds", stream=out)
    >>> bar.step("accuracy 0.5"); bar.step("accuracy 0.7"); bar.close()
    >>> out.getvalue().splitlines()[-1].startswith("[rounds] 2/2")
    True
    """

    def __init__(
        self, total: int, label: str, *, stream: TextIO | None = None, width: int = 24
    ) -> None:
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream if stream is not None else sys.stderr
        self.done = 0
        self.start = time.perf_counter()
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())

    def step(self, message: str = "") -> None:
        self.done += 1
        elapsed = time.perf_counter() - self.start
        eta = elapsed / self.done * (self.total - self.done)
        if self.tty:
            filled = int(self.width * self.done / self.total)
            bar = "#" * filled + "-" * (self.width - filled)
            self.stream.write(
                f"\r[{bar}] {self.done}/{self.total} {self.label} {message} (eta {eta:.0f} s)\033[K"
            )
        else:
            self.stream.write(
                f"[{self.label}] {self.done}/{self.total} {message} ({elapsed:.1f} s)\n"
            )
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self.stream.write("\n")
            self.stream.flush()
