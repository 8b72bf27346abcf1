"""wanda_prune.py under the five-line Python API: one stage around the work."""
import sys

import torch

import auditor
from wanda_prune import VOCAB, LENGTH, SAMPLES, build_model, prune

model = build_model()
samples = [torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(i))
           for i in range(SAMPLES)]
with auditor.Audit(sys.argv[1], census=True, live_tensors=True):
    auditor.track("model", model)
    with auditor.stage("prune"):
        backup = prune(model, samples)
