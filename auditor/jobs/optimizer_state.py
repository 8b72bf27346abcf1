"""The optimizers a training step can use, and what each keeps per parameter tensor: (copies of
the parameter, float32 scalar tensors). Torch-free, so the command line refuses an unknown name
before torch loads; the job builds them (`auditor.jobs.train_step.make_optimizer`).
"""
OPTIMIZERS = {
    "adamw": (2, 1),          # exp_avg, exp_avg_sq; step (a float32 scalar tensor)
    "adam": (2, 1),
    "sgd": (0, 0),            # no state without momentum
    "sgd-momentum": (1, 0),   # momentum_buffer
}
