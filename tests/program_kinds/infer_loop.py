"""An inference loop: a small MLP evaluated on large batches under no_grad, each batch's
activations (128 MiB of hidden units) freed before the next."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256)).eval()


def evaluate(batches):
    total = 0.0
    with torch.no_grad():
        for size in batches:
            total += model(torch.randn(size, 256)).sum().item()
    return total


evaluate([65536] * 2)
