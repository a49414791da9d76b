"""``immersion_fl.run(..., checkpoint=, resume=)``: the Python API checkpoints every round like
``immersion fl run --checkpoint``, and a resumed run equals the uninterrupted one."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from immersion import InvalidArgumentError  # noqa: E402
from immersion_fl import run  # noqa: E402
from immersion_fl.runtime.checkpoint import saved_seed  # noqa: E402


class Interrupted(Exception):
    """Stands for a crash or Ctrl-C in the middle of a run."""


def _problem():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3)).double()
    X = torch.randn(60, 4, dtype=torch.float64)
    y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()
    return net, [(X[:30], y[:30]), (X[30:], y[30:])]


OPTIONS = {"scheme": "sifl-m1", "lr": 0.1, "rounds": 4, "local_epochs": 1, "batch_size": 8}


def test_a_run_resumed_from_its_checkpoint_equals_the_uninterrupted_run(tmp_path):
    net, data = _problem()
    folder = tmp_path / "ckpt"
    lines: list[str] = []

    def stop_in_round_three(line: str) -> None:
        lines.append(line)
        if len(lines) == 3:
            raise Interrupted

    with pytest.raises(Interrupted):  # keys from OS entropy, rounds 1-2 saved
        run(net, data, checkpoint=folder, progress=stop_in_round_three, **OPTIONS)
    assert (folder / "state.npz").exists()
    later: list[str] = []
    resumed = run(net, data, checkpoint=folder, resume=True, progress=later.append, **OPTIONS)
    assert len(later) == 2  # only rounds 3 and 4 ran
    whole = run(net, data, rng=saved_seed(folder), **OPTIONS)  # the same run, uninterrupted
    assert len(resumed.history.round_s) == 4  # two rounds saved, two run now
    for a, b in zip(resumed.model.parameters(), whole.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_checkpoint_arguments_are_checked(tmp_path):
    net, data = _problem()
    with pytest.raises(InvalidArgumentError) as info:
        run(net, data, resume=True, **OPTIONS)
    assert info.value.argument == "resume"
    with pytest.raises(InvalidArgumentError) as info:
        run(net, data, checkpoint=tmp_path, engine="flower", **OPTIONS)
    assert info.value.argument == "checkpoint"
