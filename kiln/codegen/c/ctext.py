"""C text shared by the C renderers (render.py, conv.py, quantized.py): types, literals, size expressions, the index
and expression printer, loop nests, the work-sharing pragmas kernels run their units under, and the float32 GEMM
tiles' epilogue loop."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import sympy

from kiln.codegen.c.pointwise import FLOAT32_RULES, POINTWISE_RULES
from kiln.codegen.kernels import (
    Accumulator, Apply, Buffer, Constant, Gather, Iota, Kernel, Load, Tile, contiguous_strides,
)
from kiln.ir import dtypes
from kiln.ir.errors import UnsupportedError

C_TYPES = {dtypes.float32: "float", dtypes.float64: "double", dtypes.int64: "int64_t", dtypes.int32: "int32_t",
           dtypes.int16: "int16_t", dtypes.int8: "int8_t",
           dtypes.uint8: "uint8_t", dtypes.bool_: "bool", dtypes.float16: "kiln_f16", dtypes.bfloat16: "kiln_bf16"}
# Half-precision floats are stored as their bits (kiln_math.h) and computed on as floats: an expression of such a
# dtype renders as the stored element (a load, or a result rounded to it), which its consumers convert to a number.
HALF_NAMES = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}


def c_type(dtype: dtypes.DType) -> str:
    if dtype not in C_TYPES:  # an op on such values is refused when legalized; an unused input reaches here
        raise UnsupportedError(f"the C backend has no {dtype.name} tensors",
                               fix=f"convert the model's {dtype.name} inputs and weights to float32 first")
    return C_TYPES[dtype]


def compute_type(dtype: dtypes.DType) -> str:
    return "double" if dtype.is_floating_point else c_type(dtype)


def as_number(text: str, dtype: dtypes.DType) -> str:
    """C for the number an expression of `dtype` holds: a stored half-precision element converted to float."""
    return f"kiln_{HALF_NAMES[dtype]}_to_float({text})" if dtype in HALF_NAMES else text


def rounded(text: str, dtype: dtypes.DType) -> str:
    """A number converted to `dtype`; to half precision through float (as c10::Half and BFloat16 convert a double),
    rounding to nearest even, into the stored form."""
    if dtype in HALF_NAMES:
        return f"kiln_{HALF_NAMES[dtype]}_from_float((float)({text}))"
    return f"(({c_type(dtype)})({text}))"


def identifier(name: str) -> str:
    """A C identifier from a model name: nothing from the model reaches the source unsanitized."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", name)[:60]
    return name if name and not name[0].isdigit() else f"v_{name}"


def literal(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):  # (-2**63 is not a literal in C: the negation of a constant too large for int64)
        return "INT64_MIN" if value == -2**63 else f"INT64_C({value})"
    if isinstance(value, float):
        if math.isnan(value):
            return "NAN"
        if math.isinf(value):
            return "INFINITY" if value > 0 else "(-INFINITY)"
        return repr(value)
    if isinstance(value, sympy.Expr) and value.is_integer:  # a size (every kernel binds the symbols)
        return dim_expr(value)
    raise UnsupportedError(f"cannot render the scalar {value!r} in C")


def symbol_name(symbol: sympy.Symbol) -> str:
    return f"sym_{identifier(str(symbol))}"


def dim_expr(expr: Any) -> str:
    """An integer sympy expression over the symbols as C."""
    expr = sympy.sympify(expr)
    if expr.is_Integer:
        return f"INT64_C({int(expr)})"
    if expr.is_Symbol:
        return symbol_name(expr)
    if expr.is_Add:
        return "(" + " + ".join(dim_expr(a) for a in expr.args) + ")"
    if expr.is_Mul:
        return "(" + " * ".join(dim_expr(a) for a in expr.args) + ")"
    if expr.is_Pow and expr.exp.is_Integer and int(expr.exp) > 0:
        return "(" + " * ".join([dim_expr(expr.base)] * int(expr.exp)) + ")"
    if isinstance(expr, sympy.floor) and (expr.args[0].is_Mul or expr.args[0].is_Add):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        return f"kiln_floordiv({dim_expr(num)}, {dim_expr(den)})"
    if isinstance(expr, sympy.Mod):  # Python's (floor) modulo, as sympy's Mod
        num, den = dim_expr(expr.args[0]), dim_expr(expr.args[1])
        return f"({num} - {den} * kiln_floordiv({num}, {den}))"
    if isinstance(expr, (sympy.Min, sympy.Max)):  # diagonal lengths
        text, op = dim_expr(expr.args[0]), "<" if isinstance(expr, sympy.Min) else ">"
        for arg in expr.args[1:]:
            other = dim_expr(arg)
            text = f"({text} {op} {other} ? {text} : {other})"
        return text
    raise UnsupportedError(f"cannot render the size expression {expr} in C")


_FLOORDIV = "kiln_floordiv("
_INVARIANT_NAMES = re.compile(r"[A-Za-z_]\w*")


def hoist_symbol_divisions(text: str) -> tuple[list[str], str]:
    """A kernel body with each floor division of size symbols (dim_expr's kiln_floordiv of `sym_*` and
    literals: a convolution's output length) computed once, in the returned declarations, instead of inside
    its loops. Inside a loop such a division keeps GCC 12 from vectorizing it at all, and it costs an integer
    division per use."""
    names: dict[str, str] = {}
    pieces, at = [], 0
    while (start := text.find(_FLOORDIV, at)) >= 0:
        depth, end = 0, start + len(_FLOORDIV) - 1
        for end in range(end, len(text)):
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            if depth == 0:
                break
        call = text[start:end + 1]
        words = _INVARIANT_NAMES.findall(call)
        if all(w in ("kiln_floordiv", "INT64_C") or w.startswith("sym_") for w in words):
            pieces += [text[at:start], names.setdefault(call, f"symdiv{len(names)}")]
            at = end + 1
        else:  # a division of run-time values: look inside it for invariant ones
            pieces.append(text[at:start + len(_FLOORDIV)])
            at = start + len(_FLOORDIV)
    pieces.append(text[at:])
    return [f"    const int64_t {name} = {call};" for call, name in names.items()], "".join(pieces)


def condition_expr(condition: Any) -> str:
    """A condition on the symbols (a runtime assertion: `u0 <= s0`, `Eq(Mod(s0, 4), 0)`) as a C expression."""
    relations = {"==": "==", "!=": "!=", "<=": "<=", "<": "<", ">=": ">=", ">": ">"}
    if isinstance(condition, sympy.core.relational.Relational) and condition.rel_op in relations:
        return f"({dim_expr(condition.lhs)} {relations[condition.rel_op]} {dim_expr(condition.rhs)})"
    if isinstance(condition, (sympy.And, sympy.Or)):
        joiner = " && " if isinstance(condition, sympy.And) else " || "
        return "(" + joiner.join(condition_expr(arg) for arg in condition.args) + ")"
    if isinstance(condition, sympy.Not):
        return f"(!{condition_expr(condition.args[0])})"
    raise UnsupportedError(f"cannot render the runtime assertion {condition} in C")


class _Exprs:
    """Renders expression trees for one kernel whose output index variables are i0, i1, ..."""

    def __init__(self, rank: int, accumulator: str = "acc_value", variables: list[str] | None = None,
                 hoist_from: str | None = None, replaced: dict[int, str] | None = None):
        self.rank = rank
        # expression nodes (by id) rendered as given C text instead: a staged pointwise kernel's copied leaves
        self.replaced = replaced or {}
        self.accumulator = accumulator
        self.variables = variables if variables is not None else [f"i{k}" for k in range(rank)]
        # With `hoist_from` (the innermost loop's variable), checked indices that do not read it become locals
        # computed once before that loop (`hoisted`): a gather of whole rows (mixture-of-experts weights by expert
        # id) otherwise checked its row's index for every element, and ran at 2.6 GB/s.
        self.hoist_from = re.compile(rf"\b{hoist_from}\b") if hoist_from else None
        self.hoisted: list[str] = []
        self._hoisted_names: dict[str, str] = {}

    def _checked(self, checked: str) -> str:
        if self.hoist_from is None or self.hoist_from.search(checked):
            return checked
        if checked not in self._hoisted_names:
            name = f"h{len(self._hoisted_names)}"
            self._hoisted_names[checked] = name
            self.hoisted.append(f"const int64_t {name} = {checked};")
        return self._hoisted_names[checked]

    def index(self, strides: list, offset: Any, variables: list[str] | None = None) -> str:
        variables = variables if variables is not None else self.variables
        terms = [dim_expr(offset)] if sympy.sympify(offset) != 0 else []
        for var, stride in zip(variables, strides):
            if sympy.sympify(stride) != 0:
                terms.append(var if sympy.sympify(stride) == 1 else f"{var} * {dim_expr(stride)}")
        return " + ".join(terms) or "0"

    def render(self, node: Any) -> str:
        if id(node) in self.replaced:
            return self.replaced[id(node)]
        if isinstance(node, Load):
            element = f"{buffer_name(node.buffer)}[{self.index(node.strides, node.offset)}]"
            if node.buffer.dtype == dtypes.bool_:  # read as bytes: GCC does not vectorize loads of _Bool
                return f"(((const uint8_t*){buffer_name(node.buffer)})[{self.index(node.strides, node.offset)}] != 0)"
            return element
        if isinstance(node, Accumulator):
            return self.accumulator
        if isinstance(node, Constant):
            return rounded(literal(node.value), node.dtype)
        if isinstance(node, Iota):
            return rounded(f"{literal(node.start)} + {self.variables[0]} * {literal(node.step)}", node.dtype)
        if isinstance(node, Tile):  # repeat: each index modulo the source's size
            variables = [v if size is None else f"({v} % {dim_expr(size)})"
                         for v, size in zip(self.variables, node.sizes)]
            place = self.index(node.strides, node.offset, variables)
            if node.buffer.dtype == dtypes.bool_:
                return f"(((const uint8_t*){buffer_name(node.buffer)})[{place}] != 0)"
            return f"{buffer_name(node.buffer)}[{place}]"
        if isinstance(node, Gather) and node.stride is not None:  # index.Tensor: checked, wrapped indices
            table, unused = node.table, []
            place = self.index(table.strides, table.offset)
            for index, size, dim, stride in zip(node.index, node.size, node.dim, node.stride):
                checked = self._checked(checked_index(self.render(index), size, dim, node.op, wrap=True))
                if sympy.sympify(stride) != 0:
                    place = f"{place} + ({checked}) * {dim_expr(stride)}"
                else:  # a size-1 dim: the index is still checked
                    unused.append(f"(void)({checked}), ")
            element = (f"(((const uint8_t*){buffer_name(table.buffer)})[{place}] != 0)"
                       if table.buffer.dtype == dtypes.bool_ else f"{buffer_name(table.buffer)}[{place}]")
            return f"({''.join(unused)}{element})" if unused else element
        if isinstance(node, Gather) and node.dim is not None:  # index_select / gather: a checked index along dim
            checked = self._checked(checked_index(self.render(node.index), node.size, node.dim, node.op, wrap=False))
            table, variables = node.table, list(self.variables)
            variables[node.dim] = f"({checked})"
            place = self.index(table.strides, table.offset, variables)
            element = (f"(((const uint8_t*){buffer_name(table.buffer)})[{place}] != 0)"
                       if table.buffer.dtype == dtypes.bool_ else f"{buffer_name(table.buffer)}[{place}]")
            return element if sympy.sympify(table.strides[node.dim]) != 0 else f"((void)({checked}), {element})"
        if isinstance(node, Gather):
            row = f"(int64_t)({self.render(node.index)})"
            table = node.table
            column = self.variables[-1]
            offset = self.index([1, table.strides[1]], table.offset, [f"{row} * {dim_expr(table.strides[0])}", column])
            return f"{buffer_name(table.buffer)}[{offset}]"
        if isinstance(node, Apply):
            cast_kind, rule = POINTWISE_RULES[node.op]
            converted = node.operand_dtype  # (schedule.PROMOTING_OPS) every operand in that dtype first, as ATen
            target = compute_type(converted if cast_kind == "promote" else node.dtype)
            operands = []
            for position, (arg, dtype) in enumerate(zip(node.args, node.arg_dtypes)):
                if dtype is not None:
                    text = as_number(self.render(arg), dtype)
                    if converted is not None and dtype is not converted:
                        text = as_number(rounded(text, converted), converted)
                    operands.append(text if cast_kind == "where" and position == 0 else f"({target})({text})")
                elif isinstance(arg, str):
                    operands.append(arg)
                elif arg is None or isinstance(arg, dtypes.DType):
                    operands.append("")
                elif isinstance(arg, sympy.Expr) and arg.free_symbols:  # a size as a scalar (`x == 256 * u1`)
                    if not arg.is_integer:
                        raise UnsupportedError(f"{node.op} takes the non-integer symbolic scalar {arg}")
                    operands.append(f"({target})({dim_expr(arg)})")
                else:
                    operands.append(f"({target}){literal(dtypes.convert_scalar(arg, converted))}")
            if cast_kind == "where":
                # A function call evaluates both branches: a ternary makes the compiler load only on one side,
                # and such masked loads keep the loop from vectorizing.
                select = f"kiln_where_{compute_type(node.dtype).replace('_t', '')}"
                return rounded(f"{select}({operands[0]}, {operands[1]}, {operands[2]})", node.dtype)
            if node.dtype == dtypes.float32 and node.op in FLOAT32_RULES:
                rule = FLOAT32_RULES[node.op]
            return rounded(rule(operands), node.dtype)
        raise UnsupportedError(f"cannot render {type(node).__name__}")


def checked_index(index: str, size: Any, dim: int, op: str, wrap: bool) -> str:
    """C for an index value checked against `size` (an out-of-range one fails the run, naming `op`); negative
    values wrap first when `wrap` (index.Tensor, index_put), as ATen."""
    check = "kiln_index_wrap" if wrap else "kiln_index"
    return f"{check}((int64_t)({index}), {dim_expr(size)}, {dim}, {_cstr(op)}, ctx)"


def buffer_name(buffer: Buffer) -> str:
    return f"b{buffer.index}_{identifier(buffer.name)}"


# ---------------------------------------------------------------------------------------------
# Kernels

@dataclass
class RenderState:
    """What kernels need from the model beyond their buffers: prepacked weight panels and per-thread scratch."""

    packed: dict = field(default_factory=dict)  # kernel -> index into ctx->packed (B operands packed at create)
    scratch: list = field(default_factory=list)  # per-thread scratch bytes each kernel needs (size expressions)
    # (size expression, exclusive bound, error message): sizes a kernel's code assumes stay below a bound, which
    # kiln_run checks where the symbols' ranges do not (a convolution indexing a dynamic plane with 32-bit offsets)
    size_limits: list = field(default_factory=list)
    symbol_slots: dict = field(default_factory=dict)  # symbol -> its index in ctx->sym


def _loops(shape: list, body: list[str], indent: str = "    ", simd: bool = False,
           hoisted: list[str] | None = None, share_all: bool = False) -> list[str]:
    """A loop nest over `shape` whose iterations the run's OpenMP team shares (kernels run inside one parallel
    region: `omp for` here is orphaned, and its implicit barrier orders this kernel before the next). The team
    shares the outer dims; the innermost loop stays a plain loop (collapsing it too would cost a division per
    element to recover the indices), vectorized with `simd`. With `share_all` the team shares every dim: a body
    that is a whole row or tile (a layer norm's row: over a [1, seq] batch of rows, sharing only the outer dim ran
    them all on one thread). `hoisted` lines (see _Exprs) go before the innermost loop, which must then run at least
    once."""
    rank = len(shape)
    hoist = bool(hoisted) and rank > 1
    lines = []
    if rank == 0:
        lines.append(f"{indent}#pragma omp single")
    elif rank == 1:
        lines.append(f"{indent}#pragma omp for{' simd' if simd else ''} schedule(static)")
    else:
        lines.append(f"{indent}#pragma omp for collapse({rank if share_all else rank - 1}) schedule(static)")
    for k, d in enumerate(shape):
        depth = k + (hoist and k == rank - 1)  # the innermost loop sits inside the block of hoisted lines
        if hoist and k == rank - 1:
            lines += [f"{indent}{'    ' * k}{{", *[f"{indent}{'    ' * depth}{line}" for line in hoisted]]
        if simd and k == rank - 1 and rank > 1:
            lines.append(f"{indent}{'    ' * depth}#pragma omp simd")
        lines.append(f"{indent}{'    ' * depth}for (int64_t i{k} = 0; i{k} < {dim_expr(d)}; ++i{k})")
    inner = indent + "    " * (rank + hoist)
    lines.append(f"{inner}{{")
    lines += [f"{inner}    {line}" for line in body]
    lines.append(f"{inner}}}")
    if hoist:
        lines.append(f"{indent}{'    ' * (rank - 1)}}}")
    return lines


def _flat(shape: list) -> str:
    return _Exprs(len(shape)).index(contiguous_strides(shape), 0)


def _chunking(units: str, qnarrow: str | None = None) -> list[str]:
    """Split each unit's M rows into chunks when there are too few units to keep the team busy (the caller
    defines M, N and what a unit is). `qnarrow` set: the int8 GEMM's steps (kiln_qgemm.h) instead of float32's
    tiles, for a layer whose `narrow` flag is this C expression, in chunks whose copy of their rows (AMX's, or AVX2's
    int16) stays small (kiln_qchunk_rows)."""
    mr, panels, tile = ("KILN_MR", "kiln_panels", "float tile[KILN_MR * KILN_NR]") if qnarrow is None else \
        ("KILN_QROWS", "kiln_qpanels", "int32_t tile[KILN_QROWS * KILN_QNR]")
    return [
        f"const int64_t panels = {panels}(N), row_blocks = (M + {mr} - 1) / {mr};",
        f"const int64_t units = {units}, wanted = 4 * (int64_t)omp_get_num_threads();",
        "int64_t chunks = units >= wanted || units == 0 ? 1 : (wanted + units - 1) / units;",
        "if (chunks > row_blocks) chunks = row_blocks;",
        "if (chunks < 1) chunks = 1;",
        f"{'' if qnarrow is not None else 'const '}int64_t chunk_rows = (row_blocks + chunks - 1) / chunks * {mr};",
        *([f"if (chunk_rows > kiln_qchunk_rows(K, {qnarrow}))", "{",
           f"    chunk_rows = kiln_qchunk_rows(K, {qnarrow});", "    chunks = (M + chunk_rows - 1) / chunk_rows;", "}"]
          if qnarrow is not None else []),
        f"{tile} __attribute__((aligned(64)));",
    ]


def _shared_units(loops: int, units: str) -> str:
    """The work-sharing pragma of `loops` collapsed loops over `units` (an expression) units of similar work: dynamic
    chunks of a sixteenth of a thread's share, so a thread the VM delays hands its remaining chunks to the others
    instead of the team waiting for it at the barrier (static shares: the int8 CNN's convolutions took 1.2x as
    long on the 2-vCPU VM; chunks keep runs of neighbouring units together, which share input rows and output
    cache lines)."""
    return f"#pragma omp for collapse({loops}) schedule(dynamic, (int)(({units}) / (16 * omp_get_num_threads()) + 1))"


def _view_index(view: Any, variables: list[str]) -> str:
    """The flat element offset of a View (shape, strides, offset) at index `variables`."""
    return _Exprs(len(variables)).index(view.strides, view.offset, variables)


def _allocate(slot: int, size: str) -> list[str]:
    """Create-time lines: a 64-byte-aligned block of `size` bytes (a multiple of 64) for packed slot `slot`."""
    return [f"    m->packed[{slot}] = (float*)aligned_alloc(64, {size});",
            f"    if (!m->packed[{slot}]) {{ kiln_destroy(m); return NULL; }}",
            f"    m->packed_owned[{slot}] = 1;"]


def _cstr(text: str) -> str:
    """A C string literal of `text`, every character but letters, digits and _.- escaped."""
    return '"' + "".join(c if c.isalnum() or c in "_.-" else f"\\{ord(c) & 0xFF:03o}" for c in text) + '"'


def accumulator_dtype(kernel: Kernel) -> dtypes.DType:
    """The dtype of the GEMM or convolution result its epilogue reads (`acc_value`): the Accumulator's, which differs
    from the output's when the epilogue converts (a fused comparison writes bool, a half-precision model's rounding
    writes float16)."""
    def find(node: Any) -> dtypes.DType | None:
        if isinstance(node, Accumulator):
            return node.dtype
        if isinstance(node, Apply):
            return next((d for d in map(find, node.args) if d is not None), None)
        return None
    return find(kernel.expr) or kernel.outputs[0].dtype


def accumulator_type(kernel: Kernel) -> str:
    """The C type of `acc_value` (accumulator_dtype)."""
    return c_type(accumulator_dtype(kernel))


def phase_copy(declare_row: str, inside: str, column: Any, size: str, load: str, fill: str) -> list[str]:
    """`declare_row` (C declaring `row`), then lines filling that column-stride phase of a padded row, elements
    m < span: `load` (C text in m) where `inside` holds and `column(m)`, the input column of element m, lies in
    [0, size); `fill` elsewhere (the padding). The inside elements are one contiguous run, found by trimming the
    ends, so the copy is a plain vectorized loop. The max pool's tap rows (-inf around them) and the depthwise
    convolution's plane (zeros) are built so.

    The whole row is filled first: GCC turned fills of just the padding's few elements into inline `rep stosq`,
    whose start-up cost dominated short rows (Hugging Face EfficientNet's 5x5 stride-2 depthwise convolutions,
    padded (1, 2): 144 channels at 56x56 0.21-0.29 -> 0.11 ms at 2 threads; a 112-column row pays about 4%)."""
    return [declare_row,
            "int64_t lo = 0, hi = (" + inside + ") ? span : 0;  /* the elements inside the input: a plain copy */",
            f"while (lo < hi && {column('lo')} < 0) ++lo;",
            f"while (hi > lo && {column('(hi - 1)')} >= {size}) --hi;",
            f"for (int64_t m = 0; m < span; ++m) row[m] = {fill};",
            f"_Pragma(\"omp simd\") for (int64_t m = lo; m < hi; ++m) row[m] = {load};"]


def _tile_loop(ukernel: str, indices: list[str], target: str, value: str, epilogue: str, result_type: str) -> list[str]:
    """Register tiles down one chunk of rows; each tile goes through the epilogue (reading `value` as
    `result_type`'s acc_value) into the output."""
    return [
        "    const int64_t row_end = (chunk + 1) * chunk_rows < M ? (chunk + 1) * chunk_rows : M;",
        "    const int64_t width = N - j * KILN_NR < KILN_NR ? N - j * KILN_NR : KILN_NR;",
        "    for (int64_t row = chunk * chunk_rows; row < row_end; row += KILN_MR)", "    {",
        "        const int rows = (int)(row_end - row < KILN_MR ? row_end - row : KILN_MR);",
        f"        {ukernel}",
        "        for (int r = 0; r < rows; ++r)",
        "            _Pragma(\"omp simd\") for (int64_t c = 0; c < width; ++c)", "            {",
        *[f"                {line}" for line in store_result(indices, target, value, epilogue, result_type)],
        "            }", "    }",
    ]


def store_result(indices: list[str], target: str, value: str, epilogue: str, result_type: str) -> list[str]:
    """One output element of a GEMM-like kernel: its index variables (`indices`, C declarations), `value` read as
    `result_type`'s acc_value, and the fused epilogue written to `target`."""
    return [*indices, f"const {result_type} acc_value = ({result_type})({value});", f"{target} = {epilogue};"]
