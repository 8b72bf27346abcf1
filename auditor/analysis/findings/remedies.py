"""How to remove what a finding found, in the words of the program's kind.

    text = remedy("full-copy", "training", "optimizer state")

A training step, a pruner and an inference loop hold different things and are fixed in different
ways: a training step's optimizer state is sharded or made smaller, its gradients freed or
consumed in backward, its activations recomputed; a pruner keeps only what it restores, runs its
calibration samples in chunks and streams the model a layer at a time; an inference loop needs
no autograd at all. The kind comes from the record's evidence (`auditor.analysis.findings.program_kind`);
where the record cannot tell, the generic words stand.

Texts are keyed by (rule, kind, category): the most specific key present wins, in the order
(rule, kind, category), (rule, kind, any), (rule, any kind, category), (rule, any, any).
`GENERIC` holds the last of these, one per rule (the rules table prints them).
"""
from __future__ import annotations

from auditor.analysis.findings.program_kind import Kind

ANY = None

_OPTIMIZER_STATE = ("Shard or shrink the optimizer state: shard it across ranks (FSDP2 `fully_shard`, or ZeRO "
                    "stage 1 with `torch.distributed.optim.ZeroRedundancyOptimizer`), keep it in 8 bits "
                    "(bitsandbytes `AdamW8bit`), or offload it to CPU memory (DeepSpeed ZeRO-Offload); AdamW "
                    "keeps two values a parameter, SGD with momentum one, SGD without momentum none. A fused step "
                    "(`AdamW(..., fused=True)`) also drops the step's per-parameter temporaries.")
_TRAINING_COPY = ("Shard or shrink what a training step keeps beside the weights: if it is optimizer state, "
                  "shard it across ranks (FSDP2 `fully_shard`, ZeRO `ZeroRedundancyOptimizer`), keep it in "
                  "8 bits (bitsandbytes `AdamW8bit`) or offload it to CPU memory; if it is a second copy of "
                  "the weights (an EMA, fp32 master weights), keep it in lower precision or on the CPU.")
_TRAINING_GRADIENTS = ("Free gradients between steps and fuse the step into backward: "
                       "`optimizer.zero_grad(set_to_none=True)` so no gradient buffer outlives a step; "
                       "accumulate micro-batches into `.grad` in place, not into a second copy; or step each "
                       "parameter as its gradient is ready (`Tensor.register_post_accumulate_grad_hook`, "
                       "torch's optimizer-step-in-backward) so whole-model gradients never exist together.")
_TRAINING_ACTIVATIONS = ("Recompute or shrink activations: activation checkpointing "
                         "(`torch.utils.checkpoint.checkpoint` per block, or transformers' "
                         "`gradient_checkpointing_enable()`) trades recompute for memory; smaller micro-batches "
                         "with gradient accumulation divide activations by the accumulation factor; a chunked "
                         "loss avoids a whole-vocabulary logits copy.")
_TRAINING_RETAINED = ("Free what outlives the step: keep `loss.item()`, not `loss` (it holds the graph), "
                      "clear gradients with `zero_grad(set_to_none=True)`, and drop per-step tensors kept in "
                      "lists or dicts.")
_PRUNER_COPY = ("Keep only what is restored: save the values the algorithm may change (a pruner's "
                "candidates' original values) instead of a copy of every weight, or keep the copy on disk.")
_CHUNKS = ("Process calibration samples in chunks: run the layer on a few samples at a time and fold each "
           "chunk into what is kept, so the activations of every sample are never alive together.")
_SAMPLE_CHUNKS = ("Process samples in chunks: run on a few samples at a time and fold each chunk into what is "
                  "kept, so the activations of every sample are never alive together.")
_PRUNER_TRANSIENT = ("Process in chunks: make the spike's largest temporaries a block at a time (calibration "
                     "samples in chunks, a weight's rows in blocks) and free each input once used.")
_PRUNER_RETAINED = ("Free or stream what is retained: keep only what is restored (the masks, or the changed "
                    "values), drop the rest once no later step needs it, or stream the model a layer at a time "
                    "(load a layer, prune it, write it back) so only one layer's state is alive.")
_GRADIENT_RECORDS = ("Keep gradient records only where a decision reads them (at the candidates, chosen "
                     "before the first gradient pass), or update them inside backward so no dense record is "
                     "needed.")
_CONSUME_GRADIENTS = ("Consume gradients where they are used: fold each parameter's gradient into what is kept "
                      "in a post-accumulate-grad hook (`Tensor.register_post_accumulate_grad_hook`) and set "
                      "`.grad = None` there, so no gradient buffer for the whole model exists.")
_NO_AUTOGRAD = ("Turn autograd off: run under `torch.inference_mode()` (or `torch.no_grad()`) and "
                "`requires_grad_(False)` on the parameters; an inference loop needs no gradient.")
_INFERENCE_ACTIVATIONS = ("Process samples in chunks: smaller batches, `torch.inference_mode()` so no "
                          "activation is kept for a backward, and outputs reduced or moved off as they come.")
_INFERENCE_COPY = ("Keep one copy of the weights: load into the model in place (`load_state_dict(..., "
                   "assign=True)`, or transformers' `low_cpu_mem_usage=True`) and drop the loaded state dict.")
_INFERENCE_RETAINED = ("Keep results small: reduce or move each batch's outputs as they come (`.item()`, "
                       "`.cpu()`), and keep no batch's logits or hidden states beyond its use.")

GENERIC = {
    "full-copy": ("Keep only what is needed of a second copy of the weights: drop it once used, keep only "
                  "the part read later, or keep it on disk."),
    "dense-gradients": _CONSUME_GRADIENTS,
    "transient-spike": ("Process in chunks: make the spike's largest temporaries a block at a time and free "
                        "each input once used."),
    "retained-at-end": ("Free or stream what is retained: drop the references (`del`, set to None, clear the "
                        "dict) once no later step needs them, or write them to disk and read them back when "
                        "needed."),
    "reference-cycle": ("Break the reference cycle: `del` the closure or local that refers back to its owner "
                        "before returning (or hold the back reference with `weakref`), so the memory is freed "
                        "when the call returns."),
    "untracked-rss": ("Not a tensor the census sees: if the live-tensor meter shows tensors held by autograd, "
                      "end the graph (`torch.no_grad()` where no backward follows); if it is allocator "
                      "retention, return freed memory to the system (glibc: `malloc_trim(0)`, "
                      "`MALLOC_ARENA_MAX=2`)."),
    "rss-above-live-tensors": ("Nothing to change in the algorithm: size machines by RSS and count savings in "
                               "live tensors."),
    "failed-stage": "Fix the failure (its error is in the record) and run again.",
    "child-memory": ("Count the children when sizing the machine: this process's peak plus their own memory "
                     "(no figure of this report includes it); start fewer of them, or have each hold less; a "
                     "forked child also owns each page its parent writes after the fork: fork before the model "
                     "is built, use the spawn start method, or a thread."),
}

ACTIVATIONS = "activations and temporaries"
TEMPORARIES = "temporaries"   # not a census category: a spike made by temporaries (`remedy`'s caller says)

TEXTS: dict[tuple[str, Kind | None, str | None], str] = {
    **{(rule, ANY, ANY): text for rule, text in GENERIC.items()},
    ("full-copy", "training", ANY): _TRAINING_COPY,
    ("full-copy", "training", "optimizer state"): _OPTIMIZER_STATE,
    ("full-copy", "training", ACTIVATIONS): _TRAINING_COPY,
    ("full-copy", "pruning", ANY): _PRUNER_COPY,
    ("full-copy", "pruning", ACTIVATIONS): _CHUNKS,
    ("full-copy", "inference", ANY): _INFERENCE_COPY,
    ("full-copy", "inference", ACTIVATIONS): _INFERENCE_ACTIVATIONS,
    ("full-copy", ANY, "optimizer state"): _OPTIMIZER_STATE,
    ("dense-gradients", ANY, "gradient records"): _GRADIENT_RECORDS,
    ("dense-gradients", "training", ANY): _TRAINING_GRADIENTS,
    ("dense-gradients", "inference", ANY): _NO_AUTOGRAD,
    ("transient-spike", "training", ANY): _TRAINING_ACTIVATIONS,
    ("transient-spike", "pruning", ANY): _PRUNER_TRANSIENT,
    ("transient-spike", "pruning", TEMPORARIES): _PRUNER_TRANSIENT + " " + _CHUNKS,
    ("transient-spike", "inference", ANY): _INFERENCE_ACTIVATIONS,
    ("transient-spike", ANY, TEMPORARIES): GENERIC["transient-spike"] + " " + _SAMPLE_CHUNKS,
    ("retained-at-end", "training", ANY): _TRAINING_RETAINED,
    ("retained-at-end", "training", "optimizer state"): _OPTIMIZER_STATE,
    ("retained-at-end", ANY, "optimizer state"): _OPTIMIZER_STATE,
    ("retained-at-end", "pruning", ANY): _PRUNER_RETAINED,
    ("retained-at-end", "inference", ANY): _INFERENCE_RETAINED,
}


def remedy(rule: str, kind: Kind, category: str | None = None) -> str | None:
    """The remedy for `rule`'s finding in a program of `kind` whose evidence is of `category`;
    None for a rule with no text."""
    kind_key: Kind | None = None if kind == "unknown" else kind
    for key in ((rule, kind_key, category), (rule, kind_key, ANY), (rule, ANY, category), (rule, ANY, ANY)):
        if key in TEXTS:
            return TEXTS[key]
    return None
