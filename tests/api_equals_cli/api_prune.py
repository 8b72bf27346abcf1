"""wanda_prune.py under the five-line Python API: one stage around the work (`api_prune.py RUN
untracked`: without `auditor.track`, the model found as the census's own root)."""
import sys

import torch
from wanda_prune import LENGTH, SAMPLES, VOCAB, build_model, prune

import auditor

model = build_model()
samples = [torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(i))
           for i in range(SAMPLES)]
with auditor.Audit(sys.argv[1], census=True, live_tensors=True):
    if sys.argv[2:] != ["untracked"]:
        auditor.track("model", model)
    with auditor.stage("prune"):
        backup = prune(model, samples)
