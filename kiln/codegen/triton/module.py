"""Renders a kernel schedule as the package's model.py: every kernel's `@triton.jit` source, then `run`, the
launcher that allocates the call's arena and launches the kernels in order.

Each kernel kind has a renderer returning (kernel source lines, launcher lines). A `loop` kernel (kiln.scan,
kiln.map, kiln.while_loop) is a Python loop in the launcher around its regions' launches: each step points the
body's window buffers at the step's slices and carry slots, as the C backend's loop function does with pointers.
"""

from __future__ import annotations

import re
from typing import Callable

import sympy

from kiln.codegen.memory import MemoryPlan
from kiln.codegen.kernels import Buffer, Kernel, Schedule
from kiln.codegen.triton.attention import attention_kernel
from kiln.codegen.triton.indexing import bags_kernel, scatter_kernel
from kiln.codegen.triton.quantized import qconv_kernel, qlinear_kernel, qpool_kernel, wlinear_kernel
from kiln.codegen.triton.render import (
    CHECKED_OPS, PRELUDE, TORCH_TYPES, buffer_name, cat_kernel, conv_kernel, matmul_kernel, pad_kernel,
    pointwise_kernel, py_dim, symbol_name,
)
from kiln.codegen.triton.sampling import distance_kernel, window_or_sampling_kernel
from kiln.codegen.triton.sorting import rows_or_sort_kernel
from kiln.codegen.triton.sparse import sparse_conv_kernel, sparse_linear_kernel
from kiln.ir.errors import UnsupportedError

KernelRenderer = Callable[[str, Kernel], tuple[list[str], list[str]]]
KERNEL_RENDERERS: dict[str, KernelRenderer] = {
    "pointwise": pointwise_kernel, "matmul": matmul_kernel, "rows": rows_or_sort_kernel, "cat": cat_kernel,
    "pad": pad_kernel, "conv": conv_kernel, "window": window_or_sampling_kernel, "attention": attention_kernel,
    "scatter": scatter_kernel, "bags": bags_kernel, "distance": distance_kernel, "qlinear": qlinear_kernel,
    "qconv": qconv_kernel, "wlinear": wlinear_kernel, "qpool": qpool_kernel, "sparse_linear": sparse_linear_kernel,
    "sparse_conv": sparse_conv_kernel,
}


def _identifier(text: str) -> str:
    return re.sub(r"\W", "_", text)


class _Module:
    """Collects kernel sources (module level) while producing each kernel's launcher lines."""

    def __init__(self) -> None:
        self.sources: list[str] = []

    def kernel(self, name: str, kernel: Kernel) -> list[str]:
        """`kernel`'s launcher lines; its source (and its regions' sources, for a loop) go to the module."""
        if kernel.kind == "loop":
            return self.loop(name, kernel)
        renderer = KERNEL_RENDERERS.get(kernel.kind)
        if renderer is None:
            raise UnsupportedError(f"the Triton renderer has no {kernel.kind} kernels ({', '.join(kernel.ops)})")
        source, launch = renderer(name, kernel)
        self.sources += [f"# {kernel.kind}: {', '.join(dict.fromkeys(kernel.ops))}", *source, "", ""]
        return launch

    def kernels(self, prefix: str, kernels: list[Kernel]) -> list[str]:
        launch: list[str] = []
        for number, kernel in enumerate(kernels):
            launch += self.kernel(f"{prefix}{number}_" + _identifier(kernel.name)[:60], kernel)
        return launch

    def loop(self, name: str, kernel: Kernel) -> list[str]:
        """The loop's steps in the launcher. A carry's step t reads the initial value (t = 0) or the slot step t - 1
        wrote; steps alternate between two slots and the last writes the result; a carry kept in a stacked output
        reads its previous slice instead."""
        detail = kernel.detail
        cond = self.kernels(f"{name}_c", detail.cond or [])
        body = self.kernels(f"{name}_", detail.body)
        step = sympy.Symbol(f"{name}_step")  # one counter per loop, so nested loops keep their own
        i = symbol_name(step)
        trips = f"trips_{name}"

        def part(buf: Buffer, offset: object, numel: object) -> str:
            start = py_dim(sympy.expand(sympy.sympify(offset)))
            return f"{buffer_name(buf)}[{start}:{start} + {py_dim(numel)}]"

        def copy(carry: object, source: str) -> str:
            return f"{buffer_name(carry.final)}.copy_({source})"

        reads, writes, lasts = [], [], []
        for w in [*detail.slices, *detail.stacked]:
            here = part(w.source, w.offset + step * w.window.numel, w.window.numel)
            reads.append(f"{buffer_name(w.window)} = {here}")
        for carry in detail.carries:
            init = part(carry.init.buffer, carry.init.offset, carry.final.numel)
            read = buffer_name(carry.read)
            if carry.stacked is not None:
                w = carry.stacked
                previous = part(w.source, w.offset + (step - 1) * w.window.numel, w.window.numel)
                reads.append(f"{read} = {init} if {i} == 0 else {previous}")
                last = sympy.Symbol(f"{name}_last")
                lasts.append(copy(carry, part(w.source, w.offset + last * w.window.numel, w.window.numel)))
                continue
            first, second = (buffer_name(slot) for slot in carry.slots)
            reads.append(f"{read} = {init} if {i} == 0 else ({first} if {i} % 2 else {second})")
            slot = f"({second} if {i} % 2 else {first})"
            if detail.cond is None:  # a scan's last step writes the result
                slot = f"{buffer_name(carry.final)} if {i} == {trips} - 1 else {slot}"
            writes.append(f"{buffer_name(carry.write)} = {slot}")
        # listed after its regions' kernels (`kiln inspect`), as the C backend's loop function
        self.sources += [f"# loop: {', '.join(kernel.ops)}", "# (each step launches the kernels above)", "", ""]
        lines = [f"# {', '.join(kernel.ops)}: each step launches its regions' kernels"]
        if detail.cond is not None:  # while: the cond region decides each step; the last carries read are the results
            predicate = detail.predicate
            test = f"{buffer_name(predicate.buffer)}[{py_dim(predicate.offset)}]"
            return lines + [f"{i} = 0", "while True:", *(f"    {line}" for line in reads + cond),
                            f"    if not bool({test}):",
                            *(f"        {copy(c, buffer_name(c.read))}" for c in detail.carries),
                            "        break", *(f"    {line}" for line in writes + body), f"    {i} += 1"]
        lines.append(f"{trips} = {py_dim(kernel.shape[0])}")
        finals = [copy(c, part(c.init.buffer, c.init.offset, c.final.numel)) for c in detail.carries]
        if finals:  # zero steps: the final carries are the initial ones
            lines += [f"if {trips} == 0:", *(f"    {line}" for line in finals)]
        lines += [f"for {i} in range({trips}):",
                  *(f"    {line}" for line in reads + writes + body)]
        if lasts:
            lines += [f"if {trips} > 0:", f"    {symbol_name(sympy.Symbol(f'{name}_last'))} = {trips} - 1",
                      *(f"    {line}" for line in lasts)]
        return lines


def render(schedule: Schedule, memory: MemoryPlan) -> str:
    """The package's model.py: kernels, then `run(inputs, weights, symbols, err, state)`, which returns the outputs
    and the state's new values. Temporaries are views of one arena tensor per call, at the memory plan's offsets; a
    loop's window buffers are set by the loop at each step. A state updated in place (schedule.in_place_scatter) is
    written where it lies; another state's new value gets a tensor of its own, which the loader swaps in after a
    successful run (the C backend's two ways, docs/c-backend.md "State")."""
    launcher = ["def run(inputs, weights, symbols, err, state):",
                '    """inputs: contiguous torch tensors in the user-input order, on one device; weights: name -> '
                'flat tensor on',
                '    that device; symbols: the symbol values in the manifest\'s order; err: an int64 tensor [4] of '
                'zeros, where',
                '    a kernel records an out-of-range index (1 + the op\'s position in CHECKED_OPS, index, dim, size); '
                'state: name ->',
                '    the model\'s flat state tensor on that device, which an in-place update writes. Returns (the '
                'outputs, name ->',
                '    the new value of each other state)."""',
                "    device = next(iter([*inputs, *weights.values(), *state.values()]), torch.empty(0)).device"]
    for k, symbol in enumerate(schedule.symbols):
        launcher.append(f"    {symbol_name(symbol)} = symbols[{k}]")
    launcher.append(f"    arena = torch.empty(({py_dim(memory.arena_bytes)},), dtype=torch.uint8, device=device)")
    for buf in schedule.buffers:
        name = buffer_name(buf)
        if buf.kind == "input":
            launcher.append(f"    {name} = inputs[{buf.io_index}].reshape(-1)")
        elif buf.kind == "weight":
            launcher.append(f"    {name} = weights[{buf.weight_key!r}]")
        elif buf.kind == "state":
            launcher.append(f"    {name} = state[{buf.weight_key!r}]")
        elif buf.inside is not None:  # a state's in-place update: the state's own elements
            parent, at = buf.inside
            start = py_dim(sympy.sympify(at))
            launcher.append(f"    {name} = {buffer_name(parent)}[{start}:{start} + {py_dim(buf.numel)}]")
        elif buf.kind == "window":
            continue  # placed by its loop
        elif buf in memory.offsets:
            start = py_dim(memory.offset_of(buf))
            size = py_dim(sympy.sympify(buf.numel) * buf.dtype.itemsize)
            launcher.append(f"    {name} = arena[{start}:{start} + {size}].view({TORCH_TYPES[buf.dtype]})")
        else:
            launcher.append(f"    {name} = torch.empty(({py_dim(buf.numel)},), dtype={TORCH_TYPES[buf.dtype]}, "
                            "device=device)")
    module = _Module()
    launcher += ["    " + line for line in module.kernels("kernel_", schedule.kernels)]
    shapes = [f"{buffer_name(buf)}.reshape(({''.join(py_dim(d) + ', ' for d in shape)}))"
              for buf, shape in schedule.outputs]
    swapped = [f"{state.weight_key!r}: {buffer_name(new)}" for state, new in schedule.state if new is not None]
    launcher.append(f"    return [{', '.join(shapes)}], {{{', '.join(swapped)}}}")
    return "\n".join([PRELUDE, f"CHECKED_OPS = {CHECKED_OPS!r}", "", "", *module.sources, *launcher]) + "\n"
