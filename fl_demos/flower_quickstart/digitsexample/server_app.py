"""digitsexample: A Flower / PyTorch app."""

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from digitsexample.task import Net, load_centralized_dataset, test

# Create ServerApp
app = ServerApp()

#: Run-config defaults (``flwr run`` reads them from pyproject.toml; Flower's in-process
#: ``run_simulation`` passes an empty run config).
DEFAULTS = {
    "fraction-evaluate": 0.5,
    "num-server-rounds": 3,
    "learning-rate": 0.05,
    "seed": 0,
    "final-model": "final_model.pt",
}


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Main entry point for the ServerApp."""

    # Read run config
    config = {**DEFAULTS, **dict(context.run_config)}
    fraction_evaluate: float = config["fraction-evaluate"]
    num_rounds: int = config["num-server-rounds"]
    lr: float = config["learning-rate"]

    # Load global model (seeded: two runs of the app start from the same weights)
    torch.manual_seed(config["seed"])
    global_model = Net()
    arrays = ArrayRecord(global_model.state_dict())

    # Initialize FedAvg strategy
    strategy = FedAvg(fraction_evaluate=fraction_evaluate)

    # Start strategy, run FedAvg for `num_rounds`
    result = strategy.start(
        grid=grid,
        initial_arrays=arrays,
        train_config=ConfigRecord({"lr": lr}),
        num_rounds=num_rounds,
        evaluate_fn=global_evaluate,
    )

    # Save final model to disk
    print("\nSaving final model to disk...")
    torch.save(result.arrays.to_torch_state_dict(), config["final-model"])


def global_evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    """Evaluate model on central data."""
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    test_loss, accuracy = test(model, load_centralized_dataset(), torch.device("cpu"))
    return MetricRecord({"accuracy": accuracy, "loss": test_loss})
