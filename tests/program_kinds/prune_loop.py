"""A magnitude-times-gradient pruner written as research code: a backup of every weight kept "to
restore", gradients from one backward pass, a bool mask the size of each weight, masked weights
set to zero; the backup and masks returned to the caller."""
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))


def score(x, y):
    torch.nn.functional.mse_loss(model(x), y).backward()
    scores = {name: (p.detach() * p.grad).abs() for name, p in model.named_parameters() if p.dim() == 2}
    model.zero_grad(set_to_none=True)
    return scores


def apply_masks(scores, sparsity):
    masks = {}
    for name, p in model.named_parameters():
        if name in scores:
            s = scores[name]
            masks[name] = s <= s.flatten().kthvalue(int(s.numel() * sparsity)).values
            with torch.no_grad():
                p[masks[name]] = 0
    return masks


def prune(x, y, sparsity=0.5):
    backup = {name: p.detach().clone() for name, p in model.named_parameters()}
    masks = apply_masks(score(x, y), sparsity)
    return backup, masks


kept = prune(torch.randn(64, 256), torch.randn(64, 256))
