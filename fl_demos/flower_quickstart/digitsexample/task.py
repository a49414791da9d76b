"""digitsexample: the model, the data and the train/test loops (Flower's quickstart-pytorch on
digits).

Differences from Flower's example, each needed here: sklearn's bundled digits instead of CIFAR-10
(no downloads), 1x8x8 inputs, float64 (SIFL decodes exactly in float64), and a batch order seeded
per node and round so that two runs of the app train on the same batches.
"""

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    """Model (the quickstart's LeNet-style CNN, sized for 8x8 digits), float64."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 2 * 2, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)
        self.double()

    def forward(self, x):
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.view(-1, 16 * 2 * 2)
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)


def _digits():
    """sklearn's 1,797 digits in [0, 1]: 80 % for the nodes, 20 % held out (fixed split)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.as_tensor(bunch.images[:, None] / 16.0, dtype=torch.float64)
    y = torch.as_tensor(bunch.target, dtype=torch.long)
    order = np.random.default_rng(0).permutation(len(y))
    cut = int(0.8 * len(y))
    return (x[order[:cut]], y[order[:cut]]), (x[order[cut:]], y[order[cut:]])


def load_data(partition_id: int, num_partitions: int, batch_size: int, seed: int = 0):
    """The node's IID partition: 80 % train (shuffled with ``seed``), 20 % validation."""
    (x, y), _ = _digits()
    part = np.array_split(np.arange(len(y)), num_partitions)[partition_id]
    cut = int(0.8 * len(part))
    train, val = part[:cut], part[cut:]
    generator = torch.Generator().manual_seed(seed)
    trainloader = DataLoader(
        TensorDataset(x[train], y[train]), batch_size=batch_size, shuffle=True, generator=generator
    )
    valloader = DataLoader(TensorDataset(x[val], y[val]), batch_size=batch_size)
    return trainloader, valloader


def load_centralized_dataset():
    """The held-out 20 %."""
    _, (x, y) = _digits()
    return DataLoader(TensorDataset(x, y), batch_size=128)


def train(net, trainloader, epochs, lr, device):
    """Train the model on the training set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    running_loss = 0.0
    for _ in range(epochs):
        for images, labels in trainloader:
            optimizer.zero_grad()
            loss = criterion(net(images.to(device)), labels.to(device))
            loss.backward()
            optimizer.step()
            running_loss += loss.item()
    return running_loss / len(trainloader)


def test(net, testloader, device):
    """Validate the model on the test set."""
    net.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    correct, loss = 0, 0.0
    with torch.no_grad():
        for images, labels in testloader:
            outputs = net(images.to(device))
            loss += criterion(outputs, labels.to(device)).item()
            correct += (torch.max(outputs.data, 1)[1] == labels.to(device)).sum().item()
    return loss / len(testloader), correct / len(testloader.dataset)
