"""Streaming GradProbe: the baseline's exact decisions with one decoder layer in memory.

    from gradprobe.streaming import StreamingGradProbe, save_model, generate_random_weights
    save_model(model, "weights/")                        # or generate_random_weights(config, ...)
    result = StreamingGradProbe("weights/").prune(batches, out="pruned/", sparsity=0.1)
    result.pruned, mask_digest(result.masks)             # masks read back from disk lazily

Command line: `python -m gradprobe.streaming --help`. See `pruner` for how it works.
"""
from .pruner import Moment, StreamingGradProbe
from .result import StoredMasks, StreamingResult
from .weights_folder import WeightsFolder
from .writing import generate_random_weights, save_model

__all__ = ["StreamingGradProbe", "StreamingResult", "StoredMasks", "Moment", "WeightsFolder",
           "save_model", "generate_random_weights"]
