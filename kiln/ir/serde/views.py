"""The .pt2 reader's record of views (kiln/ir/views.py): torch's training IR keeps in-place ops on views
(`key[..., :8].copy_(k_pass)` in a Hugging Face attention), which the reader turns into the functional op and a
write through each base the view aliases, up to the root."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from xdsl.ir import SSAValue

from kiln.ir.views import ViewStep, erase_unused_reads, view_steps


class ViewTracker:
    """The views a graph has made, so an in-place op on one also updates what it aliases."""

    def __init__(self) -> None:
        self.links: dict[SSAValue, tuple[SSAValue, ViewStep]] = {}  # view -> (base, how)
        self.views: dict[SSAValue, list[SSAValue]] = defaultdict(list)  # base -> views made from it
        self.regenerated: list[SSAValue] = []

    def record(self, op: str, args: list, kwargs: dict, result: Any) -> None:
        """Remember how `result` (an op's result, or its list of results) views the op's first operand."""
        for view, step in view_steps(op, args, kwargs, result):
            self._link(view, args[0], step)

    def _link(self, view: SSAValue, base: SSAValue, step: ViewStep) -> None:
        self.links[view] = (base, step)
        self.views[base].append(view)

    def assign(self, target: SSAValue, value: SSAValue, env: dict[str, Any]) -> tuple[SSAValue, SSAValue]:
        """Make `target`'s names hold `value` (an in-place op's functional result), writing it through every base
        `target` views; call inside the builder. Returns the root that was written and its new value."""
        _rebind(env, target, value)
        self._refresh(target, value, env)
        link = self.links.get(target)
        if link is None:
            return target, value
        base, step = link
        updated = step.write(base, value)
        self._link(value, updated, step)
        return self.assign(base, updated, env)

    def _refresh(self, base: SSAValue, updated: SSAValue, env: dict[str, Any]) -> None:
        """Views of `base` that names still hold read `updated` instead, and so on down their own views."""
        bound = {id(v) for v in env.values() if isinstance(v, SSAValue)}
        for view in self.views.get(base, []):
            if id(view) not in bound:
                continue
            step = self.links[view][1]
            fresh = step.read(updated)
            self._link(fresh, updated, step)
            self.regenerated.append(fresh)
            _rebind(env, view, fresh)
            self._refresh(view, fresh, env)

    def erase_unused(self) -> None:
        erase_unused_reads(self.regenerated)


def _rebind(env: dict[str, Any], old: SSAValue, new: SSAValue) -> None:
    for key, bound in list(env.items()):
        if bound is old:
            env[key] = new
