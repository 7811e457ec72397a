"""The .pt2 reader's record of views (kiln/ir/views.py): torch's training IR keeps in-place ops on views
(`key[..., :8].copy_(k_pass)` in a Hugging Face attention), which the reader turns into the functional op and a
write through each base the view aliases, up to the root."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

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

    def assign(self, target: SSAValue, value: SSAValue, env: dict[str, Any],
               live: Callable[[str], bool] = lambda name: True) -> tuple[SSAValue, SSAValue]:
        """Make `target`'s names hold `value` (an in-place op's functional result), writing it through every base
        `target` views; call inside the builder. Returns the root that was written and its new value. Only names
        `live` says a later node reads are updated: a view no such name holds (nor a view made from it) is not
        read again."""
        # which live names hold each value, found once per in-place op: every rebinding below updates it (a graph
        # of thousands of names and many in-place writes through views, Kimi Linear's, spent 20 s scanning env)
        holders: dict[SSAValue, list[str]] = defaultdict(list)
        for name, bound in env.items():
            if isinstance(bound, SSAValue) and live(name):
                holders[bound].append(name)
        while True:
            _rebind(env, holders, target, value)
            self._refresh(target, value, env, holders)
            link = self.links.get(target)
            if link is None:
                return target, value
            base, step = link
            updated = step.write(base, value)
            self._link(value, updated, step)
            target, value = base, updated

    def _refresh(self, base: SSAValue, updated: SSAValue, env: dict[str, Any],
                 holders: dict[SSAValue, list[str]]) -> None:
        """Views of `base` that names still hold read `updated` instead, and so on down their own views."""
        for view in self.views.get(base, []):
            if not self._wanted(view, holders):
                continue
            step = self.links[view][1]
            fresh = step.read(updated)
            self._link(fresh, updated, step)
            self.regenerated.append(fresh)
            _rebind(env, holders, view, fresh)
            self._refresh(view, fresh, env, holders)

    def _wanted(self, view: SSAValue, holders: dict[SSAValue, list[str]]) -> bool:
        """Whether a live name holds `view` or a view made from it."""
        return bool(holders.get(view)) or any(self._wanted(v, holders) for v in self.views.get(view, []))

    def erase_unused(self) -> None:
        erase_unused_reads(self.regenerated)


def _rebind(env: dict[str, Any], holders: dict[SSAValue, list[str]], old: SSAValue, new: SSAValue) -> None:
    """The names holding `old` hold `new` instead."""
    names = holders.pop(old, [])
    for name in names:
        env[name] = new
    holders[new].extend(names)
