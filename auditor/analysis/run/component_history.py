"""Components over the whole run: each component's bytes at every stage end, folded by kind.

A per-layer algorithm makes one helper per linear, so the census names many instances of one
kind of state: `SparseGPT[model.layers.3.mlp.down_proj].H`, `SparseGPT#2.H`, ... Folding strips
`[...]` and `#n` from the root part of the name, so they are read as one component,
`SparseGPT.H`, with its instances listed:

    for item in history(record):
        item.name, item.instances, item.sizes, item.most_at_once, item.most_at

Everything comes from the censuses at stage ends (a census is taken at each stage end), so
"most alive at once" is the most seen together at one stage end; state created and freed
inside one stage shows only in that stage's `live_tensors.at_peak`.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from auditor.analysis.run.stages import census_order, ended
from auditor.record.schema import RunRecord, Stage


def split_root(name: str) -> tuple[str, str]:
    """(root, rest) of a component name: the root ends at the first dot outside brackets."""
    depth = 0
    for index, char in enumerate(name):
        if char == "[":
            depth += 1
        elif char == "]":
            depth = max(depth - 1, 0)
        elif char == "." and depth == 0:
            return name[:index], name[index:]
    return name, ""


def fold_component(name: str) -> str:
    """`SparseGPT[model.layers.3.mlp.down_proj].H` and `SparseGPT#2.H` -> `SparseGPT.H`."""
    root, rest = split_root(name)
    return re.sub(r"#\d+$", "", re.sub(r"\[[^\]]*\]", "", root)) + rest


def instance_label(name: str) -> str | None:
    """What an instance worked on, from its root (`[model.layers.3.mlp.down_proj]`), if named."""
    match = re.search(r"\[([^\]]*)\]", split_root(name)[0])
    return match.group(1) if match else None


@dataclass
class Instance:
    name: str
    bytes: int                # the most it held at a stage end
    first_stage: str
    last_stage: str

    @property
    def label(self) -> str | None:
        return instance_label(self.name)


@dataclass
class ComponentHistory:
    name: str                                  # folded
    category: str
    instances: list[Instance]                  # in the order first seen
    sizes: list[tuple[int, int]]               # (bytes per instance, instances of that size), largest first
    most_at_once: int                          # the most bytes alive together at one stage end
    most_at: str                               # that stage's path
    most_instances_at_once: int                # instances alive at that stage end
    first_stage: str
    last_stage: str
    series: list[tuple[float, int]] = field(default_factory=list)  # (stage end s, bytes) at every census


def history(record: RunRecord) -> list[ComponentHistory]:
    """Every folded component of the run, largest `most_at_once` first."""
    ends = census_order(record)
    built: dict[str, dict] = {}
    for stage in ends:
        for name, item in (stage.components or {}).items():
            entry = built.setdefault(fold_component(name), {"instances": {}, "categories": Counter()})
            entry["categories"][item.category or "other"] += item.bytes
            seen = entry["instances"].get(name)
            if seen is None:
                entry["instances"][name] = Instance(name, item.bytes, stage.path, stage.path)
            else:
                seen.bytes = max(seen.bytes, item.bytes)
                seen.last_stage = stage.path
    result = [_summarise(folded, entry, ends) for folded, entry in built.items()]
    return sorted(result, key=lambda h: (-h.most_at_once, h.name))


def _summarise(folded: str, entry: dict, ends: list[Stage]) -> ComponentHistory:
    names = set(entry["instances"])
    series: list[tuple[float, int]] = []
    best = (-1, "", 0)  # bytes, stage path, instances; every folded component is at some end
    for stage in ends:
        present = [(n, c.bytes) for n, c in (stage.components or {}).items() if n in names]
        total = sum(b for _, b in present)
        series.append((ended(stage), total))
        if total > best[0]:
            best = (total, stage.path, len(present))
    instances = list(entry["instances"].values())
    sizes = sorted(Counter(i.bytes for i in instances).items(), key=lambda kv: (-kv[0], kv[1]))
    seen = [s.path for s in ends if any(n in names for n in (s.components or {}))]
    return ComponentHistory(
        name=folded, category=entry["categories"].most_common(1)[0][0], instances=instances,
        sizes=sizes, most_at_once=best[0], most_at=best[1], most_instances_at_once=best[2],
        first_stage=seen[0], last_stage=seen[-1], series=series)
