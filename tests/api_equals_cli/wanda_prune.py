"""A Wanda-like layer-wise pruner, written the way research code is: a random Llama from a
config, a `backup` of every parameter cloned "to be able to restore", every calibration input
cached per linear, a per-column norm statistic. No auditor import: audited from outside
(`auditor run --stage ...`) or by api_prune.py's five lines."""
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

HIDDEN, INTERMEDIATE, LAYERS, VOCAB, SAMPLES, LENGTH = 64, 128, 2, 256, 4, 32


def build_model():
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, num_hidden_layers=LAYERS,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=VOCAB,
                         max_position_embeddings=LENGTH, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


class Pruner:
    def __init__(self, model, sparsity=0.5):
        self.model, self.sparsity = model, sparsity
        self.backup = {name: p.detach().clone() for name, p in model.named_parameters()}
        self.inputs = {}

    def calibrate_layer(self, layer, samples):
        """Run the samples through the model, caching every input of this layer's linears."""
        hooks = []
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                self.inputs[name] = []
                hooks.append(module.register_forward_hook(
                    lambda m, args, out, name=name: self.inputs[name].append(args[0].detach().clone())))
        with torch.no_grad():
            for batch in samples:
                self.model(batch)
        for hook in hooks:
            hook.remove()

    def prune_layer(self, layer):
        for name, module in layer.named_modules():
            if name in self.inputs:
                cached = torch.cat([x.reshape(-1, x.shape[-1]) for x in self.inputs[name]])
                norm = cached.norm(dim=0)
                score = module.weight.detach().abs() * norm
                cut = score.kthvalue(int(score.shape[1] * self.sparsity), dim=1, keepdim=True).values
                module.weight.data[score <= cut] = 0
        self.inputs = {}


def prune(model, samples):
    pruner = Pruner(model)
    for layer in model.model.layers:
        pruner.calibrate_layer(layer, samples)
        pruner.prune_layer(layer)
    return pruner.backup


def main():
    model = build_model()
    samples = [torch.randint(0, VOCAB, (1, LENGTH), generator=torch.Generator().manual_seed(i))
               for i in range(SAMPLES)]
    backup = prune(model, samples)
    zeros = sum(int((p == 0).sum()) for p in model.parameters())
    print(f"pruned {zeros} weights, backup of {len(backup)} tensors")


if __name__ == "__main__" and "--api" not in sys.argv:
    main()
