"""Shared fixtures and helpers for the test suite."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
# CI (.ci/run) replays the same examples every run, so a landing never hangs on a fresh draw;
# a developer's run keeps exploring new ones.
settings.register_profile("ci", parent=settings.get_profile("default"), derandomize=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip GPU tests when torch has no CUDA device."""
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def contractive_system():
    """A small nonlinear contractive system (3 states, 1 input, 1 output)."""
    a = np.array([[0.5, 0.2, 0.0], [0.0, 0.4, 0.3], [0.2, 0.0, 0.6]])
    b = np.array([1.0, -0.5, 0.3])

    def f(x, y):
        return np.tanh(a @ x + b * y[0])

    def g(x, y):
        return np.array([np.sin(x[0]) + x[1] * y[0]])

    return f, g


@pytest.fixture
def flower_task_identity():
    """Flower messages built outside a Flower runtime need a run, node and task identity
    (flwr 1.41 reads them when a Message is made); restored afterwards."""
    from flwr.supercore.task_identity import TaskIdentity

    names = ("_run_id", "_node_id", "_task_id")
    before = {name: getattr(TaskIdentity, name) for name in names}
    for name in names:
        setattr(TaskIdentity, name, 1)
    yield
    for name, value in before.items():
        setattr(TaskIdentity, name, value)
