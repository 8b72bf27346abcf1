"""A layer-wise pruner written the way research code is, keeping what research code keeps: a
backup of every parameter, a backup of one layer, a state dict cloned, a half-precision copy,
every calibration input cached per linear (as many bytes as the weights, by coincidence) and a
per-column norm statistic. No auditor import: audited from outside (`auditor run --stage
research_pruner:keep_...`) or by tests/test_copy_provenance.py's five lines.

Each `keep_*` function makes one thing and returns it; `main` holds them all to the end.
"""
import torch
from transformers import LlamaConfig, LlamaForCausalLM

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, SAMPLES, LENGTH = 64, 128, 2, 256, 4, 32


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                         max_position_embeddings=LENGTH, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


def calibration_samples():
    return [torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(i))
            for i in range(SAMPLES)]


def keep_backup(model):
    """'to be able to restore'"""
    return {name: p.detach().clone() for name, p in model.named_parameters()}  # line: backup


def keep_first_layer(model):
    """only the layer pruned first"""
    return {name: p.detach().clone() for name, p in model.named_parameters() if ".layers.0." in name}  # line: partial


def keep_state_dict(model):
    return {k: v.clone() for k, v in model.state_dict().items()}  # line: state dict


def keep_half(model):
    return {name: p.detach().to(torch.float16) for name, p in model.named_parameters()}  # line: fp16


def linear_inputs(model):
    """(layer, linear, first column) of every linear of the decoder layers, where its inputs
    go in a row of the cache and of the statistic; and the columns of one layer"""
    found, width = [], 0
    for index, layer in enumerate(model.model.layers):
        width = 0
        for module in layer.modules():
            if isinstance(module, torch.nn.Linear):
                found.append((index, module, width))
                width += module.in_features
    return found, width


def run_with_hooks(model, samples, hook):
    handles = [linear.register_forward_hook(lambda m, args, out, at=(i, c): hook(at, args[0]))
               for i, linear, c in linear_inputs(model)[0]]
    with torch.no_grad():
        for index, batch in enumerate(samples):
            hook.sample = index
            model(batch)
    for handle in handles:
        handle.remove()


def cache_inputs(model, samples):
    """every input of every linear, every sample: a row per token, a column per input feature"""
    cache = torch.zeros(LAYERS, SAMPLES * LENGTH, linear_inputs(model)[1])  # line: cache

    def keep(at, x):
        layer, column = at
        rows = slice(keep.sample * LENGTH, (keep.sample + 1) * LENGTH)
        cache[layer, rows, column:column + x.shape[-1]].copy_(x.reshape(-1, x.shape[-1]))
    run_with_hooks(model, samples, keep)
    return cache


def column_norms(model, samples):
    """Wanda's statistic: the squared norm of each input column of each linear, accumulated"""
    norms = torch.zeros(LAYERS, linear_inputs(model)[1])  # line: norms

    def add(at, x):
        layer, column = at
        norms[layer, column:column + x.shape[-1]] += x.reshape(-1, x.shape[-1]).norm(dim=0) ** 2
    run_with_hooks(model, samples, add)
    return norms


def prune(model, samples):
    kept = {"backup": keep_backup(model), "partial": keep_first_layer(model),
            "state dict": keep_state_dict(model), "fp16": keep_half(model),
            "cache": cache_inputs(model, samples), "norms": column_norms(model, samples)}
    for layer, linear, column in linear_inputs(model)[0]:
        scale = kept["norms"][layer, column:column + linear.in_features].sqrt()
        score = linear.weight.detach().abs() * scale
        linear.weight.data[score <= score.median()] = 0
    return kept


def main():
    model = build_model()
    kept = prune(model, calibration_samples())
    print(f"pruned; kept {', '.join(kept)}")


if __name__ == "__main__":
    main()
