"""Module-level Flower apps for Flower's deployment runtime (SuperLink + SuperNodes), via ``flwr run``.

The run configuration comes from ``[tool.flwr.app.config]`` (or ``flwr run --run-config``), with
the :class:`~immersion_fl.engine.RunConfig` field names (``hidden`` as "200,200"). Each SuperNode
gives its ``partition-id`` in ``--node-config``. See fl_demos/flower_app/ and the README.
"""
from __future__ import annotations

import dataclasses
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


server_app = ServerApp()
client_app = ClientApp()
client_app.train()(client_train)


@server_app.main()
def main(grid: Any, context: Any) -> None:
    result = serve(grid, config_from_run_config(dict(context.run_config)), plan=FaultPlan(), progress=stderr_progress)
    print(json.dumps(result.summary()), flush=True)
