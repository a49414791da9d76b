"""digitsexample: A Flower / PyTorch app."""

import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from digitsexample.task import Net, load_data
from digitsexample.task import test as test_fn
from digitsexample.task import train as train_fn

# Flower ClientApp
app = ClientApp()


def _config(context: Context) -> dict:
    return {"batch-size": 32, "local-epochs": 5, **dict(context.run_config)}


@app.train()
def train(msg: Message, context: Context):
    """Train the model on local data."""

    # Load the model and initialize it with the received weights
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    device = torch.device("cpu")

    # Load the data (batch order seeded by node and round: reproducible runs)
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    seed = 1000 * int(msg.content["config"]["server-round"]) + partition_id
    trainloader, _ = load_data(partition_id, num_partitions, _config(context)["batch-size"], seed)

    # Call the training function
    train_loss = train_fn(
        model, trainloader, _config(context)["local-epochs"], msg.content["config"]["lr"], device
    )

    # Construct and return reply Message
    model_record = ArrayRecord(model.state_dict())
    metrics = {"train_loss": train_loss, "num-examples": len(trainloader.dataset)}
    content = RecordDict({"arrays": model_record, "metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context):
    """Evaluate the model on local data."""

    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    partition_id = context.node_config["partition-id"]
    num_partitions = context.node_config["num-partitions"]
    _, valloader = load_data(partition_id, num_partitions, _config(context)["batch-size"])
    eval_loss, eval_acc = test_fn(model, valloader, torch.device("cpu"))

    metrics = {"eval_loss": eval_loss, "eval_acc": eval_acc, "num-examples": len(valloader.dataset)}
    content = RecordDict({"metrics": MetricRecord(metrics)})
    return Message(content=content, reply_to=msg)
