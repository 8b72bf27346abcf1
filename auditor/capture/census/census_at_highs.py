"""Censuses inside a stage, near its live-tensor high, so one stage around the work is named
as well as many staged calls.

The live-tensor meter knows exactly which storages were alive at each stage's high (`at_peak`),
but only a census names them, and censuses ran at stage ends: with one `auditor.stage()` around
a pruner, the calibration inputs cached and freed inside it were never seen by one, where the
CLI's staged calls took a census at each call's end. So, while a stage is open and both the
census and the live-tensor meter are on, the audit also takes a census at the program's own
safe points, chosen by torch's global hooks (no name needed):

- at the end of an **outermost module call** (a model's forward; a nested submodule's is
  skipped) whose live tensor bytes are above every census so far: what a forward made and keeps
  (cached inputs, a growing cache) is named before the code after it frees it;
- at the end of **any module call** when live bytes grew by more than `GROWTH` since the
  highest census: a forward that grows a lot inside itself is named on the way up;
- before and after an **optimizer step** when the live-tensor high since the last census is
  above every high a census followed so far: the gradients a new high's backward made (alive
  until the step's `zero_grad`) and the state a first step creates.

Each census marks the live storages with their owners (the meter's rows keep them), so `at_peak`
names a storage freed before the stage ends. At most `MAX_CENSUSES` are taken per audit; the
record's `audit_overhead_s.census_s` holds their time, kept out of every stage's, and
`census_at_highs` in the census probe's entry says how many ran. A storage made after the last
of them and freed before the next census is named by the line that allocated it, as before.
"""
from __future__ import annotations

import threading

GROWTH = 0.10        # any module call's end: a census when live bytes grew this much
MAX_CENSUSES = 64    # per audit: each is a pass over the heap


class CensusAtHighs:
    """Global module and optimizer-step hooks that ask `take()` for a census at the safe points
    above. `live()`: live tensor bytes now, `high()`: the highest since the last census (the
    audit resets the meter at each); `in_stage()`: this thread has a stage open."""

    def __init__(self, live, high, in_stage, take):
        import torch
        import torch.optim.optimizer as optimizers
        self._live, self._high, self._in_stage, self._take = live, high, in_stage, take
        self.taken = 0
        self._highest = -1       # live bytes at the highest census taken here
        self._highest_high = -1  # the highest live-tensor high a census taken here followed
        self._depth = threading.local()
        module = torch.nn.modules.module
        self._handles = [module.register_module_forward_pre_hook(self._before_call),
                         module.register_module_forward_hook(self._after_call, always_call=True),
                         optimizers.register_optimizer_step_pre_hook(self._step),
                         optimizers.register_optimizer_step_post_hook(self._step)]

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _before_call(self, module, args) -> None:
        self._depth.value = getattr(self._depth, "value", 0) + 1

    def _after_call(self, module, args, output) -> None:
        depth = self._depth.value = max(getattr(self._depth, "value", 1) - 1, 0)
        if self.taken >= MAX_CENSUSES or not self._in_stage():
            return
        live = self._live()
        if live is None:
            return
        if (depth == 0 and live > self._highest) or live > self._highest * (1 + GROWTH):
            self._census(live)

    def _step(self, optimizer, args, kwargs) -> None:
        if self.taken >= MAX_CENSUSES or not self._in_stage():
            return
        high = self._high()
        if high is not None and high > self._highest_high:
            self._census(self._live() or 0)

    def _census(self, live: int) -> None:
        self.taken += 1
        self._highest = max(self._highest, live)
        self._highest_high = max(self._highest_high, self._high() or 0)
        self._take()
