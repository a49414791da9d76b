"""What :class:`SecureAggregation` and :func:`secure_aggregation_mod` say to each other.

Three stages, each a Flower message of type ``train`` whose ConfigRecord :data:`STAGE` names it:

* ``advertise``: the node makes a fresh X25519 key pair for the round (kept in its
  ``context.state``) and answers with the public key (:data:`KEY`);
* ``upload``: the wrapped strategy's own train message plus every member's public key
  (:data:`PUBLICS`); the node runs the user's train function and answers with its masked vector
  (:data:`MASKED`) and, in clear, the names of the reply's records and metrics (:data:`META`);
* ``reveal``: a survivor answers with its mask seeds with the members named dropped (:data:`SEEDS`).

The vector a node masks (:class:`Packing`): ``w * arrays`` (flattened in the order of the global
model's arrays), ``w * metrics`` (scalars and lists, in sorted name order) and ``w`` itself, where
``w`` is the reply's weighting metric (FedAvg's ``num-examples``). The sum gives the weighted mean
of arrays and metrics and the total weight, nothing per node.
"""

from __future__ import annotations

import functools
import io
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.serverapp.exception import PrivacyBudgetExhausted
from immersion import ImmersionError, InvalidArgumentError
from immersion_fl.runtime.secure import SecureAggregationError

#: HKDF label of the pair seeds (separates them from the other uses of the secure sum).
LABEL = "immersion-flower-secagg"
#: Record names (chosen so that no user app is likely to use them).
STAGE = "secagg.stage"
PUBLICS = "secagg.publics"
KEY = "secagg.key"
MASKED = "secagg.masked"
META = "secagg.meta"
SEEDS = "secagg.seeds"
DROPPED = "secagg.dropped"
#: Where the node keeps its key pair between stages (``context.state``).
STATE = "secagg.state"


class SecureAggregationAborted(SecureAggregationError):
    """A round given up: too few survivors, a survivor that did not reveal, or no usable sum.

    The wrapper returns no model for the round (Flower's loop keeps the previous global model),
    logs the error and keeps it in :attr:`SecureAggregation.aborted`.
    """


class PrivacyBudgetExceeded(ImmersionError, PrivacyBudgetExhausted):
    """The next round would take the secure sum's DP guarantee past ``max_epsilon``.

    Also Flower's ``PrivacyBudgetExhausted``: a ServerApp stops as for Flower's own accountant.

    Parameters
    ----------
    reason : str
        What the round would have spent, and the budget.
    """


def stage_of(content: Any) -> dict[str, Any] | None:
    """The stage record of a message's content as a dict, or None if it has none.

    Parameters
    ----------
    content : RecordDict
        A message's content.
    """
    record = content.get(STAGE) if hasattr(content, "get") else None
    return None if record is None else dict(record)


@dataclass(frozen=True)
class Packing:
    """The layout of the vector a node masks: the model's arrays, the metrics, the weight.

    Parameters
    ----------
    arrays : list of (str, tuple of int, str)
        Name, shape and dtype string of each array of the global model, in its order.
    metrics : list of (str, int)
        Name and length (-1 for a scalar) of each metric except the weight, sorted by name.

    Examples
    --------
    >>> p = Packing([("w", (2,), "<f8")], [("loss", -1)])
    >>> v = p.pack({"w": np.array([1.0, 2.0])}, {"loss": 0.5}, 4.0)
    >>> v.tolist(), p.size
    ([4.0, 8.0, 2.0, 4.0], 4)
    """

    arrays: list[tuple[str, tuple[int, ...], str]]
    metrics: list[tuple[str, int]]

    @property
    def n_array_values(self) -> int:
        """Values of the model's arrays."""
        return sum(int(np.prod(shape)) for _, shape, _ in self.arrays)

    @property
    def size(self) -> int:
        """Values of the packed vector."""
        return self.n_array_values + sum(_length(n) for _, n in self.metrics) + 1

    @staticmethod
    def arrays_layout(arrays: Any) -> list[tuple[str, tuple[int, ...], str]]:
        """Names, shapes and dtypes of an ArrayRecord.

        Parameters
        ----------
        arrays : ArrayRecord
            The record.
        """
        out = []
        for name, array in arrays.items():
            value = array.numpy()
            out.append((str(name), tuple(int(s) for s in value.shape), value.dtype.str))
        return out

    @staticmethod
    def metrics_layout(metrics: Any, weight_key: str) -> list[tuple[str, int]]:
        """Names and lengths of a MetricRecord's entries other than ``weight_key``.

        Parameters
        ----------
        metrics : MetricRecord
            The record.
        weight_key : str
            The weighting metric (not packed as a metric).
        """
        return [
            (str(k), len(v) if isinstance(v, list) else -1)
            for k, v in sorted(metrics.items())
            if k != weight_key
        ]

    def arrays_json(self) -> str:
        """The arrays' layout as JSON (the server sends it; nodes check their reply against it)."""
        return json.dumps([[n, list(s), d] for n, s, d in self.arrays])

    @staticmethod
    def arrays_from_json(text: str) -> list[tuple[str, tuple[int, ...], str]]:
        """Read :meth:`arrays_json`.

        Parameters
        ----------
        text : str
            The JSON text.
        """
        return [(str(n), tuple(int(x) for x in s), str(d)) for n, s, d in json.loads(text)]

    def pack(self, arrays: Any, metrics: Any, weight: float) -> np.ndarray:
        """``[w * arrays, w * metrics, w]`` as float64 (names and shapes checked).

        Parameters
        ----------
        arrays : mapping of str to array-like
            The reply's arrays (numpy arrays or Flower ``Array``).
        metrics : mapping of str to number or list
            The reply's metrics other than the weight.
        weight : float
            The reply's weight.
        """
        names = [name for name, _, _ in self.arrays]
        if list(arrays.keys()) != names:
            raise InvalidArgumentError(
                "arrays", f"expected the arrays {names}, got {list(arrays.keys())}"
            )
        vector, start = np.empty(self.size), 0
        for name, shape, dtype in self.arrays:
            value = as_numpy(arrays[name])
            if tuple(value.shape) != shape or value.dtype.str != dtype:
                raise InvalidArgumentError(
                    "arrays",
                    f"{name!r} is {value.dtype.str} {tuple(value.shape)}; the global model's is "
                    f"{dtype} {shape}",
                )
            end = start + value.size
            # w x in float64 in one pass (the cast first: a float32 array times a Python float
            # would be computed in float32)
            np.multiply(value.reshape(-1), weight, out=vector[start:end], dtype=np.float64)
            start = end
        for name, n in self.metrics:
            end = start + _length(n)
            values = np.asarray(metrics[name], dtype=np.float64).reshape(_length(n))
            np.multiply(values, weight, out=vector[start:end])
            start = end
        vector[-1] = weight
        return vector

    def unpack(self, total: np.ndarray) -> tuple[dict[str, np.ndarray], dict[str, Any], float]:
        """The weighted means of arrays and metrics and the total weight, from the summed vector.

        Parameters
        ----------
        total : np.ndarray
            ``sum_i pack_i`` (float64, :attr:`size` values).
        """
        weight = float(total[-1])
        if not weight > 0:
            raise SecureAggregationAborted(f"the summed weight is {weight}, expected > 0")
        means = total[:-1] / weight
        arrays, start = {}, 0
        for name, shape, dtype in self.arrays:
            size = int(np.prod(shape))
            arrays[name] = means[start : start + size].reshape(shape).astype(np.dtype(dtype))
            start += size
        metrics: dict[str, Any] = {}
        for name, n in self.metrics:
            part = means[start : start + _length(n)]
            metrics[name] = [float(x) for x in part] if n >= 0 else float(part[0])
            start += _length(n)
        return arrays, metrics, weight


def as_numpy(value: Any) -> np.ndarray:
    """A Flower ``Array``'s values, read-only and without a copy when it holds NumPy's ``.npy``
    bytes in C order (``Array.numpy()`` copies them, megabytes per node and round, and parses
    the header again for every array: the headers are parsed once here, they repeat); any other
    array-like through ``numpy()`` or ``np.asarray``.

    Parameters
    ----------
    value : Array or array-like
        What to read.

    Examples
    --------
    >>> from flwr.app import Array
    >>> as_numpy(Array(np.arange(6.0).reshape(2, 3))).tolist()
    [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]
    """
    data = getattr(value, "data", None)
    if getattr(value, "stype", None) != "numpy.ndarray" or not isinstance(data, bytes):
        return value.numpy() if hasattr(value, "numpy") else np.asarray(value)
    # .npy: magic (6 bytes), version (2), header length (2 bytes in 1.0, 4 after), header
    size = 2 if data[6:8] == b"\x01\x00" else 4
    start = 8 + size + int.from_bytes(data[8 : 8 + size], "little")
    header = _npy_header(data[:start])
    if header is None:
        return value.numpy()  # type: ignore[no-any-return]
    shape, dtype = header
    count = int(np.prod(shape))
    return np.frombuffer(data, dtype=dtype, count=count, offset=start).reshape(shape)


@functools.lru_cache(maxsize=256)
def _npy_header(head: bytes) -> tuple[tuple[int, ...], np.dtype] | None:
    """Shape and dtype of a ``.npy`` header; None for Fortran order or objects."""
    stream = io.BytesIO(head)
    version = np.lib.format.read_magic(stream)
    read = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read(stream)
    return None if fortran or dtype.hasobject else (tuple(shape), dtype)


def _length(n: int) -> int:
    return 1 if n < 0 else n
