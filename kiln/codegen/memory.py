"""Static memory planning: every temporary buffer of a Schedule gets a byte offset in one arena.

Sizes and offsets are sympy expressions over the program's symbols, so one plan serves every input size; the
renderer allocates `arena_bytes` once per run and places each temporary at `offset_of(buffer)`. Weights and
user inputs/outputs are not planned: they live in the weights blob and the caller's arrays. Nor are temporaries
sized by a data-dependent size (`MemoryPlan.dynamic`): the run allocates each once its size is known.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Iterator

import sympy

from kiln.codegen.kernels import Buffer, Kernel, Schedule
from kiln.ir.errors import KilnError
from kiln.ir.symbolic import INF, ValueRange, bound_expr, evaluate_dim, format_dim

ALIGNMENT = 64  # bytes: every slot starts on a cache line (and satisfies any SIMD load)


class MemoryPlanError(KilnError):
    """A memory plan places two buffers that are live at the same time on overlapping bytes."""


# ---------------------------------------------------------------------------------------------
# Which buffers a kernel touches

def _buffers_in(value: Any, seen: set[int]) -> Iterator[Buffer]:
    """Every Buffer reachable from a kernel's expression or detail value (View, Load, Gather, Apply, containers)."""
    if isinstance(value, Buffer):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _buffers_in(item, seen)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from _buffers_in(item, seen)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type) and id(value) not in seen:
        seen.add(id(value))
        for f in dataclasses.fields(value):
            yield from _buffers_in(getattr(value, f.name), seen)


def _unique(buffers: Iterator[Buffer]) -> list[Buffer]:
    return list({id(b): b for b in buffers}.values())


def kernel_reads(kernel: Kernel) -> list[Buffer]:
    """The buffers a kernel reads: everything its expression tree and its detail's fields refer to."""
    seen: set[int] = set()
    return _unique(b for part in (kernel.expr, kernel.detail) for b in _buffers_in(part, seen))


def kernel_writes(kernel: Kernel) -> list[Buffer]:
    return _unique(iter(kernel.outputs))


@dataclass(frozen=True)
class Lifetime:
    """The kernels (indices into Schedule.kernels, inclusive) during which a buffer must keep its bytes."""

    first: int
    last: int

    def overlaps(self, other: "Lifetime") -> bool:
        return self.first <= other.last and other.first <= self.last


def lifetimes(schedule: Schedule) -> dict[Buffer, Lifetime]:
    """Each temporary that some kernel touches: from its first write to its last read.

    A temporary nobody reads still holds its bytes while its writer runs (e.g. max_pool's unused indices). A
    temporary placed inside another (Buffer.inside: a cat's part) has no bytes of its own: its uses count as its
    home buffer's.
    """
    spans: dict[Buffer, list[int]] = {}
    for index, kernel in enumerate(schedule.kernels):
        for buf in kernel_writes(kernel) + kernel_reads(kernel):
            buf = buf.home()[0]
            if buf.kind == "temp":
                span = spans.setdefault(buf, [index, index])
                span[0], span[1] = min(span[0], index), max(span[1], index)
    return {buf: Lifetime(first, last) for buf, (first, last) in spans.items()}


def buffer_bytes(buffer: Buffer) -> sympy.Expr:
    return sympy.expand(buffer.numel * buffer.dtype.itemsize)


def align(size: Any) -> sympy.Expr:
    """`size` rounded up to ALIGNMENT, as -64*floor(-size/64): the floor form the C renderer's dim_expr knows."""
    return sympy.expand(-ALIGNMENT * sympy.floor(-sympy.sympify(size) / ALIGNMENT))


def format_bytes(size: Any) -> str:
    """A byte formula for people and the manifest: -64*floor(-x/64) reads as 64*ceiling(x/64)."""
    expr = sympy.sympify(size).replace(
        lambda e: isinstance(e, sympy.floor) and e.args[0].could_extract_minus_sign(),
        lambda e: -sympy.ceiling(-e.args[0]))
    return format_dim(expr)


# ---------------------------------------------------------------------------------------------
# Comparing symbolic sizes

class _Sizes:
    """Decides `a <= b` for byte counts over symbols with known ranges (default: positive integers)."""

    def __init__(self, symbols: list[sympy.Symbol], ranges: dict[sympy.Symbol, ValueRange] | None):
        ranges = ranges or {}
        self.ranges = {s: ranges.get(s, ValueRange(1, INF)) for s in symbols}
        # Best-fit ranks incomparable candidates by their value at a typical size.
        self.typical = {s: int(min(r.upper, max(r.lower, 32))) for s, r in self.ranges.items()}

    def le(self, a: Any, b: Any) -> bool:
        """True only when a <= b for every binding in range."""
        difference = sympy.expand(sympy.sympify(b) - sympy.sympify(a))
        if difference.is_number:
            return bool(difference >= 0)
        for s in difference.free_symbols:
            self.ranges.setdefault(s, ValueRange(1, INF))
        # A polynomial in (s - lower(s)) >= 0 with nonnegative coefficients is nonnegative on the whole range.
        if all(math.isfinite(self.ranges[s].lower) for s in difference.free_symbols):
            shifted = sympy.expand(difference.xreplace({s: s + int(self.ranges[s].lower)
                                                        for s in difference.free_symbols}))
            try:
                if all(c >= 0 for c in sympy.Poly(shifted, *sorted(shifted.free_symbols, key=str)).coeffs()):
                    return True
            except sympy.PolynomialError:
                pass
        return bound_expr(difference, self.ranges).lower >= 0

    def same(self, a: Any, b: Any) -> bool:
        return sympy.expand(sympy.sympify(a) - sympy.sympify(b)) == 0

    def rank(self, size: Any) -> int:
        size = sympy.sympify(size)
        return int(size.xreplace({s: sympy.Integer(self.typical.get(s, 32)) for s in size.free_symbols}))


# ---------------------------------------------------------------------------------------------
# The plan

@dataclass(eq=False)
class Slot:
    """A region of the arena that buffers with disjoint lifetimes take in turn."""

    size: sympy.Expr  # bytes: provably >= every occupant's size
    buffers: list[Buffer] = field(default_factory=list)
    offset: sympy.Expr = sympy.Integer(0)
    free_after: int = -1  # the last kernel that uses the current occupant

    @property
    def aligned_size(self) -> sympy.Expr:
        return align(self.size)


@dataclass
class MemoryPlan:
    """Where each temporary lives in the arena. Only temporaries: weights and user inputs/outputs are not in it."""

    offsets: dict[Buffer, sympy.Expr]  # bytes from the arena's start
    slots: list[Slot]
    arena_bytes: sympy.Expr
    unplanned_bytes: sympy.Expr  # every temporary in its own aligned allocation (no reuse)
    lifetimes: dict[Buffer, Lifetime]
    dynamic: list[Buffer] = field(default_factory=list)  # sized by a data-dependent size: allocated while running

    @property
    def peak_bytes(self) -> sympy.Expr:
        """Peak temporary memory of one run: the arena (weights and user tensors are not counted)."""
        return self.arena_bytes

    def offset_of(self, buffer: Buffer) -> sympy.Expr:
        if buffer not in self.offsets:
            raise KilnError(f"buffer {buffer.name} is a {buffer.kind}, not a temporary: it has no arena offset",
                            fix="place inputs, outputs and weights from the caller's pointers and the weights blob")
        return self.offsets[buffer]

    def describe(self) -> str:
        return (f"arena {format_bytes(self.arena_bytes)} bytes (naive {format_bytes(self.unplanned_bytes)}; "
                f"{len(self.slots)} slots for {len(self.offsets)} temps)")


def plan_memory(schedule: Schedule, range_constraints: dict[sympy.Symbol, ValueRange] | None = None) -> MemoryPlan:
    """Assign every temporary an arena offset; buffers live at the same time never share bytes.

    Policy (greedy, in order of first use, like Inductor's and TVM's static planners): a buffer takes a slot
    whose previous occupant is dead and whose size provably covers it, preferring an equal size, else the
    smallest (best fit); failing that it takes the largest dead slot that is provably no bigger and grows it to
    its own size (the grown bytes are fewer than a new slot's); failing that (sizes not comparable, e.g.
    batch*64 against seq*32) it opens a new slot. Sizes never become Max(...): formulas stay sums of products
    and floors that C renders directly. `range_constraints` (symbol -> ValueRange) sharpens the comparisons;
    symbols without one are taken as positive integers.
    """
    sizes = _Sizes(list(schedule.symbols), range_constraints)
    dynamic = [buf for buf in schedule.buffers if buf.kind == "temp" and buf.inside is None
               and schedule.is_dynamic(buf)]
    live = {buf: life for buf, life in lifetimes(schedule).items() if buf not in dynamic}
    slots: list[Slot] = []
    for buf in sorted(live, key=lambda b: (live[b].first, b.index)):
        size = buffer_bytes(buf)
        dead = [slot for slot in slots if slot.free_after < live[buf].first]
        slot = _best_fit(size, dead, sizes)
        if slot is None:
            slot = Slot(size)
            slots.append(slot)
        slot.buffers.append(buf)
        slot.free_after = live[buf].last
    running = sympy.Integer(0)
    for slot in slots:
        slot.offset = running
        running = sympy.expand(running + slot.aligned_size)
    offsets: dict[Buffer, sympy.Expr] = {}
    for buf in schedule.buffers:
        if buf.kind == "temp" and buf.inside is None and buf not in dynamic:
            # one no kernel touches needs no bytes of its own: it sits at 0
            offsets[buf] = next((s.offset for s in slots if buf in s.buffers), sympy.Integer(0))
    unplanned = sympy.expand(sum((align(buffer_bytes(b)) for b in offsets), sympy.Integer(0)))
    return MemoryPlan(offsets, slots, running, unplanned, live, dynamic)


def _best_fit(size: sympy.Expr, dead: list[Slot], sizes: _Sizes) -> Slot | None:
    fitting = [s for s in dead if sizes.le(size, s.size) or sizes.le(size, s.aligned_size)]
    if fitting:
        return min(fitting, key=lambda s: (not sizes.same(s.size, size), sizes.rank(s.size)))
    smaller = [s for s in dead if sizes.le(s.size, size)]
    if smaller:
        slot = max(smaller, key=lambda s: sizes.rank(s.size))
        slot.size = size
        return slot
    return None


def verify_plan(schedule: Schedule, plan: MemoryPlan, bindings: dict[sympy.Symbol, int]) -> None:
    """Check a plan at concrete symbol values: every temporary has an aligned offset inside the arena, and
    temporaries live at the same time (lifetimes recomputed from the schedule) never overlap."""
    arena = evaluate_dim(plan.arena_bytes, bindings)
    spans: list[tuple[Buffer, Lifetime, int, int]] = []
    for buf, life in lifetimes(schedule).items():
        if buf in plan.dynamic:
            continue
        if buf not in plan.offsets:
            raise MemoryPlanError(f"temporary {buf.name} has no offset")
        start, size = evaluate_dim(plan.offsets[buf], bindings), evaluate_dim(buffer_bytes(buf), bindings)
        if start < 0 or start % ALIGNMENT or start + size > arena:
            raise MemoryPlanError(f"temporary {buf.name} at [{start}, {start + size}) is misaligned or outside "
                                  f"the {arena}-byte arena at {bindings}")
        spans.append((buf, life, start, start + size))
    for i, (a, life_a, start_a, end_a) in enumerate(spans):
        for b, life_b, start_b, end_b in spans[i + 1:]:
            if life_a.overlaps(life_b) and max(start_a, start_b) < min(end_a, end_b):
                raise MemoryPlanError(f"temporaries {a.name} [{start_a}, {end_a}) and {b.name} [{start_b}, {end_b}) "
                                      f"overlap while both are live (kernels {life_a} and {life_b}) at {bindings}")
