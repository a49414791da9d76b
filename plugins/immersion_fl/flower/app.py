"""Module-level Flower apps for Flower's deployment runtime (SuperLink + SuperNodes), via
``flwr run``.

The run configuration comes from ``[tool.flwr.app.config]`` (or ``flwr run --run-config``), with
the :class:`~immersion_fl.runtime.engine.RunConfig` field names (``hidden`` as "200,200"). Each
SuperNode gives its ``partition-id`` in ``--node-config``. See fl_demos/flower_app/ and
docs/tutorials/flower.md.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from ..config import RunConfig
from ..runtime.engine import stderr_progress
from ..runtime.faults import FaultPlan
from .engine import client_train, serve

if TYPE_CHECKING:
    from flwr.app import Context, Message
    from flwr.serverapp import Grid

    from ..hookspecs import FlowerHooks


def config_from_run_config(run_config: dict[str, Any]) -> RunConfig:
    """A RunConfig from Flower's flat run config (common fields and the scheme's options; unknown
    keys are refused, naming them).

    Parameters
    ----------
    run_config:
        ``context.run_config``: RunConfig field names and the scheme's option names.
    """
    return RunConfig.from_flat(run_config)


def _scheme_hooks(scheme: str) -> FlowerHooks | None:
    """The Flower hooks of a scheme with its own rounds (``SchemeSpec.flower``), or None."""
    from ..registry import fl_registry

    hooks = fl_registry().fl_scheme(scheme).flower
    return hooks if hooks.server is not None else None


server_app = ServerApp()
client_app = ClientApp()


@client_app.train()
def train(msg: "Message", context: "Context") -> "Message":
    """SIFL/FedAvg messages, or those of a scheme with its own rounds (kind ``scheme/phase``).

    Parameters
    ----------
    msg:
        The server's message.
    context:
        The node's context (``partition-id`` in its node config; state between rounds).
    """
    scheme, namespaced, _ = str(msg.content["config"]["kind"]).partition("/")
    hooks = _scheme_hooks(scheme) if namespaced else None
    return hooks.client(msg, context) if hooks is not None else client_train(msg, context)


@server_app.main()
def main(grid: "Grid", context: "Context") -> None:
    """Run the configured scheme and print its summary as one JSON line.

    Parameters
    ----------
    grid:
        The Flower grid of the run's SuperNodes.
    context:
        The run's context (``run_config`` holds the configuration).
    """
    cfg = config_from_run_config(dict(context.run_config))
    hooks = _scheme_hooks(cfg.scheme)
    work = hooks.server if hooks is not None else serve
    result = work(grid, cfg, plan=FaultPlan(), progress=stderr_progress)
    print(json.dumps(result.summary()), flush=True)
