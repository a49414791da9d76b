"""Module-level Flower apps for Flower's deployment runtime (SuperLink + SuperNodes), via ``flwr run``.

The run configuration comes from ``[tool.flwr.app.config]`` (or ``flwr run --run-config``), with
the :class:`~immersion_fl.engine.RunConfig` field names (``hidden`` as "200,200"). Each SuperNode
gives its ``partition-id`` in ``--node-config``. See fl_demos/flower_app/ and the README.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
from typing import Any

from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp

from .engine import RunConfig, stderr_progress
from .faults import FaultPlan
from .flower_engine import client_train, serve


def config_from_run_config(run_config: dict[str, Any]) -> RunConfig:
    """A RunConfig from Flower's run config (unknown keys are refused, naming them)."""
    fields = {f.name: f for f in dataclasses.fields(RunConfig)}
    unknown = sorted(set(run_config) - set(fields))
    if unknown:
        raise ValueError(f"run config: unknown keys {unknown}; known: {sorted(fields)}")
    values = dict(run_config)
    if isinstance(values.get("hidden"), str):
        values["hidden"] = tuple(int(v) for v in values["hidden"].split(","))
    return RunConfig(**values)


def _scheme_module(scheme: str) -> Any:
    """The Flower module of a scheme with its own rounds (``SchemeSpec.flower_module``), or None."""
    from immersion.plugin_manager import registry

    name = registry().fl_scheme(scheme).flower_module
    return importlib.import_module(name) if name else None


server_app = ServerApp()
client_app = ClientApp()


@client_app.train()
def train(msg: Any, context: Any) -> Any:
    """SIFL/FedAvg messages, or those of a scheme with its own rounds (kind ``scheme/phase``)."""
    scheme, namespaced, _ = str(msg.content["config"]["kind"]).partition("/")
    module = _scheme_module(scheme) if namespaced else None
    return module.client_train(msg, context) if module is not None else client_train(msg, context)


@server_app.main()
def main(grid: Any, context: Any) -> None:
    cfg = config_from_run_config(dict(context.run_config))
    module = _scheme_module(cfg.scheme)
    result = (module.serve if module is not None else serve)(
        grid, cfg, plan=FaultPlan(), progress=stderr_progress
    )
    print(json.dumps(result.summary()), flush=True)
