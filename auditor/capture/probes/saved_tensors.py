"""What autograd saves for backward, counted exactly while a forward pass runs.

    ledger = SavedTensorLedger(model)          # model state (parameters, buffers) is skipped
    with ledger:
        loss = model(**batch).loss
    ledger.summary()   # {"activations": bytes, "autocast weight copies": bytes, "per_layer": [...]}

Every tensor an autograd node saves passes through `torch.autograd.graph.saved_tensors_hooks`'
pack hook. Each storage is counted once (views and tensors saved by several nodes share one),
storages of the model's own parameters and buffers are skipped (a Linear saves its weight, a
causal mask may be a view of a buffer: neither is new memory), and what is left is split into
activations and the low-precision weight copies autocast makes (a saved tensor whose base was
cast from a parameter). The pack hook returns the same storage (detached), so nothing about
the run changes. Saved tensors stay alive until backward, so no address is reused while counting.

With `layers` (the decoder blocks), each saved storage is also attributed to the block that
was running when it was first saved; the rest is "outside" (embeddings, head, loss, and what
every layer is handed besides the hidden states, such as rotary cos/sin).
"""
from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten

ACTIVATIONS = "activations"
WEIGHT_COPIES = "autocast weight copies"


class SavedTensorLedger:
    def __init__(self, model: torch.nn.Module, layers: list[torch.nn.Module] | None = None):
        self._state = {t.untyped_storage().data_ptr()
                       for t in [*model.parameters(), *model.buffers()]}
        self._layers = list(layers or [])
        self._seen: dict[int, tuple[str, int | None, int]] = {}  # data_ptr -> (kind, layer, bytes)
        self._current: int | None = None
        self._hooks: torch.autograd.graph.saved_tensors_hooks | None = None
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> SavedTensorLedger:
        self._seen.clear()
        self._shared: set[int] = set()
        for index, layer in enumerate(self._layers):
            self._handles.append(layer.register_forward_pre_hook(self._entering(index),
                                                                 with_kwargs=True))
            self._handles.append(layer.register_forward_hook(self._leaving))
        self._hooks = hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        hooks.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._hooks is not None:
            self._hooks.__exit__(*exc)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._current = None

    def _entering(self, index: int):
        def hook(module, args, kwargs):
            self._current = index
            # Tensors handed to every layer besides the hidden states (rotary cos/sin, masks)
            # were made outside the layers: the first layer to save them must not own them.
            for item in tree_flatten((args[1:], kwargs))[0]:
                if isinstance(item, torch.Tensor):
                    self._shared.add(item.untyped_storage().data_ptr())
        return hook

    def _leaving(self, module, args, output) -> None:
        self._current = None

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        address, size = storage.data_ptr(), storage.nbytes()
        if size and address not in self._state and address not in self._seen:
            kind = WEIGHT_COPIES if _is_parameter_cast(tensor) else ACTIVATIONS
            layer = None if address in self._shared else self._current
            self._seen[address] = (kind, layer, size)
        # Detached: the same storage without a reference to the graph. The tensor itself would
        # tie the graph into a cycle through C++ that gc cannot see, so a forward that never
        # reaches backward would keep its model alive for good.
        return tensor.detach()

    def summary(self) -> dict:
        """Bytes by kind, by layer (activations only) and outside the layers."""
        totals = {ACTIVATIONS: 0, WEIGHT_COPIES: 0}
        per_layer = [0] * len(self._layers)
        copies_per_layer = [0] * len(self._layers)
        outside = 0
        for kind, layer, size in self._seen.values():
            totals[kind] += size
            if layer is None:
                outside += size if kind == ACTIVATIONS else 0
            elif kind == ACTIVATIONS:
                per_layer[layer] += size
            else:
                copies_per_layer[layer] += size
        return {**totals, "storages": len(self._seen), "per_layer": per_layer,
                "outside_layers": outside, "weight_copies_per_layer": copies_per_layer}


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _is_parameter_cast(tensor: torch.Tensor) -> bool:
    """True for autocast's copy of a parameter (or a view of it, e.g. a transposed weight)."""
    base = tensor._base if tensor._base is not None else tensor
    node = base.grad_fn
    if node is None or type(node).__name__ != "ToCopyBackward0":
        return False
    return any(type(fn).__name__ == "AccumulateGrad" for fn, _ in node.next_functions if fn)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated blocks: its longest ModuleList whose children share one class."""
    best: list[torch.nn.Module] = []
    for module in model.modules():
        if (isinstance(module, torch.nn.ModuleList) and len(module) > len(best)
                and len({type(child) for child in module}) == 1):
            best = list(module)
    return best
