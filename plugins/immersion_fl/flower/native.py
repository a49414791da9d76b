"""SIFL inside a Flower app of the user's own: a strategy wrapper and a client mod.

The pattern of Flower's own DP wrappers (``DifferentialPrivacyClientSideFixedClipping`` around the
user's strategy on the server, ``fixedclipping_mod`` on the client), for flwr 1.41's Message API:

* :class:`SiflStrategy` wraps the user's strategy (e.g. ``FedAvg``). It holds the keys. Before a
  round it encodes the global model (seed 000 eq. 19, fresh round noise; M2: eq. 26's ``p``
  columns) into one array ``sifl.encoded`` and lets the wrapped strategy build the messages; it
  adds the client kit (``Pi1``, ``Pi1_left``, M2's ``Pi2^R``; never ``N1``) for nodes that have not
  received it. The wrapped strategy aggregates the encoded uploads as usual (weights |D_i|/|D|:
  seed 000 eq. 2); the wrapper applies the aggregator coding (M2: eq. 31) and decodes (eq. 21, 25)
  into the user's arrays.
* :func:`sifl_mod` on the client decodes the received ``sifl.encoded`` into the user's ArrayRecord
  (keys, shapes, dtypes as the server's), calls the user's train function, and replaces the reply's
  arrays by the lifted change (seed 000 section 7: ``w~ - Pi1 (w_start - w_end)``). On evaluate
  messages it only decodes. Attach it per function: ``@app.train(mods=[sifl_mod])`` and
  ``@app.evaluate(mods=[sifl_mod])``.

With float64 arrays the decoded global model equals the same app without the wrapper (tested to
1e-9, tests/test_flower_native.py). What it protects (THREAT_MODEL.md): an eavesdropper on the
links sees only encoded arrays; every client holding the kit decodes the global model.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any, Iterable, Mapping

import numpy as np
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Error,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import ErrorCode
from flwr.common.logger import log as flower_log
from flwr.serverapp.strategy import Strategy
from immersion import InvalidArgumentError

from ..scheme import SchemeContext
from ..schemes import ClientKit, SiflM1, SiflOptions

if TYPE_CHECKING:
    import torch
    from flwr.clientapp.typing import ClientAppCallable
    from flwr.serverapp import Grid

LOG = logging.getLogger("immersion.fl")

ENCODED = "sifl.encoded"  # the one array of an encoded broadcast or upload
KIT = "sifl.kit"  # the ArrayRecord with the client kit
LAYOUT = "sifl.layout"  # the user's ArrayRecord layout (JSON), in the ConfigRecord
SIFL_SCHEMES = ("sifl-m1", "sifl-m2", "sifl-rm")


class Layout:
    """Names, shapes and dtypes of the user's ArrayRecord, and the flat vector they make.

    Parameters
    ----------
    entries:
        ``(name, shape, dtype string)`` of every array, in the record's order.

    Examples
    --------
    >>> import numpy as np
    >>> layout = Layout([("w", (2, 2), "<f8"), ("b", (2,), "<f8")])
    >>> record = layout.unflatten(np.arange(6.0))
    >>> layout.flatten(record).tolist(), Layout.from_json(layout.to_json()).sizes
    ([0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [4, 2])
    """

    def __init__(self, entries: list[tuple[str, tuple[int, ...], str]]) -> None:
        self.entries = entries
        self.sizes = [int(np.prod(shape)) for _, shape, _ in entries]

    @classmethod
    def of(cls, arrays: ArrayRecord) -> "Layout":
        """The layout of ``arrays``; refuses arrays other than float64 (exact decoding needs it).

        Parameters
        ----------
        arrays:
            The user's model as a Flower ArrayRecord.
        """
        entries = []
        for name, array in arrays.items():
            value = array.numpy()
            if value.dtype != np.float64:
                raise InvalidArgumentError(
                    "arrays",
                    f"{name!r} is {value.dtype}; SIFL decodes exactly only float64 models "
                    "(call model.double() on both sides)",
                )
            entries.append((name, tuple(int(s) for s in value.shape), value.dtype.str))
        return cls(entries)

    def to_json(self) -> str:
        """The layout as JSON (sent in the ConfigRecord)."""
        return json.dumps([[name, list(shape), dtype] for name, shape, dtype in self.entries])

    @classmethod
    def from_json(cls, text: str) -> "Layout":
        """Read :meth:`to_json`'s output.

        Parameters
        ----------
        text:
            The JSON text.
        """
        return cls(
            [(str(n), tuple(int(s) for s in shape), str(d)) for n, shape, d in json.loads(text)]
        )

    def flatten(self, arrays: ArrayRecord) -> np.ndarray:
        """One float64 vector from ``arrays`` (in the layout's order; names and shapes checked).

        Parameters
        ----------
        arrays:
            A record with this layout's names and shapes.
        """
        names = [name for name, _, _ in self.entries]
        if list(arrays.keys()) != names:
            raise InvalidArgumentError(
                "arrays", f"expected the arrays {names}, got {list(arrays.keys())}"
            )
        parts = []
        for (name, shape, _), array in zip(self.entries, arrays.values(), strict=True):
            value = array.numpy()
            if tuple(value.shape) != shape:
                raise InvalidArgumentError(
                    "arrays", f"{name!r} has shape {value.shape}, expected {shape}"
                )
            parts.append(np.asarray(value, dtype=np.float64).reshape(-1))
        return np.concatenate(parts) if parts else np.zeros(0)

    def unflatten(self, vector: np.ndarray) -> ArrayRecord:
        """The user's ArrayRecord from one vector.

        Parameters
        ----------
        vector:
            A flat vector of the layout's total size.
        """
        out, start = {}, 0
        for (name, shape, dtype), size in zip(self.entries, self.sizes, strict=True):
            out[name] = Array(
                np.ascontiguousarray(vector[start : start + size].reshape(shape), dtype=dtype)
            )
            start += size
        return ArrayRecord(out)


class SiflStrategy(Strategy):
    """Add SIFL M1, M2 or the random-matrix SIFL to a Flower strategy (server side).

    Parameters
    ----------
    strategy:
        The user's Flower strategy (e.g. ``flwr.serverapp.strategy.FedAvg``); it samples the
        nodes, builds the messages and averages the (encoded) replies as it always does. Its
        aggregation must be the weighted mean of seed 000 eq. 2 (FedAvg's).
    scheme:
        ``"sifl-m1"``, ``"sifl-m2"`` or ``"sifl-rm"``.
    min_samples:
        The smallest client dataset size |D_i|: the sensitivity ``2C/|D_i|`` (seed 000 Remark 3)
        that calibrates the round noise to ``epsilon_local``. None: no noise design and no DP
        figures (the noise keeps unit scale, as ``sifl-rm`` always does).
    rng:
        Seed or Generator for the keys and the round noise (None: OS entropy).
    **options:
        :class:`~immersion_fl.schemes.SiflOptions` fields (``epsilon_local``, ``keys``, ``p``, ...).

    Examples
    --------
    In the ServerApp::

        strategy = SiflStrategy(FedAvg(fraction_evaluate=0.5), "sifl-m1", min_samples=140)
        result = strategy.start(grid=grid, initial_arrays=arrays, num_rounds=3)
    """

    def __init__(
        self,
        strategy: Strategy,
        scheme: str = "sifl-m1",
        *,
        min_samples: int | None = None,
        rng: int | np.random.Generator | None = None,
        **options: Any,
    ) -> None:
        if scheme not in SIFL_SCHEMES:
            raise InvalidArgumentError("scheme", f"expected one of {SIFL_SCHEMES}, got {scheme!r}")
        if not isinstance(strategy, Strategy):
            raise InvalidArgumentError(
                "strategy", f"expected a Flower Strategy, got {type(strategy).__name__}"
            )
        if min_samples is not None and (
            isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 1
        ):
            raise InvalidArgumentError(
                "min_samples", f"expected an integer >= 1 or None, got {min_samples!r}"
            )
        super().__init__()
        self.options = _sifl_options(options)
        self.options.check_engine("flower")
        if self.options.arithmetic != "float":
            raise InvalidArgumentError(
                "arithmetic",
                "the wrapped strategy averages the uploads in floating point; modular "
                "coding needs integer sums (run it with immersion_fl.run or immersion fl run)",
            )
        if self.options.secure_aggregation:
            raise InvalidArgumentError(
                "secure_aggregation",
                "SiflStrategy hands the uploads to your strategy's own aggregation; secure "
                "aggregation runs in immersion_fl.run / immersion fl run (local or Flower engine)",
            )
        self.strategy, self.scheme_name, self.min_samples = strategy, scheme, min_samples
        self._rng = np.random.default_rng(rng)
        self.scheme: SiflM1 | None = None
        self.layout: Layout | None = None
        self._kit: ArrayRecord | None = None
        self._nodes_with_kit: set[int] = set()

    def __repr__(self) -> str:
        return f"SiflStrategy({self.scheme_name}, wrapping {self.strategy!r})"

    def summary(self) -> None:
        """Log the wrapper's settings, then the wrapped strategy's (Flower's log, as Flower's
        own DP wrappers do, so that ``flwr run --stream`` shows them)."""
        flower_log(logging.INFO, "\t├──> SIFL wrapper: %s", self.scheme_name)
        flower_log(logging.INFO, "\t│\t└── options: %s", self.options)
        self.strategy.summary()

    def _log_privacy(self, server_round: int) -> None:
        """One line per round: the scheme and its per-element, per-round epsilons (seed 000
        Theorem 1, eq. 41/44; the global one bounded with |D| taken as ``min_samples``)."""
        figures = self.privacy()
        if figures["epsilon_local"] is None:
            why = "sifl-rm makes no DP claim" if self.scheme_name == "sifl-rm" else "no min_samples"
            flower_log(
                logging.INFO,
                "SIFL %s round %d: no epsilon (%s)",
                self.scheme_name,
                server_round,
                why,
            )
            return
        flower_log(
            logging.INFO,
            "SIFL %s round %d: per-element epsilon_local %.3g (each upload, |D_i| >= %d), "
            "epsilon_global <= %.3g (the broadcast, |D| >= |D_i|), %s noise%s",
            self.scheme_name,
            server_round,
            figures["epsilon_local"],
            self.min_samples,
            figures["epsilon_global"],
            figures["noise"],
            "" if figures.get("delta") is None else f", delta {figures['delta']:.3g}",
        )

    def privacy(self) -> dict[str, Any]:
        """The scheme's per-element privacy figures (None entries before keys or without
        ``min_samples``)."""
        if self.scheme is None or self.min_samples is None:
            return {"epsilon_local": None, "epsilon_global": None}
        return self.scheme.privacy([self.min_samples])

    def _setup(self, arrays: ArrayRecord) -> SiflM1:
        import torch
        from immersion.backends import make_backend

        from ..runtime.engine import make_scheme

        self.layout = Layout.of(arrays)
        context = SchemeContext(make_backend("torch", dtype="float64"), self._rng)
        scheme = make_scheme(self.scheme_name, self.options, context)
        assert isinstance(scheme, SiflM1)
        scheme.setup(torch.as_tensor(self.layout.flatten(arrays)))
        if self.min_samples is not None:
            scheme.design_noise([self.min_samples])
        self._kit = _arrays({k: v for k, v in scheme.kit_arrays().items()})
        self.scheme = scheme
        return scheme

    def _with_kit(self, messages: Iterable[Message]) -> list[Message]:
        """Add the client kit for nodes that have not received it."""
        out = list(messages)
        new = [m for m in out if m.metadata.dst_node_id not in self._nodes_with_kit]
        for message in out:
            content = message.content
            if new and KIT not in content:
                # the RecordDict may be shared by every message of the round
                content[KIT] = self._kit
        self._nodes_with_kit |= {m.metadata.dst_node_id for m in new}
        return out

    def _configure(
        self, kind: str, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: "Grid"
    ) -> list[Message]:
        scheme = self.scheme or self._setup(arrays)
        assert self.layout is not None
        if kind == "train":
            payload = scheme.broadcast(server_round - 1).cpu().numpy()
        else:  # evaluate: the decoded global model under a fresh M1-style code (clients decode it)
            payload = (
                scheme.encode_for_clients(_torch_vector(self.layout.flatten(arrays))).cpu().numpy()
            )
        encoded = _arrays({ENCODED: payload})
        config[LAYOUT] = self.layout.to_json()
        wrapped = (
            self.strategy.configure_train if kind == "train" else self.strategy.configure_evaluate
        )
        return self._with_kit(wrapped(server_round, encoded, config, grid))

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: "Grid"
    ) -> Iterable[Message]:
        """Encode the global model and let the wrapped strategy configure the round.

        Parameters
        ----------
        server_round:
            The round, from 1.
        arrays:
            The user's global model (decoded).
        config:
            The round's configuration (the layout is added to it).
        grid:
            The Flower grid the wrapped strategy samples nodes from.

        Returns
        -------
        Iterable[Message]
            The wrapped strategy's messages carrying the encoded model (and the kit, once per
            node).
        """
        return self._configure("train", server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """The wrapped strategy averages the encoded uploads; decode the result into the user's
        arrays.

        Parameters
        ----------
        server_round:
            The round, from 1.
        replies:
            The nodes' replies (encoded uploads, from :func:`sifl_mod`).

        Returns
        -------
        tuple
            The decoded global model as the user's ArrayRecord (None if nothing was aggregated)
            and the wrapped strategy's metrics.
        """
        aggregated, metrics = self.strategy.aggregate_train(server_round, replies)
        if aggregated is None or self.scheme is None or self.layout is None:
            return aggregated, metrics
        if list(aggregated.keys()) != [ENCODED]:
            raise InvalidArgumentError(
                "replies",
                "expected encoded uploads; is sifl_mod attached to the "
                f"ClientApp's train function? got arrays {list(aggregated.keys())}",
            )
        w_sum = _torch_vector(aggregated[ENCODED].numpy())
        self.scheme.server_update(self.scheme.aggregator_code(w_sum))
        self._log_privacy(server_round)
        return self.layout.unflatten(self.scheme.global_model().cpu().numpy()), metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: "Grid"
    ) -> Iterable[Message]:
        """Send the global model encoded; the clients' mod decodes it for the user's evaluate.

        Parameters
        ----------
        server_round, arrays, config, grid:
            As in :meth:`configure_train`.
        """
        return self._configure("evaluate", server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        """The wrapped strategy's aggregation of the evaluation metrics.

        Parameters
        ----------
        server_round, replies:
            As in :meth:`aggregate_train` (the replies carry metrics only).
        """
        return self.strategy.aggregate_evaluate(server_round, replies)


def sifl_mod(msg: Message, ctxt: Context, call_next: "ClientAppCallable") -> Message:
    """Client mod for :class:`SiflStrategy`: decode before the user's function, lift after it.

    Parameters
    ----------
    msg:
        The incoming train or evaluate message.
    ctxt:
        The node's context (keeps the client kit in ``ctxt.state`` between rounds).
    call_next:
        The next mod or the user's function.

    Returns
    -------
    Message
        The user's reply with its arrays replaced by the encoded upload (train), the user's reply
        (evaluate), or an error message (``MOD_FAILED_PRECONDITION``) if the server is not wrapped.
    """
    import torch
    from immersion.backends import make_backend

    configs = list(msg.content.config_records.values())
    if not configs or LAYOUT not in configs[0] or ENCODED not in _first_arrays(msg):
        return _error(
            msg,
            "sifl_mod needs messages from a ServerApp whose strategy is wrapped in SiflStrategy",
        )
    if KIT in msg.content:
        ctxt.state[KIT] = msg.content[KIT]
    if KIT not in ctxt.state:
        return _error(
            msg, "sifl_mod has no client kit yet (the server sends it in the node's first message)"
        )
    layout = Layout.from_json(str(configs[0][LAYOUT]))
    kit = ClientKit.from_arrays(
        {k: v.numpy() for k, v in ctxt.state[KIT].items()}, make_backend("torch", dtype="float64")
    )
    key = _arrays_key(msg)
    received = torch.as_tensor(msg.content[key][ENCODED].numpy())
    encoded, w_start = kit.open(received)
    # the received content may be shared (in-process runtimes): never edit it
    content = RecordDict({k: v for k, v in msg.content.items() if k != KIT})
    content[key] = layout.unflatten(w_start.numpy())
    msg.content = content
    reply = call_next(msg, ctxt)
    if reply.has_error() or msg.metadata.message_type != "train":
        return reply
    out_key = _arrays_key(reply)
    try:
        w_end = torch.as_tensor(layout.flatten(reply.content[out_key]))
    except InvalidArgumentError as exc:
        return _error(msg, f"sifl_mod: the reply's arrays do not match the model sent: {exc}")
    upload = kit.lift(encoded, w_start, w_end)
    reply.content[out_key] = ArrayRecord({ENCODED: Array(upload.numpy())})
    return reply


def _first_arrays(msg: Message) -> Mapping[str, Array]:
    records = list(msg.content.array_records.values())
    return records[0] if records else {}


def _arrays_key(msg: Message) -> str:
    keys = [k for k in msg.content.array_records.keys() if k != KIT]
    if len(keys) != 1:
        raise InvalidArgumentError("msg", f"sifl_mod expects exactly one ArrayRecord, found {keys}")
    return keys[0]


def _error(msg: Message, reason: str) -> Message:
    LOG.error(reason)
    return Message(Error(code=ErrorCode.MOD_FAILED_PRECONDITION, reason=reason), reply_to=msg)


def _arrays(payload: dict[str, np.ndarray]) -> ArrayRecord:
    return ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in payload.items()})


def _torch_vector(values: np.ndarray) -> "torch.Tensor":
    import torch

    return torch.as_tensor(values, dtype=torch.float64)


def _sifl_options(values: dict[str, Any]) -> SiflOptions:
    import dataclasses

    known = {f.name for f in dataclasses.fields(SiflOptions)}
    for name in values:
        if name not in known:
            raise InvalidArgumentError(name, f"is not a SIFL option; known: {sorted(known)}")
    return SiflOptions(**values)


__all__ = ["Layout", "SiflStrategy", "sifl_mod"]
