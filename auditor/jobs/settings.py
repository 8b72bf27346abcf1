"""What each job is told: its settings, one dataclass per job. This module imports nothing heavy,
so a command line reads the defaults from these fields before torch loads (auditor.cli.job_options
turns them into its options' defaults): every default is written here and nowhere else.

    GradProbeSettings    the GradProbe audit (auditor.jobs.gradprobe.Settings)
    TrainStepSettings    one training-step configuration (auditor.jobs.train_step.Settings)
"""
from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

RANK_VARIANT = "sharded"  # the one GradProbe variant that runs on ranks (auditor.jobs.rank_projection)


@dataclass
class GradProbeSettings:
    architecture: str = "tinystories-33m"
    overrides: dict = field(default_factory=dict)
    variant: str = "baseline"
    strategy: str = "magnitude"
    device: str = "cpu"
    sequence_length: int = 128
    batch_size: int = 1
    batches: int = 2
    sparsity: float = 0.1
    reduction: float = 0.1
    threshold: float = 2.0
    seed: int = 0
    weights_dtype: str = "float32"  # of the weights folder, for a variant pruned from one (streaming)

    @property
    def tokens(self) -> int:
        return self.sequence_length * self.batch_size


@dataclass
class TrainStepSettings:
    architecture: str = "tinystories-33m"
    overrides: dict = field(default_factory=dict)
    device: str = "cpu"
    batch_size: int = 1
    sequence_length: int = 128
    accumulation: int = 1
    steps: int = 6
    optimizer: str = "adamw"
    precision: str = "fp32"
    learning_rate: float = 1e-4
    seed: int = 0

    @property
    def label(self) -> str:
        return f"{self.architecture} seq {self.sequence_length} {self.precision}"


def defaults(settings_class: type) -> dict[str, Any]:
    """Each field's default by field name (a default factory called)."""
    found = {}
    for item in fields(settings_class):
        if item.default is not MISSING:
            found[item.name] = item.default
        elif item.default_factory is not MISSING:
            found[item.name] = item.default_factory()
    return found
