"""The encoding noise of seed 002 eq. 16, drawn a block of samples ahead of time.

``encode_input`` needs fresh noise ``s_k`` on every call; drawing it one small vector at a time
costs a generator call per sample (more than the encode itself for a control loop's sizes).
:class:`NoiseBlocks` draws ``rows`` samples in one call and hands them out in order. A numpy
``Generator`` fills a ``(rows, m)`` array in the order ``rows`` draws of ``(m,)`` would, so the
sequence of ``s_k`` is the one the unblocked encoder drew (same law, same stream; the encoded
values differ from the unblocked ones only by rounding when the noise is also encoded ahead).

With ``project`` (the dense ``s -> N1 s``) the block holds ``N1 s`` instead of ``s``: one matrix
product per block instead of one per sample.
"""

from __future__ import annotations

from typing import Any, Callable

#: Entries of one block (rows x width): 64 KiB of float64, whatever the width.
BLOCK_ENTRIES = 8192
#: Most samples drawn ahead.
MAX_ROWS = 256


def block_rows(width: int) -> int:
    """Samples per block for vectors of ``width`` entries (1: blocks would not help).

    Examples
    --------
    >>> block_rows(3), block_rows(100), block_rows(100_000)
    (256, 81, 1)
    """
    return max(1, min(MAX_ROWS, BLOCK_ENTRIES // max(1, width)))


class NoiseBlocks:
    """Noise samples drawn ``rows`` at a time and handed out in order.

    Parameters
    ----------
    draw : callable
        ``draw(shape)``: i.i.d. noise of that shape (the law's ``laplace``/``normal`` call).
    n_noise : int
        Entries of one ``s_k``.
    rows : int
        Samples per block.
    project : callable, optional
        Applied to each block as a whole (``s -> N1 s`` for a dense code); ``take`` then returns
        the projected samples.

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> blocks = NoiseBlocks(lambda shape: rng.laplace(0.0, 1.0, shape), 2, rows=4)
    >>> first = [blocks.take(()) for _ in range(5)]
    >>> reference = np.random.default_rng(0)
    >>> same = [reference.laplace(0.0, 1.0, (2,)) for _ in range(5)]
    >>> all((a == b).all() for a, b in zip(first, same))
    True
    """

    def __init__(
        self,
        draw: Callable[[tuple[int, ...]], Any],
        n_noise: int,
        *,
        rows: int,
        project: Callable[[Any], Any] | None = None,
    ) -> None:
        self._draw, self._n_noise, self._rows = draw, n_noise, rows
        self._project = project or (lambda s: s)
        self._block: Any = None
        self._next = rows

    def _fresh(self, count: int) -> Any:
        return self._project(self._draw((count, self._n_noise)))

    def next(self) -> Any:
        """The next single sample (``take(())``, one call less on a control loop's every step)."""
        i = self._next
        if i == self._rows:
            self._block, i = self._fresh(self._rows), 0
        self._next = i + 1
        return self._block[i]

    def take(self, lead: tuple[int, ...]) -> Any:
        """The next samples, shape ``lead + (width,)`` (``lead == ()``: one sample).

        A batch that the current block cannot serve is drawn on its own (the block's remaining
        samples are kept for later calls).
        """
        if not lead:
            if self._next == self._rows:
                self._block, self._next = self._fresh(self._rows), 0
            row = self._block[self._next]
            self._next += 1
            return row
        count = 1
        for n in lead:
            count *= n
        if self._block is not None and count <= self._rows - self._next:
            out = self._block[self._next : self._next + count]
            self._next += count
        else:
            out = self._fresh(count)
        return out.reshape(tuple(lead) + tuple(out.shape[-1:]))
