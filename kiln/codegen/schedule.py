"""The backend-neutral kernel schedule: groups a decomposed program's ops into buffers and kernels.

Pointwise chains fuse into one loop nest (an expression tree per output element); mm/addmm/bmm are GEMM
templates whose pointwise consumers fuse in as an epilogue; reductions (their reduced dims merged into one
row), softmax, log_softmax and layer norm over the last dim are row kernels; view ops are stride/offset
arithmetic on a buffer (a copy kernel only when a reshape needs one). `kiln.scan` and `kiln.map` are loop
kernels: their body's ops schedule into kernels of their own that run once per step, reading and writing
*windows* (buffers whose address the loop sets each step: the step's slice of an x or of a stacked output, a
carry's double-buffered slot). Renderers (C, Triton) turn this schedule into source; what it is made of
(buffers, views, expression nodes, kernels and their typed details) is kernels.py.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
import dataclasses
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np
import sympy
from xdsl.dialects import func

from kiln.codegen.kernels import (
    Accumulator, Apply, BagsDetail, BindDetail, Buffer, Carry, CatDetail, Constant, ConvDetail, DistanceDetail, Gather,
    Iota, Kernel, Load, LoopDetail, LstmCellDetail, MatmulDetail, PadDetail, QConvDetail, QLinearDetail, QPoolDetail,
    RowsDetail, ScatterDetail, ScatterIndex, Schedule, SparseConvDetail, SparseLinearDetail, Tile, View,
    WLinearDetail, Window, WindowDetail, as_dim, contiguous_strides, flatten_kernels, matrix_vector, same_dim,
)
from kiln.codegen.memory import kernel_reads
from kiln.codegen.recurrent import match_cell
from kiln.ir import dtypes
from kiln.ir.control_flow import MapOp, ScanOp, WhileLoopOp, YieldOp
from kiln.ir.dialect import bound_arguments
from kiln.ir.errors import UnsupportedError
from kiln.ir.ops.shape import fill_value, slice_bounds  # the registry's fill-value conversion and slice arithmetic
from kiln.ir.program import ExportedProgram, InputKind, OutputKind, value_names
from kiln.ir.registry import REGISTRY
from kiln.ir.symbolic import active_shape_env
from kiln.ir.types import SymIntType, TensorType, type_symbols
from kiln.passes.quant.ranges import integer_range

if TYPE_CHECKING:
    from kiln.codegen.target import Target

COMPARISON_OPS = {f"aten.{cmp}.{kind}" for cmp in ("eq", "ne", "lt", "le", "gt", "ge") for kind in ("Tensor", "Scalar")}
# Ops that compute in their operands' common dtype (torch.result_type), not in their bool result's: Apply carries it
PROMOTING_OPS = COMPARISON_OPS | {"aten.isnan.default", "aten.isinf.default"}
# Ops fused into pointwise kernels; each renderer supplies one rule per name it supports.
POINTWISE_OPS = {
    "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar", "aten.mul.Tensor",
    "aten.mul.Scalar", "aten.div.Tensor", "aten.div.Scalar", "aten.neg.default", "aten.relu.default",
    "aten.exp.default", "aten.log.default", "aten.tanh.default", "aten.sigmoid.default", "aten.sqrt.default",
    "aten.rsqrt.default", "aten.abs.default", "aten.erf.default", "aten.gelu.default", "aten.where.self",
    "aten.copy.default",
    "aten.maximum.default", "aten.minimum.default", "aten._to_copy.default", "aten.clone.default",
    *COMPARISON_OPS,
    *(f"aten.{name}.default" for name in (
        "acos", "acosh", "asin", "asinh", "atan", "atanh", "cos", "cosh", "sin", "sinh", "tan", "expm1", "log10",
        "log1p", "log2", "atan2", "reciprocal", "ceil", "floor", "round", "trunc", "sign", "isnan", "isinf",
        "logical_and", "logical_or", "logical_xor", "logical_not", "bitwise_not", "clamp", "hardtanh",
        "leaky_relu", "elu")),
    *(f"aten.{name}.{kind}" for name in ("bitwise_and", "bitwise_or", "bitwise_xor", "fmod", "remainder")
      for kind in ("Tensor", "Scalar")),
    "aten.clamp.Tensor", "aten.div.Tensor_mode", "aten.div.Scalar_mode", "aten.pow.Scalar",
    "aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor",
}
# Sources: constants, iotas, and reads of a buffer at positions computed from the output index (embedding's
# row, repeat's index modulo the source size).
SOURCE_OPS = {"aten.scalar_tensor.default", "aten.arange.start_step", "aten.embedding.default", "aten.full.default",
              "aten.full_like.default", "aten.fill.Scalar", "aten.repeat.default", "aten.empty.memory_format",
              "aten.empty_strided.default"}
# Per-channel affine ops: pointwise with their [C] operands broadcast along dim 1 (fuse like pointwise ops).
CHANNEL_OPS = {"aten._native_batch_norm_legit_no_training.default"}
FUSING_OPS = POINTWISE_OPS | CHANNEL_OPS
# Convolution: a direct-loop template (double accumulator) with a fused pointwise epilogue, like GEMM.
CONV_OPS = {"aten.convolution.default"}
# Window reductions over the trailing spatial dims: one output element per window.
# grid_sampler_2d: one output element per grid point (its taps, not a window).
WINDOW_OPS = {"aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
              "aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default", "aten.avg_pool2d.default",
              "aten.avg_pool3d.default", "aten.upsample_nearest2d.vec", "aten.upsample_bilinear2d.vec",
              "aten.grid_sampler_2d.default"}
CONCAT_OPS = {"aten.cat.default"}
# constant_pad_nd: each output element reads the input at (index - left pad), or is the fill value outside it.
PAD_OPS = {"aten.constant_pad_nd.default", "aten.reflection_pad1d.default", "aten.reflection_pad2d.default",
           "aten.reflection_pad3d.default", "aten.replication_pad2d.default", "aten.replication_pad3d.default"}
MATMUL_OPS = {"aten.mm.default", "aten.addmm.default", "aten.bmm.default"}
# Reductions: the reduced dims merge into one row (a copy puts them last when their strides do not chain).
REDUCTION_OPS = {"aten.sum.dim_IntList", "aten.amax.default", "aten.amin.default", "aten.mean.dim",
                 "aten.mean.default", "aten.any.dim", "aten.any.dims", "aten.any.default", "aten.argmax.default",
                 "aten.argmin.default", "aten.max.dim", "aten.min.dim", "aten.var.correction", "aten.prod.dim_int",
                 "aten.prod.default", "aten.var.dim"}
# cumsum: a row scan along its dim (double accumulator for floats, int64 for integers).
# sort / topk: a stable merge sort of each row's (value, index) pairs in per-thread scratch (NaN the largest).
SORT_OPS = {"aten.sort.default", "aten.topk.default"}
ROW_OPS = REDUCTION_OPS | SORT_OPS | {"aten._softmax.default", "aten._log_softmax.default",
                                      "aten.native_layer_norm.default", "aten.cumsum.default",
                                      "aten.native_group_norm.default"}
# index_select / gather / index.Tensor (integer index tensors that broadcast together, None entries between; negative
# indices wrap): a pointwise read of the source at positions taken from index tensors, checked at run time.
INDEX_OPS = {"aten.index_select.default", "aten.gather.default", "aten.index.Tensor"}
# Scatters: a copy of `self`, then writes (or reductions) at positions taken from index tensors, checked at run time.
SCATTER_OPS = {"aten.index_put.default", "aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default",
               "aten.scatter_reduce.two"}
# Pairwise distances: one output element per pair of rows, a p-norm over their columns.
DISTANCE_OPS = {"aten._cdist_forward.default", "aten._pdist_forward.default"}
# embedding_bag: one bag (a run of indices between offsets) per output row, reduced by sum, mean or max.
BAG_OPS = {"aten._embedding_bag.default"}
VIEW_OPS = {"aten.view.default", "aten._unsafe_view.default", "aten.permute.default", "aten.expand.default",
            "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims", "aten.slice.Tensor",
            "aten.select.int", "aten.split_with_sizes.default", "aten.alias.default", "aten.flip.default",
            "aten.diagonal.default", "aten.as_strided.default"}
# Quantized linear layers (kiln/passes/quant/lower.py): an integer GEMM on the prepacked int8 weight, requantized.
QLINEAR_OPS = {"quant.qlinear_pointwise.default", "quant.qlinear_pointwise.tensor", "quant.qlinear_pointwise.token"}
# Quantized 2-D convolutions: im2col of uint8 pixel blocks into the same integer GEMM.
QCONV_OPS = {"quant.qconv2d_pointwise.default", "quant.qconv2d_pointwise.tensor"}
# Weight-only linear layers: float activations against int8 / int4 weights converted in registers.
WLINEAR_OPS = {"quant.linear_weight_only.default"}
# Quantized adaptive average pools: integer window sums, requantized.
QPOOL_OPS = {"quant.qadaptive_avg_pool2d.default"}
# Sizes read from a tensor's values while running (torch's unbacked u0: `.item()`, `.tolist()`, nonzero's rows): a
# `bind` kernel (then nonzero's `nonzero` kernel), where a target binds them (Target.binds_data_dependent_sizes).
BIND_OPS = {"aten._local_scalar_dense.default", "aten.nonzero.default"}
# Every op the scheduler groups into a kernel kind (a target supports these or a subset)
# Region ops that become a `loop` kernel over the scheduled kernels of their body.
LOOP_OPS = {"kiln.scan", "kiln.map", "kiln.while_loop"}
# what an `lstm_cell` kernel computes, as the ops of the cell it replaces
LSTM_CELL_OPS = ["aten.addmm.default", "aten.add.Tensor", "aten.sigmoid.default", "aten.tanh.default",
                 "aten.mul.Tensor"]
SCHEDULED_OPS = (POINTWISE_OPS | SOURCE_OPS | MATMUL_OPS | ROW_OPS | VIEW_OPS | CHANNEL_OPS | CONV_OPS | WINDOW_OPS
                 | CONCAT_OPS | PAD_OPS | INDEX_OPS | SCATTER_OPS | DISTANCE_OPS | BAG_OPS | QLINEAR_OPS | QCONV_OPS
                 | WLINEAR_OPS | QPOOL_OPS | BIND_OPS)


def _narrow(activations: Any) -> bool:
    """Whether an integer layer's activations are uint8 proven to be at most 127 (reduce_range): backends may
    multiply them with instructions that would saturate on full 8-bit values (AVX2's vpmaddubsw)."""
    return activations.type.dtype is dtypes.uint8 and integer_range(activations)[1] <= 127


def _contiguous(buffer: Buffer, shape: list | None = None) -> View:
    shape = list(buffer.shape if shape is None else shape)
    return View(buffer, shape, contiguous_strides(shape), sympy.Integer(0))


def _chunk_run(inputs: list[tuple[View, list]], index: int) -> int:
    """How many of a cat's inputs from `index` on are consecutive contiguous chunks of one buffer that together are
    all of it, in its order (torch.chunk or split, then cat, as a YOLO C2f or CSP block does); 0 if they are not.
    Placed in the cat's result, that buffer's producer writes every chunk's slice at once."""
    buffer, end, offset = inputs[index][0].buffer, index, sympy.Integer(0)
    while end < len(inputs) and inputs[end][0].buffer is buffer and inputs[end][0].is_contiguous \
            and same_dim(inputs[end][0].offset, offset):
        offset = sympy.expand(offset + sympy.Mul(*map(as_dim, inputs[end][1])))
        end += 1
        if same_dim(offset, buffer.numel):
            return end - index
    return 0


def _load(view: View, out_shape: list) -> Load:
    """Broadcast `view` to `out_shape` (right-aligned) as per-output-dim strides."""
    lead = len(out_shape) - len(view.shape)
    strides = [sympy.Integer(0)] * lead
    for d, s, o in zip(view.shape, view.strides, out_shape[lead:]):
        strides.append(sympy.Integer(0) if same_dim(d, 1) and not same_dim(o, 1) else s)
    return Load(view.buffer, strides, view.offset)


def _advanced(indices: list, rank: int, out_rank: int) -> tuple[int, int, list, list]:
    """ATen's advanced-indexing layout of `x[indices]` for a rank-`rank` x and a rank-`out_rank` result: the index
    tensors broadcast into `width` dims that start at `start` (the first indexed dim when the indexed dims are
    adjacent, else 0); `indexed` pairs each indexed dim with its index, `rest` each other result dim with its dim
    of x."""
    indexed = [(d, value) for d, value in enumerate(indices) if value is not None]
    dims = [d for d, _ in indexed]
    width = out_rank - (rank - len(indexed))
    start = dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0
    others = [k for k in range(out_rank) if not start <= k < start + width]
    rest = list(zip(others, [d for d in range(rank) if d not in dims]))
    return start, width, indexed, rest


def _broadcast(shapes: list[list]) -> list:
    """The shapes broadcast together (right-aligned; a size-1 dim takes the other size)."""
    rank = max(len(shape) for shape in shapes)
    result = [sympy.Integer(1)] * rank
    for shape in shapes:
        for k, d in enumerate(shape, rank - len(shape)):
            if not same_dim(d, 1):
                result[k] = as_dim(d)
    return result


def _at_least_1d(view: View) -> View:
    return view if view.shape else View(view.buffer, [1], [sympy.Integer(0)], view.offset)


def _index_load(view: View, out_shape: list, start: int, width: int) -> Load:
    """An index tensor broadcast to the index dims `out_shape[start:start + width]` (stride 0 along the others)."""
    inner = _load(view, out_shape[start:start + width])
    strides = [sympy.Integer(0)] * start + inner.strides + [sympy.Integer(0)] * (len(out_shape) - start - width)
    return Load(view.buffer, strides, view.offset)


def _batch_gather(op: Any, expr: Gather) -> bool:
    """`x[index]` choosing whole matrices of a rank-3 x (contiguous along its last dim) whose one use is as A of a
    bmm with one output column: a target with `gathers_matrix_vector_batches` reads them where they are. Hugging
    Face's batched mixture of experts gathers each token's expert weights so, a copy as large as the token count
    times an expert's weights."""
    result = op.results[0]
    uses = list(result.uses)
    if len(expr.index) != 1 or expr.dim != [0] or len(result.type.shape) != 3 or len(uses) != 1 or \
            _op_name(uses[0].operation) != "aten.bmm.default" or uses[0].index != 0:
        return False
    index, columns = expr.index[0], uses[0].operation.results[0].type.shape[-1]
    return all(sympy.sympify(s) == 0 for s in index.strides[1:]) and sympy.sympify(expr.table.strides[-1]) == 1 and \
        sympy.sympify(expr.table.strides[0]) == 0 and same_dim(columns, 1)


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "type") and isinstance(value.type, TensorType)


def _norm_dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


# ---------------------------------------------------------------------------------------------
# Scheduling

class _Scheduler:
    def __init__(self, program: ExportedProgram, target: Target):
        self.program = program
        self.target = target
        self.names = value_names(program.body)
        self.buffers: list[Buffer] = []
        self.kernels: list[Kernel] = []
        self.views: dict[Any, View] = {}
        # value -> (expression, matmul kernel or None, the shape the expression is indexed over: the value's own,
        # or, after a reshape fused through, its producer's)
        self.pending: dict[Any, tuple[Any, Any, list]] = {}
        self.shared_uses: dict[Any, int] = {}  # pending values read by several ops of one activation: reads left
        self.padded: dict[Any, tuple[str, PadDetail]] = {}  # zero pads a convolution reads through, not made
        self.batch_gathers: dict[Any, Gather] = {}  # whole matrices gathered for a matrix-vector bmm, not made
        self.row_reads: dict[Any, int] = {}  # pending value -> row kernels left to read it
        self.constants: dict[Any, Constant] = {}  # scalar_tensor / full results: a buffer only when one is needed
        self.sparse_weights: dict[Any, dict[str, Buffer]] = {}  # sparse weight -> its component buffers
        self.region_depth = 0  # loop regions being scheduled around the current op

    def buffer(self, value: Any, kind: str = "temp", shape: list | None = None, dtype: Any = None) -> Buffer:
        vtype = value.type if value is not None else None
        name = self.names[value] if value is not None else f"t{len(self.buffers)}"
        buf = Buffer(len(self.buffers), name, dtype or vtype.dtype, list(shape if shape is not None else vtype.shape),
                     kind)
        self.buffers.append(buf)
        return buf

    def run(self) -> Schedule:
        program = self.program
        self.check_supported()
        inputs = []
        mutated = set(program.graph_signature.buffers_to_mutate.values())
        for spec, arg in zip(program.graph_signature.input_specs, program.body.args):
            if spec.kind is InputKind.USER_INPUT:
                buf = self.buffer(arg, "input")
                buf.io_index = len(inputs)
                inputs.append(buf)
            elif arg.type.is_sparse:
                self.sparse_weights[arg] = self.sparse_components(arg, spec.target)
                continue
            else:
                buf = self.buffer(arg, "state" if spec.target in mutated else "weight")
                buf.weight_key = spec.target
            self.views[arg] = _contiguous(buf)
        returned: list = []
        for op in program.body.ops:
            if isinstance(op, func.ReturnOp):
                returned = list(op.operands)
                break
            self.schedule_op(op)
        outputs = []
        claimed: set = set()
        state_buffers = {buf.weight_key: buf for buf in self.buffers if buf.kind == "state"}
        state = []
        for value, spec in zip(returned, program.graph_signature.output_specs):
            view = self.materialized(value)
            buf = view.buffer
            claimable = (buf.kind == "temp" and buf.inside is None and buf not in claimed and view.is_contiguous
                         and same_dim(view.offset, 0) and same_dim(sympy.Mul(*map(as_dim, view.shape)), buf.numel))
            scatter = self.in_place_scatter(buf, state_buffers[spec.target]) \
                if spec.kind is OutputKind.BUFFER_MUTATION and claimable else None
            if scatter is not None:
                buf.inside = (state_buffers[spec.target], sympy.Integer(0))
                scatter.detail.in_place = True
                claimed.add(buf)
                state.append((state_buffers[spec.target], None))
                continue
            if not claimable:
                buf = self.copy(view, value)
            claimed.add(buf)
            if spec.kind is OutputKind.BUFFER_MUTATION:  # written beside the state, which it replaces after the run
                buf.kind = "next_state"
                state.append((state_buffers[spec.target], buf))
                continue
            buf.kind = "output"
            buf.io_index = len(outputs)
            outputs.append((buf, asserted_dims(value.type.shape, program)))
        # The caller binds every symbol but the data-dependent ones the run binds itself. Symbols only: range
        # constraints also hold derived entries (n + 1), whose ranges follow from n's.
        unbacked = [k.detail.symbol for k in self.kernels if k.kind == "bind"]
        symbols = sorted((s for s in program.range_constraints if isinstance(s, sympy.Symbol)), key=str)
        for buf in self.buffers:
            for d in buf.shape:
                for s in getattr(d, "free_symbols", ()):
                    if s not in symbols:
                        symbols.append(s)
        user_names = iter(program.user_output_names())  # pytree keys (`logits`) where the outputs have them
        return Schedule(self.buffers, self.kernels, inputs, outputs, [s for s in symbols if s not in unbacked],
                        [next(user_names) if s.kind is OutputKind.USER_OUTPUT else s.name
                         for s in program.graph_signature.output_specs if s.kind is not OutputKind.BUFFER_MUTATION],
                        program.graph_signature.user_inputs, unbacked, state)

    def sparse_components(self, arg: Any, target: str) -> dict[str, Buffer]:
        """A sparse weight as dense component buffers (DESIGN: backends see values, indices and metadata), keyed
        `target.component`; indices are int32 for the kernels."""
        store = self.program.state_dict if target in self.program.state_dict else self.program.constants
        value = store[target]
        components = {}
        for component, array in value.components.items():
            dtype = dtypes.int32 if "indices" in component else dtypes.dtype(array.dtype)
            buf = Buffer(len(self.buffers), f"{self.names[arg]}_{component}", dtype, list(array.shape), "weight",
                         sparse_weight_key(target, component))
            self.buffers.append(buf)
            components[component] = buf
        return components

    def check_supported(self) -> None:
        target = self.target
        problems = data_dependent_problems(self.program, target)
        for op in self.program.body.walk():
            if isinstance(op, (func.ReturnOp, YieldOp)):
                continue
            name = getattr(getattr(op, "opdef", None), "name", op.name)
            reason = None if name in problems else target.unsupported(op, name)
            if reason:
                problems.setdefault(name, reason)
        refuse(problems, target)
        self.check_state()

    def in_place_scatter(self, new: Buffer, state: Buffer) -> Kernel | None:
        """The scatter that can write the new value of a state buffer over it, if one can: the new value's writer is a
        scatter (a KV cache's index_copy_) whose `self` is the whole state, read nowhere else by that kernel nor by any
        kernel after it. It then writes only its targets (its copy of self is the state itself): the run copies
        nothing."""
        writer = next((k for k, kernel in enumerate(self.kernels) if new in kernel.outputs), None)
        if writer is None or self.kernels[writer].kind != "scatter":
            return None
        scatter = self.kernels[writer]
        source = scatter.detail.input
        whole = (source.buffer is state and same_dim(source.offset, 0)
                 and all(same_dim(a, b) or same_dim(size, 1)
                         for a, b, size in zip(source.strides, contiguous_strides(state.shape), state.shape)))
        # what else the scatter reads (its values, indices, mask): none of it may be the state it overwrites
        others = dataclasses.replace(scatter, detail=dataclasses.replace(scatter.detail, input=None))
        later_readers = [others, *flatten_kernels(self.kernels[writer + 1:])]
        read_later = any(buf is state for kernel in later_readers for buf in kernel_reads(kernel))
        return scatter if whole and not read_later else None

    def check_state(self) -> None:
        """The buffers the program mutates are state the package keeps: only where the target keeps it, and only
        of a static size (allocated once, when the model is created)."""
        signature = self.program.graph_signature
        mutated = set(signature.buffers_to_mutate.values())
        if mutated and not self.target.keeps_state:
            raise UnsupportedError(f"the program mutates buffers ({', '.join(sorted(mutated))}), and "
                                   f"{self.target.name} packages keep no state between runs",
                                   fix="compile it for the C or Triton backend, which keep them, or export it for ONNX")
        for spec, arg in zip(signature.input_specs, self.program.body.args):
            if spec.target in mutated and not all(isinstance(d, int) for d in arg.type.shape):
                raise UnsupportedError(f"buffer '{spec.target}' is mutated and its shape "
                                       f"{[str(d) for d in arg.type.shape]} is symbolic; compiled packages keep "
                                       "state of a fixed size", fix="give the buffer a static shape (a static KV cache "
                                                                    "of max_cache_len positions)")

    # -- values
    def materialized(self, value: Any) -> View:
        if value in self.padded:  # a zero pad kept for a convolution, read by something else after all
            self.emit_pad(value, *self.padded.pop(value))
        if value in self.batch_gathers:
            self.emit_pointwise(value, self.batch_gathers.pop(value), None)
        if value in self.pending:
            expr, matmul, space = self.pending.pop(value)
            self.emit_pointwise(value, expr, matmul, space)
        if value not in self.views and value in self.constants:  # a non-pointwise consumer needs the buffer
            self.emit_pointwise(value, self.constants[value], None)
        return self.views[value]

    def copy(self, view: View, value: Any) -> Buffer:
        buf = self.buffer(None, shape=view.shape, dtype=view.buffer.dtype)
        buf.name = f"{self.names.get(value, 'copy')}_copy"
        self.kernels.append(Kernel("pointwise", f"copy_{buf.name}", ["copy"], [buf], list(view.shape),
                                   _load(view, view.shape)))
        return buf

    def fusable_into_consumer(self, value: Any, expr: Any = None) -> bool:
        uses = list(value.uses)
        if uses and all(_op_name(use.operation) in ROW_OPS and use.index == 0 for use in uses):
            return True  # row kernels may each read it as an expression (schedule_rows decides)
        if len(uses) > 1 and (expr is None or _cheap_to_recompute(expr)) and _activation_of(value) is not None:
            self.shared_uses[value] = len(uses)  # x * f(x): every use reads the expression (operand_expr)
            return True
        if len(uses) != 1:
            return False
        user = uses[0].operation
        name = _op_name(user)
        if name in ("aten.view.default", "aten._unsafe_view.default"):
            return self.fusable_into_consumer(user.results[0])  # schedule_view passes the pending value on
        if name not in FUSING_OPS or (name in CHANNEL_OPS and user.operands[0] is not value):
            return False
        out = user.results[0].type
        return len(out.shape) == len(value.type.shape) and all(map(same_dim, out.shape, value.type.shape))

    def emit_pointwise(self, value: Any, expr: Any, matmul: Any, space: list | None = None) -> None:
        """Write `expr` into a new contiguous buffer for `value`; the loop runs over `space` (a reshape of the
        value's shape: the same flat offsets) when the expression is indexed there."""
        buf = self.buffer(value)
        fused = expression_ops(expr)
        if matmul is not None:
            matmul.outputs, matmul.expr = [buf], expr
            matmul.ops += fused
            matmul.name = "_".join([matmul.name] + [o.split(".")[1].lstrip("_") for o in fused] + [buf.name])
            self.kernels.append(matmul)
        else:
            self.kernels.append(Kernel("pointwise", f"pointwise_{buf.name}", fused or ["copy"], [buf],
                                       list(space if space is not None else value.type.shape), expr))
        self.views[value] = _contiguous(buf)

    def operand_expr(self, value: Any, out_shape: list, carried: list, space: list | None = None) -> Any:
        """`value` as an expression over `space` (default: the consumer's `out_shape`), fusing its pending
        producer when it is indexed there (or convertible to it); otherwise a load of its buffer."""
        space = out_shape if space is None else space
        if value in self.constants:  # free to recompute: inlined into every pointwise consumer
            return self.constants[value]
        if value in self.pending:
            expr, matmul, own = self.pending[value]
            if _same_shape(own, space):
                if matmul is not None and carried[0] is not None and carried[0] is not matmul:
                    del self.pending[value]  # a second GEMM in the same chain: materialize it
                    self.shared_uses.pop(value, None)
                    self.emit_pointwise(value, expr, matmul, own)
                    return _respace(_load(self.views[value], out_shape), out_shape, space)
                left = self.shared_uses.pop(value, 1) - 1  # x * f(x) reads x more than once
                if left:
                    self.shared_uses[value] = left
                else:
                    del self.pending[value]
                if matmul is not None:
                    carried[0] = matmul
                return expr
            if matmul is None and _same_shape(own, out_shape) and value not in self.shared_uses:
                converted = _respace(expr, out_shape, space)
                if converted is not None:
                    del self.pending[value]
                    return converted
        load = _load(self.materialized(value), out_shape)
        return load if _same_shape(space, out_shape) else _respace(load, out_shape, space)

    def chain_space(self, args: list, out_shape: list) -> list:
        """The index space a pointwise op fuses in: its own shape, or its producer's when a reshape was fused
        through and every other operand can be indexed there too (else those producers are materialized)."""
        tensors = [a for a in args if _is_tensor(a)]
        foreign = [self.pending[a][2] for a in tensors
                   if a in self.pending and not _same_shape(self.pending[a][2], out_shape)]
        if not foreign:
            return out_shape
        space = foreign[0]
        for a in tensors:
            if a in self.constants:
                continue
            if a in self.pending:
                expr, matmul, own = self.pending[a]
                if _same_shape(own, space) or (matmul is None and _same_shape(own, out_shape)
                                               and _respace(expr, out_shape, space) is not None):
                    continue
            elif _respace(_load(self.views[a], out_shape), out_shape, space) is not None:
                continue
            for b in tensors:  # not expressible in the producer's space: fall back to the op's own shape
                if b in self.pending and not _same_shape(self.pending[b][2], out_shape):
                    self.materialized(b)
            return out_shape
        return space

    def finish(self, value: Any, expr: Any, matmul: Any, space: list | None = None) -> None:
        space = list(space if space is not None else value.type.shape)
        if self.fusable_into_consumer(value, expr):
            self.pending[value] = (expr, matmul, space)
        else:
            self.emit_pointwise(value, expr, matmul, space)

    # -- ops
    def schedule_op(self, op: Any) -> None:
        if isinstance(op, (ScanOp, MapOp)):
            self.schedule_loop(op)
            return
        if isinstance(op, WhileLoopOp):
            self.schedule_while(op)
            return
        name = op.opdef.name
        result = op.results[0]
        args = bound_arguments(op)
        if name == "aten.linear.default" and args[1] in self.sparse_weights:
            self.schedule_sparse_linear(op, name, args)
            return
        if name == "aten.convolution.default" and args[1] in self.sparse_weights:
            self.schedule_sparse_conv(op, name, args)
            return
        if name in BIND_OPS:
            self.schedule_bind(op, name, args)
            return
        for kinds, method in ((VIEW_OPS, self.schedule_view), (MATMUL_OPS, self.schedule_matmul),
                              (ROW_OPS, self.schedule_rows), (CONV_OPS, self.schedule_conv),
                              (WINDOW_OPS, self.schedule_window), (CONCAT_OPS, self.schedule_cat),
                              (PAD_OPS, self.schedule_pad), (SCATTER_OPS, self.schedule_scatter),
                              (DISTANCE_OPS, self.schedule_distance), (BAG_OPS, self.schedule_bags),
                              (QLINEAR_OPS, self.schedule_qlinear), (QCONV_OPS, self.schedule_qconv),
                              (WLINEAR_OPS, self.schedule_wlinear), (QPOOL_OPS, self.schedule_qpool)):
            if name in kinds:
                method(op, name, args)
                return
        # pointwise and source ops: an expression tree, fused into its consumers where it can be
        out_shape = list(result.type.shape)
        carried: list = [None]
        if name in ("aten.scalar_tensor.default", "aten.full.default", "aten.full_like.default",
                    "aten.fill.Scalar", "aten.empty.memory_format", "aten.empty_strided.default"):
            # full_like / fill: a constant of the input's shape; empty's values are unspecified, and zeros are the
            # interpreter's
            value = args[0] if name == "aten.scalar_tensor.default" else 0 if "empty" in name else args[1]
            self.constants[result] = Constant(value, result.type.dtype, name)
            return
        if name in CHANNEL_OPS:
            expr = self.channel_expr(op, name, args, out_shape, carried)
        elif name == "aten.arange.start_step":
            start, step = args[0], args[2]
            if result.type.dtype.is_integral:  # ATen counts from the truncated start and step (in int64)
                start, step = (math.trunc(v) if isinstance(v, float) else v for v in (start, step))
            expr = Iota(start, step, result.type.dtype)
        elif name == "aten.embedding.default":
            index = self.operand_expr(args[1], out_shape[:-1], carried)
            expr = Gather(self.materialized(args[0]), index, result.type.dtype)
        elif name == "aten.repeat.default":
            source = self.materialized(args[0])
            lead = len(out_shape) - len(source.shape)
            strides, sizes = [sympy.Integer(0)] * lead, [None] * lead
            for d, s, o in zip(source.shape, source.strides, out_shape[lead:]):
                strides.append(sympy.Integer(0) if same_dim(d, 1) else s)
                sizes.append(None if same_dim(d, 1) or same_dim(d, o) else d)
            expr = Tile(source.buffer, strides, source.offset, sizes)
        elif name == "aten.index.Tensor":  # the broadcast index dims replace the indexed dims (see _advanced)
            source = self.materialized(args[0])
            start, width, indexed, rest = _advanced(args[1], len(source.shape), len(out_shape))
            strides = [sympy.Integer(0)] * len(out_shape)
            for k, d in rest:
                strides[k] = source.strides[d]
            table = View(source.buffer, out_shape, strides, source.offset)
            loads = [_index_load(self.materialized(value), out_shape, start, width) for _, value in indexed]
            expr = Gather(table, loads, result.type.dtype, [d for d, _ in indexed],
                          [source.shape[d] for d, _ in indexed], name, [source.strides[d] for d, _ in indexed])
            if self.target.gathers_matrix_vector_batches and _batch_gather(op, expr):
                self.batch_gathers[result] = expr  # schedule_matmul reads the matrices where they are
                return
        elif name in INDEX_OPS:  # index_select, gather (index.Tensor is handled above)
            source, positions = self.materialized(args[0]), self.materialized(args[2])
            dim = _norm_dim(args[1], len(out_shape))
            if name == "aten.index_select.default":  # a vector (or one element) read along `dim`
                strides = [sympy.Integer(0)] * len(out_shape)
                strides[dim] = positions.strides[0] if positions.shape else sympy.Integer(0)
                index = Load(positions.buffer, strides, positions.offset)
            else:
                index = _load(positions, out_shape)
            expr = Gather(source, index, result.type.dtype, dim, source.shape[dim], name)
        else:
            space = self.chain_space(args, out_shape)
            nodes = [self.operand_expr(a, out_shape, carried, space) if _is_tensor(a) else a for a in args]
            arg_dtypes = [a.type.dtype if _is_tensor(a) else None for a in args]
            operand_dtype = (dtypes.result_type(*(a.type if _is_tensor(a) else a for a in args))
                             if name in PROMOTING_OPS else None)
            expr = Apply(name, nodes, result.type.dtype, arg_dtypes, operand_dtype)
            self.finish(result, expr, carried[0], space)
            return
        self.finish(result, expr, carried[0])

    def channel_expr(self, op: Any, name: str, args: list, out_shape: list, carried: list) -> Apply:
        """batch norm (eval): x and per-channel [C] operands viewed as [C, 1, ...] along dim 1."""
        nodes: list = [self.operand_expr(args[0], out_shape, carried)]
        for a in args[1:]:
            if _is_tensor(a):
                view = self.materialized(a)
                trailing = len(out_shape) - 2
                channel = View(view.buffer, [view.shape[0]] + [1] * trailing,
                               [view.strides[0]] + [sympy.Integer(0)] * trailing, view.offset)
                nodes.append(_load(channel, out_shape))
            else:
                nodes.append(a)
        arg_dtypes = [a.type.dtype if _is_tensor(a) else None for a in args]
        for extra in op.results[1:]:  # the empty save_mean / save_invstd
            self.views[extra] = _contiguous(self.buffer(extra))
        return Apply(name, nodes, op.results[0].type.dtype, arg_dtypes)

    def schedule_bind(self, op: Any, name: str, args: list) -> None:
        """A data-dependent size, read into its symbol by a kernel the run waits for (check_supported took only
        reads at the top level): an element, or nonzero's count, whose coordinates a second kernel then writes
        into the result it sized. A size known already (an input's, or read before) is not read again."""
        source, result = self.materialized(args[0]), op.results[0]
        symbol = bound_symbol(op)
        detail = BindDetail(symbol, source, count=name == "aten.nonzero.default")
        if symbol not in input_symbols(self.program) | {k.detail.symbol for k in self.kernels if k.kind == "bind"}:
            self.kernels.append(Kernel("bind", f"bind_{symbol}", [name], [], [], detail=detail))
        if name == "aten.nonzero.default":
            buf = self.buffer(result)
            self.kernels.append(Kernel("nonzero", f"nonzero_{buf.name}", [name], [buf], list(buf.shape),
                                       detail=detail))
            self.views[result] = _contiguous(buf)

    def schedule_conv(self, op: Any, name: str, args: list) -> None:
        result = op.results[0]
        out_shape = list(result.type.shape)
        n = len(out_shape) - 2
        padding = _per_dim(args[4], n)
        if args[0] in self.padded:  # a zero pad of its input (TF 'same' at stride 2: (0, 1) per dim), never made
            pad = self.padded.pop(args[0])[1]
            source = pad.input
            padding = [p + b for p, b in zip(padding, pad.before[2:])]
        else:
            source = self.materialized(args[0])
        detail = ConvDetail(
            # A strided weight (a backward pass's flipped kernel) is copied once, so the GEMM path takes it.
            # `padding` is each spatial dim's leading padding: the output's shape says where the input ends.
            input=source, weight=self.contiguous_operand(args[1]),
            bias=self.materialized(args[2]) if args[2] is not None else None,
            stride=_per_dim(args[3], n), padding=padding, dilation=_per_dim(args[5], n),
            groups=args[8], transposed=bool(args[6]))
        kernel = Kernel("conv", "convolution", [name], [], out_shape, None, detail)
        if self.fusable_into_consumer(result):
            self.pending[result] = (Accumulator(result.type.dtype), kernel, out_shape)
        else:
            self.emit_pointwise(result, Accumulator(result.type.dtype), kernel)

    def schedule_window(self, op: Any, name: str, args: list) -> None:
        source = self.materialized(args[0])
        # max_pool's indices only when something reads them (max_pool2d decomposes to the with_indices form)
        results = op.results[:1] if "max_pool" in name and not op.results[1].uses else op.results
        outputs = [self.buffer(r) for r in results]
        out_shape = list(op.results[0].type.shape)
        n = 3 if "3d" in name else 2
        detail = WindowDetail(source, n)
        if "max_pool" in name or "avg_pool" in name:
            kernel = _per_dim(args[1], n)
            detail.kernel, detail.stride = kernel, _per_dim(args[2], n) if len(args) > 2 and args[2] else kernel
            detail.padding = _per_dim(args[3] if len(args) > 3 else 0, n)
            detail.dilation = _per_dim(args[4] if "max_pool" in name and len(args) > 4 else 1, n)
        if "avg_pool" in name and not name.startswith("aten._adaptive"):
            detail.count_include_pad, detail.divisor_override = args[5], args[6]
        if name == "aten.grid_sampler_2d.default":
            detail.grid, detail.interpolation, detail.padding_mode = self.materialized(args[1]), args[2], args[3]
            detail.align_corners = bool(args[4])
        if "upsample" in name:
            scales = args[-1] if args[-1] is not None else [None, None]
            detail.scales, detail.align_corners = list(scales), args[2] if "bilinear" in name else None
        short = name.split(".")[1].lstrip("_")
        self.kernels.append(Kernel("window", f"{short}_{outputs[0].name}", [name], outputs, out_shape, None, detail))
        for r, buf in zip(results, outputs):
            self.views[r] = _contiguous(buf)

    def schedule_cat(self, op: Any, name: str, args: list) -> None:
        """cat: one kernel copying its parts into the result, except the parts whose producers write their slice of
        the result in place (`place_cat_part`); none when every part does."""
        result = op.results[0]
        out_shape = list(result.type.shape)
        dim = _norm_dim(args[1] if len(args) > 1 else 0, len(out_shape))
        buf = self.buffer(result)
        # legacy 1-D empty inputs take no part (and when all are, `dim` may be past the [0] result's rank)
        inputs = [(self.materialized(value), list(value.type.shape)) for value in args[0]
                  if len(value.type.shape) == len(out_shape) and dim < len(out_shape)]
        parts, start, placed, index = [], sympy.Integer(0), 0, 0
        while index < len(inputs):
            view, shape = inputs[index]
            run = _chunk_run(inputs, index)  # consecutive chunks of one buffer, all of it: place the buffer
            if run > 1 and self.place_cat_part(_contiguous(view.buffer), buf, out_shape, dim, start):
                placed += 1
                start = sympy.expand(start + sum(as_dim(s[dim]) for _, s in inputs[index:index + run]))
                index += run
                continue
            if self.place_cat_part(view, buf, out_shape, dim, start):
                placed += 1
            else:
                parts.append((_load(view, shape), shape, start))
            start = sympy.expand(start + as_dim(shape[dim]))
            index += 1
        if parts or not placed:
            self.kernels.append(Kernel("cat", f"cat_{buf.name}", [name], [buf], out_shape, None,
                                       CatDetail(parts, dim)))
        self.views[result] = _contiguous(buf)

    def place_cat_part(self, view: View, cat: Buffer, out_shape: list, dim: int, start: Any) -> bool:
        """Place a cat's part in the cat's result (Buffer.inside), so the kernel that computes it writes its slice
        there and the cat copies nothing for it. Only where the target allows it, outside loop regions, and for a
        part that is the whole of a temporary of the cat's dtype, not placed yet, written by one kernel (not a
        loop) or a cat's result whose parts are all placed in it; its slice must be contiguous (every dim before
        `dim` is 1: a stack, or the channels of one image) and start on a cache line. A decoding step's stack of
        grown key and value caches copied 9 MB a step (GPT-2 small, 128 tokens)."""
        part = view.buffer
        if not self.target.places_cat_parts or self.region_depth or part.kind != "temp" or part.inside is not None \
                or part.dtype is not cat.dtype:
            return False
        whole = view.is_contiguous and same_dim(view.offset, 0) and same_dim(
            sympy.Mul(*map(as_dim, view.shape)), part.numel)
        writers = [kernel for kernel in self.kernels if any(out is part for out in kernel.outputs)]
        written = (len(writers) == 1 and writers[0].kind != "loop") or (
            not writers and any(b.inside is not None and b.inside[0] is part for b in self.buffers))
        if not (whole and written and all(same_dim(d, 1) for d in out_shape[:dim])):
            return False
        # a result sized by a data-dependent size is allocated once that is read: after the part's writer, too late
        read_at = {kernel.detail.symbol: k for k, kernel in enumerate(self.kernels) if kernel.kind == "bind"}
        if any(s in read_at and (not writers or read_at[s] > self.kernels.index(writers[0]))
               for s in cat.numel.free_symbols):
            return False
        offset = sympy.expand(start * sympy.Mul(*map(as_dim, out_shape[dim + 1:])))
        if sympy.Mod(offset * part.dtype.itemsize, 64) != 0:
            return False
        part.inside = (cat, offset)
        return True

    def schedule_pad(self, op: Any, name: str, args: list) -> None:
        """constant_pad_nd: pads are (before, after) pairs from the last dim backwards; negative pads crop."""
        result = op.results[0]
        source = self.materialized(args[0])
        rank = len(source.shape)
        before = [sympy.Integer(0)] * rank
        for pair in range(len(args[1]) // 2):
            before[rank - 1 - pair] = as_dim(args[1][2 * pair])
        # reflection / replication: positions outside the input mirror about its edges or clamp to them.
        mode = "reflect" if "reflection" in name else "replicate" if "replication" in name else "constant"
        value = fill_value(name, args[2], result.type.dtype).item() if mode == "constant" else 0
        detail = PadDetail(source, before, value, mode)
        if mode == "constant" and _pads_a_convolution(result, args[1], value):
            self.padded[result] = (name, detail)  # schedule_conv reads the source, its padding grown
            return
        self.emit_pad(result, name, detail)

    def emit_pad(self, result: Any, name: str, detail: PadDetail) -> None:
        buf = self.buffer(result)
        self.kernels.append(Kernel("pad", f"{name.split('.')[1]}_{buf.name}", [name], [buf], list(result.type.shape),
                                   None, detail))
        self.views[result] = _contiguous(buf)

    def schedule_scatter(self, op: Any, name: str, args: list) -> None:
        """A copy of `self`, then one write (or reduction step) per element of an iteration space at a target
        position that index tensors pick. Determinism: the space's `parallel` dims split the work, and distinct
        values of them always target distinct output elements (per-output ownership); each thread walks the
        other dims serially in row-major order, so duplicates combine in the interpreter's (ATen CPU's) order:
        the last write wins, sums and products accumulate in the output dtype one source element at a time."""
        result = op.results[0]
        source = self.materialized(args[0])
        shape, dtype = list(result.type.shape), result.type.dtype
        reduce, include_self, mask = "assign", True, None
        if name == "aten.index_put.default":
            reduce = "sum" if args[3] else "assign"
            values = self.materialized(args[2])
            given = [(d, value) for d, value in enumerate(args[1]) if value is not None]
            if given[0][1].type.dtype == dtypes.bool_:  # one mask: each masked element is written once
                position, mask_view = given[0][0], self.materialized(given[0][1])
                width = len(mask_view.shape)
                space, targets, parallel = shape, list(range(len(shape))), [True] * len(shape)
                mask = Load(mask_view.buffer, [sympy.Integer(0)] * position + list(mask_view.strides)
                            + [sympy.Integer(0)] * (len(shape) - position - width), mask_view.offset)
                indexed = shape[:position] + [1] + shape[position + width:]  # the count: values broadcast along it
                strides = _load(values, indexed).strides
                value = Load(values.buffer, strides[:position] + [sympy.Integer(0)] * width + strides[position + 1:],
                             values.offset)
            else:
                broadcast = _broadcast([list(v.type.shape) for _, v in given])
                dims = [d for d, _ in given]
                start = dims[0] if dims == list(range(dims[0], dims[-1] + 1)) else 0
                kept = [shape[d] for d in range(len(shape)) if d not in dims]
                space = kept[:start] + broadcast + kept[start:]
                start, width, indexed, rest = _advanced(args[1], len(shape), len(space))
                targets: list = [None] * len(shape)
                for k, d in rest:
                    targets[d] = k
                for d, v in indexed:
                    targets[d] = ScatterIndex(_index_load(self.materialized(v), space, start, width), shape[d], d,
                                              wrap=True)
                parallel = [not start <= k < start + width for k in range(len(space))]
                value = _load(values, space)
        else:  # a 0-d self, index or src acts as a 1-element 1-d one (ATen's ensure_nonempty)
            shape, source = shape or [1], _at_least_1d(source)
            dim = _norm_dim(args[1], len(shape))
            index = _at_least_1d(self.materialized(args[2]))
            space = list(index.shape)
            targets = list(range(len(shape)))
            targets[dim] = ScatterIndex(Load(index.buffer, list(index.strides), index.offset), shape[dim], dim,
                                        wrap=False)
            parallel = [k != dim for k in range(len(space))]
            if name == "aten.scatter.value":
                value = Constant(fill_value(name, args[3], dtype).item(), dtype)
            else:
                src = _at_least_1d(self.materialized(args[3]))
                value = Load(src.buffer, list(src.strides), src.offset)
            if name == "aten.scatter_add.default":
                reduce = "sum"
            elif name == "aten.scatter_reduce.two":
                reduce = {"max": "amax", "min": "amin"}.get(args[4], args[4])
                include_self = bool(args[5])
        buf = self.buffer(result)
        identity = None if include_self or reduce == "assign" else _scatter_identity(reduce, dtype)
        detail = ScatterDetail(_load(source, shape), space, parallel, targets, value, mask, reduce, include_self,
                               identity)
        self.kernels.append(Kernel("scatter", f"{name.split('.')[1]}_{buf.name}", [name], [buf], shape, None, detail))
        self.views[result] = _contiguous(buf)

    def schedule_distance(self, op: Any, name: str, args: list) -> None:
        """_cdist_forward: x1 [..., R1, C] against x2 [..., R2, C] (batch dims broadcast); _pdist_forward: the rows
        of x [N, C] pairwise, i < j in row-major order. Each side is a Load over [..., rows, C]."""
        result = op.results[0]
        shape = list(result.type.shape)
        x1 = self.materialized(args[0])
        if name == "aten._pdist_forward.default":
            sides, p, mode = [_load(x1, x1.shape)], args[1], None
        else:
            x2 = self.materialized(args[1])
            batch = shape[:-2]
            sides = [_load(x1, [*batch, *x1.shape[-2:]]), _load(x2, [*batch, *x2.shape[-2:]])]
            p, mode = args[2], args[3]
        buf = self.buffer(result)
        detail = DistanceDetail(sides, rows=[x1.shape[-2], (x2 if len(sides) == 2 else x1).shape[-2]],
                                columns=x1.shape[-1], p=float(p), compute_mode=mode)
        self.kernels.append(Kernel("distance", f"{name.split('.')[1].lstrip('_')}_{buf.name}", [name], [buf],
                                   shape, None, detail))
        self.views[result] = _contiguous(buf)

    def schedule_bags(self, op: Any, name: str, args: list) -> None:
        """_embedding_bag: outputs (output, offset2bag, bag_size, max_indices) as the registry's kernel defines them;
        offset2bag is empty where its meta rule says ATen's fused float sum skips it."""
        outputs = [self.buffer(r) for r in op.results]
        psw = args[6]
        detail = BagsDetail(weight=self.materialized(args[0]), indices=self.materialized(args[1]),
                            offsets=self.materialized(args[2]), mode=args[4],
                            per_sample_weights=self.materialized(psw) if psw is not None else None,
                            include_last_offset=bool(args[7]), padding_idx=args[8])
        self.kernels.append(Kernel("bags", f"embedding_bag_{outputs[0].name}", [name], outputs,
                                   list(op.results[0].type.shape), None, detail))
        for r, buf in zip(op.results, outputs):
            self.views[r] = _contiguous(buf)

    def schedule_view(self, op: Any, name: str, args: list) -> None:
        # A convolution's epilogue writes in the conv's own (N, C, spatial) tile order, so its pending value is
        # written out before a reshape (flatten before a linear layer): fused through one, it indexed wrong elements.
        if (name in ("aten.view.default", "aten._unsafe_view.default") and args[0] in self.pending
                and self.fusable_into_consumer(op.results[0], self.pending[args[0]][0])
                and getattr(self.pending[args[0]][1], "kind", None) != "conv"):
            # A reshape of a pending (unwritten) value: its consumers fuse in, indexed in the producer's shape.
            self.pending[op.results[0]] = self.pending.pop(args[0])
            return
        source = self.materialized(args[0])
        results = list(op.results)
        rank = len(source.shape)
        if name == "aten.split_with_sizes.default":
            dim, start = _norm_dim(args[2], rank), sympy.Integer(0)
            for value, size in zip(results, args[1]):
                offset = sympy.expand(source.offset + start * source.strides[dim])
                shape = list(source.shape)
                shape[dim] = value.type.shape[dim]
                self.views[value] = View(source.buffer, shape, list(source.strides), offset)
                start = sympy.expand(start + as_dim(size))
            return
        out_shape = list(results[0].type.shape)
        strides, offset = list(source.strides), source.offset
        if name in ("aten.view.default", "aten._unsafe_view.default"):
            strides = None if source.is_contiguous else _view_strides(source, out_shape)
            if strides is None:  # only a copy lays the elements out in the order the new shape reads them
                if not source.is_contiguous:
                    source = _contiguous(self.copy(source, args[0]))
                strides = contiguous_strides(out_shape)
            offset = source.offset
        elif name == "aten.permute.default":
            dims = [_norm_dim(d, rank) for d in args[1]]
            strides = [source.strides[d] for d in dims]
        elif name == "aten.expand.default":
            lead = len(out_shape) - rank
            strides = [sympy.Integer(0)] * lead + [
                sympy.Integer(0) if same_dim(d, 1) and not same_dim(o, 1) else s
                for d, s, o in zip(source.shape, source.strides, out_shape[lead:])]
        elif name == "aten.unsqueeze.default":
            dim = _norm_dim(args[1], rank + 1)
            strides.insert(dim, sympy.Integer(0))
        elif name in ("aten.squeeze.dim", "aten.squeeze.dims"):
            dims = [args[1]] if name == "aten.squeeze.dim" else list(args[1])
            drop = {_norm_dim(d, rank) for d in dims if rank and same_dim(source.shape[_norm_dim(d, rank)], 1)}
            strides = [s for i, s in enumerate(strides) if i not in drop]
        elif name == "aten.slice.Tensor":
            dim = _norm_dim(args[1], rank)
            # ATen's arithmetic: a negative start wraps, then clamps into [0, size]; over a symbolic size that is
            # a Max/Min the generated code evaluates (-3 + s0 read before the buffer when s0 was 1)
            start, _, _ = slice_bounds(name, source.shape[dim], args[2], args[3], args[4])
            offset = sympy.expand(offset + as_dim(start) * strides[dim])
            strides[dim] = sympy.expand(strides[dim] * args[4])
        elif name == "aten.flip.default":  # negative strides: start at the last element of each flipped dim
            for dim in {_norm_dim(d, rank) for d in args[1]} if rank else ():  # a 0-d flip is the identity
                offset = sympy.expand(offset + (as_dim(source.shape[dim]) - 1) * strides[dim])
                strides[dim] = sympy.expand(-strides[dim])
        elif name == "aten.diagonal.default":  # the diagonal dim goes last; offset moves the start
            shift, d1, d2 = args[1], _norm_dim(args[2], rank), _norm_dim(args[3], rank)
            offset = sympy.expand(offset + (shift * strides[d2] if shift >= 0 else -shift * strides[d1]))
            diagonal = sympy.expand(strides[d1] + strides[d2])
            strides = [s for k, s in enumerate(strides) if k not in (d1, d2)] + [diagonal]
        elif name == "aten.as_strided.default":  # strides into the source's contiguous storage (copied if need be)
            if not source.is_contiguous:
                source = _contiguous(self.copy(source, args[0]))
            strides = [as_dim(s) for s in args[2]]
            offset = sympy.expand(source.offset + as_dim(args[3] or 0))
        elif name == "aten.select.int":
            dim = _norm_dim(args[1], rank)
            index = args[2]
            if isinstance(index, int) and index < 0:
                index = index + source.shape[dim]
            offset = sympy.expand(offset + as_dim(index) * strides[dim])
            del strides[dim]
        self.views[results[0]] = View(source.buffer, out_shape, strides, offset)

    def schedule_matmul(self, op: Any, name: str, args: list) -> None:
        result = op.results[0]
        out_shape = list(result.type.shape)
        bias, beta, alpha = None, 1, 1
        if name == "aten.addmm.default":
            bias = _load(self.materialized(args[0]), out_shape)
            a, b = args[1], args[2]
            beta, alpha = args[3], args[4]
        else:
            a, b = args[0], args[1]
        gathered, detail = self.batch_gathers.get(a), None
        va = self.materialized(a) if gathered is None else None
        vb = self.materialized(b)
        if gathered is not None:  # A's matrices by index (_batch_gather), for a target's matrix-vector kernel
            table = gathered.table
            trial = MatmulDetail((table.buffer, [sympy.Integer(0), *table.strides[1:]], table.offset),
                                 (vb.buffer, list(vb.strides), vb.offset), a.type.shape[-1], bias, beta, alpha,
                                 gathered)
            if matrix_vector(out_shape, trial, result.type.dtype):
                del self.batch_gathers[a]
                detail = trial
        if detail is None:
            va = self.materialized(a) if va is None else va
            if len(out_shape) == 2:  # a batch of one
                a_operand, b_operand = ((v.buffer, [0, v.strides[0], v.strides[1]], v.offset) for v in (va, vb))
            else:
                a_operand, b_operand = ((v.buffer, list(v.strides), v.offset) for v in (va, vb))
            detail = MatmulDetail(a_operand, b_operand, va.shape[-1], bias, beta, alpha)
        kernel = Kernel("matmul", name.split(".")[1], [name], [], out_shape, None, detail)
        if self.fusable_into_consumer(result):
            self.pending[result] = (Accumulator(result.type.dtype), kernel, out_shape)
        else:
            self.emit_pointwise(result, Accumulator(result.type.dtype), kernel)

    def schedule_qlinear(self, op: Any, name: str, args: list) -> None:
        """quant.qlinear_pointwise: the activations as contiguous [M, K] rows, the int8 weight [N, K] (packed when
        the model is created), its scales and bias per output column, the activation and output qparams."""
        (x, x_scale, x_zero_point, weight, weight_scale, bias, output_scale, output_zero_point, quant_min, quant_max,
         output_dtype, post_op) = args
        result = op.results[0]
        rows, weights = self.contiguous_operand(x), self.contiguous_operand(weight)
        # per token: one scale and zero point per row, read as contiguous [M] vectors
        per_token = op.opdef.name == "quant.qlinear_pointwise.token"
        qparam = self.contiguous_operand if per_token else self.scalar_operand
        detail = QLinearDetail(
            x=rows, weight=weights, weight_scale=self.materialized(weight_scale),
            bias=self.materialized(bias) if bias is not None else None, x_scale=qparam(x_scale),
            x_zero_point=qparam(x_zero_point), output_scale=output_scale, output_zero_point=output_zero_point,
            quant_min=quant_min, quant_max=quant_max, post_op=post_op, m=sympy.Mul(*map(as_dim, x.type.shape[:-1])),
            k=as_dim(x.type.shape[-1]), n=as_dim(weight.type.shape[0]), signed=x.type.dtype is dtypes.int8,
            narrow=_narrow(x), per_token=per_token)
        buf = self.buffer(result)
        self.kernels.append(Kernel("qlinear", f"qlinear_{buf.name}", [name], [buf], list(result.type.shape), None,
                                   detail))
        self.views[result] = _contiguous(buf)

    def schedule_wlinear(self, op: Any, name: str, args: list) -> None:
        """quant.linear_weight_only: float rows [M, K], the int8 weight with its scales and zero points (packed
        together when the model is created: they must be constants), the bias."""
        x, weight, scales, zero_points, bias, group_size, quant_min, quant_max = args
        result = op.results[0]
        detail = WLinearDetail(
            x=self.contiguous_operand(x), weight=self.contiguous_operand(weight),
            scales=self.contiguous_operand(scales),
            zero_points=self.contiguous_operand(zero_points) if zero_points is not None else None,
            bias=self.materialized(bias) if bias is not None else None, group_size=group_size,
            bits=4 if quant_min >= -8 and quant_max <= 7 else 8,
            m=sympy.Mul(*map(as_dim, x.type.shape[:-1])), k=as_dim(x.type.shape[-1]), n=as_dim(weight.type.shape[0]))
        buf = self.buffer(result)
        self.kernels.append(Kernel("wlinear", f"wlinear_{buf.name}", [name], [buf], list(result.type.shape), None,
                                   detail))
        self.views[result] = _contiguous(buf)

    def schedule_sparse_linear(self, op: Any, name: str, args: list) -> None:
        """linear with a sparse (CSR, BSR, 2:4) weight: the kernel first transposes the activations to xT [K, M], so
        each stored weight scales a contiguous run of rows (not 2:4 where the target reads the rows as they are);
        bias and the consumers' pointwise ops fuse as into a GEMM."""
        x, weight, bias = args
        result = op.results[0]
        out_shape = list(result.type.shape)
        rows = self.contiguous_operand(x)
        m, k = sympy.Mul(*map(as_dim, x.type.shape[:-1])), as_dim(x.type.shape[-1])
        layout = weight.type.layout
        transposed = None
        if layout.kind != "semi_structured" or self.target.transposes_24_activations:
            # written by the kernel's first pass: rows padded to a multiple of 16 columns (zeros), for whole vectors
            transposed = self.buffer(None, shape=[k, -16 * sympy.floor(-m / 16)], dtype=x.type.dtype)
            transposed.name = f"{self.names[x]}_transposed"
        detail = SparseLinearDetail(
            x=rows, xT=transposed, m=m, k=k, n=as_dim(weight.type.shape[0]), layout=layout.kind,
            block=layout.blocksize or (1, 1), components=self.sparse_weights[weight],
            bias=_load(self.materialized(bias), out_shape) if bias is not None else None)
        kernel = Kernel("sparse_linear", "sparse_linear", [name], [], out_shape, None, detail)
        if self.fusable_into_consumer(result):
            self.pending[result] = (Accumulator(result.type.dtype), kernel, out_shape)
        else:
            self.emit_pointwise(result, Accumulator(result.type.dtype), kernel)

    def schedule_sparse_conv(self, op: Any, name: str, args: list) -> None:
        """convolution with a hybrid BSR (or CSR: 1 x 1 blocks) weight [C_out, C_in, *taps], taps dense: BSR over
        the im2col matrix [C_out, C_in * taps]. Units pack im2col panels as the dense implicit GEMM does; bias and the
        consumers' pointwise ops fuse."""
        result = op.results[0]
        out_shape = list(result.type.shape)
        n = len(out_shape) - 2
        weight = args[1]
        layout = weight.type.layout
        detail = SparseConvDetail(
            input=self.materialized(args[0]), weight_shape=list(weight.type.shape),
            components=self.sparse_weights[weight], layout=layout.kind, block=layout.blocksize or (1, 1),
            bias=self.materialized(args[2]) if args[2] is not None else None,
            stride=_per_dim(args[3], n), padding=_per_dim(args[4], n), dilation=_per_dim(args[5], n), groups=1)
        kernel = Kernel("sparse_conv", "sparse_conv", [name], [], out_shape, None, detail)
        if self.fusable_into_consumer(result):
            self.pending[result] = (Accumulator(result.type.dtype), kernel, out_shape)
        else:
            self.emit_pointwise(result, Accumulator(result.type.dtype), kernel)

    def schedule_loop(self, op: Any) -> None:
        """kiln.scan / kiln.map: one `loop` kernel. Its body's ops schedule into body kernels; each step the loop
        points the body's windows at the step's slices and carry slots (see Carry, Window)."""
        init = list(op.init) if isinstance(op, ScanOp) else []
        xs, operands, block = list(op.xs), list(op.operands_), op.body.block
        args = list(block.args)
        carry_args, slice_args = args[:len(init)], args[len(init):len(init) + len(xs)]
        carry_starts = [self.contiguous_operand(value) for value in init]
        slices = [Window(self.window(arg), view.buffer, view.offset)
                  for arg, view in zip(slice_args, map(self.contiguous_operand, xs))]
        for arg, operand in zip(args[len(init) + len(xs):], operands):
            self.views[arg] = self.materialized(operand)
        reads = [self.window(arg) for arg in carry_args]
        first_body_buffer = len(self.buffers)
        yielded = list(block.last_op.operands)
        body: list[Kernel] = []
        with self.collecting(body):
            if not (isinstance(op, ScanOp) and self.schedule_lstm_cell(op)):
                self.schedule_region(block)
            claimed: set = set()
            stacked = []
            for value, result in zip(yielded[len(init):], op.results[len(init):]):
                stacked.append(Window(self.into_window(value, first_body_buffer, claimed), self.buffer(result)))
                self.views[result] = _contiguous(stacked[-1].source)
            # A carry that is also a per-step output (an RNN's hidden state) lives in the stacked output: each step
            # reads the previous step's slice, with no slots and no copy.
            shared = [next((w for v, w in zip(yielded[len(init):], stacked) if v is value), None)
                      for value in yielded[:len(init)]]
            writes = [w.window if w is not None else self.into_window(value, first_body_buffer, claimed)
                      for value, w in zip(yielded[:len(init)], shared)]
        carries = [self.carry(*parts) for parts in zip(carry_starts, reads, writes, op.results, shared)]
        outputs = [c.final for c in carries] + [w.source for w in stacked]
        name = self.names[op.results[0]] if op.results else "loop"
        self.kernels.append(Kernel("loop", f"{op.name.split('.')[1]}_{name}", [op.name], outputs,
                                   [xs[0].type.shape[0]], None,
                                   LoopDetail(body, carries, slices, stacked)))

    def schedule_lstm_cell(self, op: ScanOp) -> bool:
        """A scan whose body is exactly torch's LSTM cell (kiln/codegen/recurrent.py), where the target fuses it:
        the body becomes one `lstm_cell` kernel (its float32 weight constant, its step values contiguous); returns
        whether it did."""
        found = match_cell(op)
        if found is None or found.cell.onnx_op != "LSTM" or not self.target.fuses_lstm_cell(found.w_hh.type.shape[-1]):
            return False
        h, c, x = (self.views[found.bound[name]] for name in ("$h", "$c", "$x"))
        weight = self.materialized(found.bound["$w_hh"])
        bias = self.materialized(found.bound["$b_hh"]) if found.bound["$b_hh"] is not None else None
        views = [view for view in (h, c, x, weight, bias) if view is not None]
        static = [*weight.shape, weight.offset]
        if (weight.buffer.kind != "weight" or not all(sympy.sympify(d).is_Integer for d in static)
                or not all(view.is_contiguous and view.buffer.dtype == dtypes.float32 for view in views)):
            return False  # (the weight is packed at compile time)
        h_next, c_next = found.yielded[0], found.yielded[1]
        outputs = [self.buffer(h_next), self.buffer(c_next)]
        for value, buf in zip((h_next, c_next), outputs):
            self.views[value] = _contiguous(buf)
        detail = LstmCellDetail(h, c, x, weight, bias, h.shape[0], int(weight.shape[1]))
        self.kernels.append(Kernel("lstm_cell", f"lstm_cell_{outputs[0].name}", LSTM_CELL_OPS, outputs,
                                   list(x.shape), None, detail))
        return True

    def schedule_while(self, op: Any) -> None:
        """kiln.while_loop: a `loop` kernel with no trip count. Each iteration runs the cond region's kernels, stops
        when the predicate they compute is false, else runs the body's; the carried values alternate between two
        slots, and the last ones read are copied into the results (see Carry)."""
        carried, operands = list(op.carried), list(op.operands_)
        starts = [self.contiguous_operand(value) for value in carried]
        for region in (op.cond_region, op.body):
            for arg, operand in zip(list(region.block.args)[len(carried):], operands):
                self.views[arg] = self.materialized(operand)
        reads = [self.window(arg) for arg in list(op.body.block.args)[:len(carried)]]
        for arg, read in zip(op.cond_region.block.args, reads):
            self.views[arg] = _contiguous(read)
        first_body_buffer = len(self.buffers)
        cond: list[Kernel] = []
        body: list[Kernel] = []
        with self.collecting(cond):
            self.schedule_region(op.cond_region.block)
            predicate_view = self.materialized(op.cond_region.block.last_op.operands[0])
        with self.collecting(body):
            self.schedule_region(op.body.block)
            claimed: set = set()
            writes = [self.into_window(value, first_body_buffer, claimed) for value in op.body.block.last_op.operands]
        carries = [self.carry(*parts) for parts in zip(starts, reads, writes, op.results)]
        name = self.names[op.results[0]] if op.results else "loop"
        self.kernels.append(Kernel("loop", f"while_loop_{name}", [op.name], [c.final for c in carries], [None], None,
                                   LoopDetail(body, carries, slices=[], stacked=[], cond=cond,
                                              predicate=predicate_view)))

    @contextmanager
    def collecting(self, kernels: list[Kernel]) -> Iterator[None]:
        """Kernels scheduled inside go to `kernels` (a loop's cond or body) instead of the enclosing list."""
        outer, self.kernels = self.kernels, kernels
        self.region_depth += 1
        try:
            yield
        finally:
            self.kernels = outer
            self.region_depth -= 1

    def schedule_region(self, block: Any) -> None:
        for region_op in list(block.ops)[:-1]:  # all but the yield, whose values the loop places itself
            self.schedule_op(region_op)

    def carry(self, start: View, read: Buffer, write: Buffer, result: Any, stacked: Window | None = None) -> Carry:
        """A loop's carried value: two slots unless it lives in a stacked output; its result's buffer."""
        slots = [] if stacked is not None else [self.buffer(None, shape=list(read.shape), dtype=read.dtype)
                                                for _ in range(2)]
        for number, slot in enumerate(slots):
            slot.name = f"{read.name}_slot{number}"
        carry = Carry(start, read, write, slots, self.buffer(result), stacked)
        self.views[result] = _contiguous(carry.final)
        return carry

    def window(self, value: Any) -> Buffer:
        buf = self.buffer(value, "window")
        self.views[value] = _contiguous(buf)
        return buf

    def into_window(self, value: Any, first_body_buffer: int, claimed: set) -> Buffer:
        """The window a loop body writes `value` through: the buffer the body computed it into, when that is
        the body's own whole contiguous temporary, else a copy of it."""
        view = self.materialized(value)
        buf = view.buffer
        if not (buf.index >= first_body_buffer and buf.kind == "temp" and buf.inside is None and buf not in claimed
                and view.is_contiguous and same_dim(view.offset, 0)
                and same_dim(sympy.Mul(*map(as_dim, view.shape)), buf.numel)):
            buf = self.copy(view, value)
        buf.kind = "window"
        claimed.add(buf)
        return buf

    def scalar_operand(self, value: Any) -> Any:
        """A number, or the .tensor overloads' one-element qparams: a read of their buffer."""
        return _load(self.materialized(value), []) if _is_tensor(value) else value

    def contiguous_operand(self, value: Any) -> View:
        view = self.materialized(value)
        return view if view.is_contiguous else _contiguous(self.copy(view, value))

    def schedule_qpool(self, op: Any, name: str, args: list) -> None:
        """quant.qadaptive_avg_pool2d: contiguous NCHW integers, the input's and output's qparams."""
        x, x_scale, x_zero_point, _, output_scale, output_zero_point, quant_min, quant_max, _ = args
        result = op.results[0]
        detail = QPoolDetail(self.contiguous_operand(x), x_scale, x_zero_point, output_scale, output_zero_point,
                             quant_min, quant_max)
        buf = self.buffer(result)
        self.kernels.append(Kernel("qpool", f"qpool_{buf.name}", [name], [buf], list(result.type.shape), None,
                                   detail))
        self.views[result] = _contiguous(buf)

    def schedule_qconv(self, op: Any, name: str, args: list) -> None:
        """quant.qconv2d_pointwise: contiguous NCHW activations and [C_out, C / groups, kH, kW] weights (packed
        per group when the model is created), an optional float residual of the output's shape."""
        (x, x_scale, x_zero_point, weight, weight_scale, bias, stride, padding, dilation, groups, other,
         output_scale, output_zero_point, quant_min, quant_max, output_dtype, post_op) = args
        result = op.results[0]
        detail = QConvDetail(
            x=self.contiguous_operand(x), weight=self.contiguous_operand(weight),
            weight_scale=self.materialized(weight_scale), bias=self.materialized(bias) if bias is not None else None,
            other=self.contiguous_operand(other) if other is not None else None,
            x_scale=self.scalar_operand(x_scale), x_zero_point=self.scalar_operand(x_zero_point),
            stride=_per_dim(stride, 2), padding=_per_dim(padding, 2), dilation=_per_dim(dilation, 2), groups=groups,
            output_scale=output_scale, output_zero_point=output_zero_point, quant_min=quant_min,
            quant_max=quant_max, post_op=post_op, signed=x.type.dtype is dtypes.int8, narrow=_narrow(x),
            k=sympy.Mul(*map(as_dim, weight.type.shape[1:])))
        buf = self.buffer(result)
        self.kernels.append(Kernel("qconv", f"qconv_{buf.name}", [name], [buf], list(result.type.shape), None,
                                   detail))
        self.views[result] = _contiguous(buf)

    def row_users_left(self, value: Any) -> int:
        """Row kernels still to be scheduled that read `value` (a producer they each recompute)."""
        self.row_reads[value] = self.row_reads.get(value, len(list(value.uses))) - 1
        return self.row_reads[value]

    def schedule_rows(self, op: Any, name: str, args: list) -> None:
        pending = self.pending.get(args[0])
        input_expr = None
        shape = list(args[0].type.shape)
        reduced = _reduced_dims(name, args, len(shape)) if name in REDUCTION_OPS else None
        one_row_dim = reduced is None or len([d for d in reduced if not same_dim(shape[d], 1)]) == 1
        if (pending is not None and pending[1] is None and _same_shape(pending[2], args[0].type.shape)
                and name != "aten.native_group_norm.default"
                and _cheap_to_recompute(pending[0]) and one_row_dim):
            # A cheap pointwise producer (scale, mask, bias) fuses in: the row kernel evaluates it per element,
            # once per pass over the row, instead of reading a materialized tensor.
            input_expr = pending[0]
            if self.row_users_left(args[0]) == 0:
                del self.pending[args[0]]
            source = _contiguous(Buffer(-1, "fused", args[0].type.dtype, list(args[0].type.shape)))
        else:
            source = self.materialized(args[0])
        outputs = [self.buffer(r) for r in op.results]
        rank = len(source.shape)
        if name in ("aten._softmax.default", "aten._log_softmax.default", "aten.cumsum.default"):
            dim = _norm_dim(args[1], rank)
        elif name in SORT_OPS:
            dim = _norm_dim(args[1] if name == "aten.sort.default" else args[2], rank)
        elif name == "aten.native_layer_norm.default":
            dim = rank - 1
        elif name == "aten.native_group_norm.default":
            # One row per (n, group): its C/G channels' HxW elements, contiguous in a contiguous input.
            if not source.is_contiguous:
                source = _contiguous(self.copy(source, args[0]))
            group, per_group = args[6], as_dim(shape[1]) // args[6]
            hxw = sympy.expand(sympy.Mul(*[as_dim(d) for d in shape[2:]]))
            length = sympy.expand(per_group * hxw)
            source = View(source.buffer, [shape[0], group, length], [sympy.expand(group * length), length, 1],
                          source.offset)
            dim = 2
        elif input_expr is not None:
            dim = next(d for d in reduced if not same_dim(shape[d], 1))
        else:
            merged = _row_view(source, reduced)
            if merged is None:  # the reduced dims do not form one strided run: copy them last, contiguously
                order = [k for k in range(rank) if k not in reduced] + reduced
                permuted = View(source.buffer, [source.shape[k] for k in order], [source.strides[k] for k in order],
                                source.offset)
                source = _contiguous(self.copy(permuted, args[0]))
                merged = _row_view(source, list(range(rank - len(reduced), rank)))
            source, dim = merged
        detail = RowsDetail(source, dim, input_dtype=op.operands[0].type.dtype)
        if name == "aten.var.correction":
            detail.constants = {"CORR": 1.0 if args[2] is None else float(args[2])}
        if name == "aten.var.dim":  # unbiased: correction 1, else 0
            detail.constants = {"CORR": 0.0 if args[2] is False else 1.0}
        if name in SORT_OPS:  # topk(sorted=False) is sorted too, as the interpreter's kernel returns it
            detail.descending = bool(args[2] if name == "aten.sort.default" else args[3])
        if input_expr is not None:
            detail.input, detail.input_expr, detail.input_shape = None, input_expr, list(source.shape)
        if name == "aten.native_group_norm.default":
            detail.weight = self.materialized(args[1]) if args[1] is not None else None
            detail.bias = self.materialized(args[2]) if args[2] is not None else None
            detail.eps, detail.per_group, detail.hxw = args[7], per_group, hxw
        if name == "aten.native_layer_norm.default":
            detail.weight = self.materialized(args[2]) if args[2] is not None else None
            detail.bias = self.materialized(args[3]) if args[3] is not None else None
            detail.eps = args[4]
        fused = expression_ops(input_expr) if input_expr is not None else []
        self.kernels.append(Kernel("rows", f"{name.split('.')[1].lstrip('_')}_{outputs[0].name}", [*fused, name],
                                   outputs, list(source.shape), None, detail))
        for r, buf in zip(op.results, outputs):
            self.views[r] = _contiguous(buf)


def expression_ops(expr: Any) -> list[str]:
    """The aten ops an expression tree implements, in evaluation order."""
    if isinstance(expr, Apply):
        inner = [o for a in expr.args for o in expression_ops(a)]
        return inner + [expr.op]
    if isinstance(expr, Gather):
        indices = expr.index if isinstance(expr.index, list) else [expr.index]
        return [o for index in indices for o in expression_ops(index)] + [expr.op]
    if isinstance(expr, Iota):
        return ["aten.arange.start_step"]
    if isinstance(expr, Tile):
        return [expr.op]
    if isinstance(expr, Constant):
        return [expr.op]
    return []


def _activation_of(value: Any, longest: int = 8) -> Any:
    """The op that ends `value`'s activation x * f(x) (SiLU's x * sigmoid(x), hardswish, mish, x * x): one user of
    `value` that every other use reaches through a chain of single-use ops (at most `longest`), all of them
    same-shape pointwise ops reading nothing but `value`, each other and numbers. Then every use fuses into that
    op's expression, which reads `value` as often as it is used. None when the uses are anything else."""
    shape = value.type.shape
    users = list(dict.fromkeys(use.operation for use in value.uses))
    if not all(_op_name(op) in POINTWISE_OPS and len(op.results) == 1 for op in users):
        return None  # returned, or read by a reduction, a GEMM, a view ...

    def pointwise_of_value(op: Any, chain: set) -> bool:
        result = op.results[0].type if len(op.results) == 1 else None
        return (_op_name(op) in POINTWISE_OPS and result is not None and len(result.shape) == len(shape)
                and all(map(same_dim, result.shape, shape))
                and all(a is value or a.owner in chain or not a.type.shape for a in op.operands if _is_tensor(a)))

    for end in users:
        chain = {end}
        for start in users:
            op = start
            for _ in range(longest if start is not end else 0):
                chain.add(op)
                following = list(op.results[0].uses) if len(op.results) == 1 else []
                if len(following) != 1:
                    break
                op = following[0].operation
                if op is end:
                    break
            if op is not end:
                break
        else:
            if all(pointwise_of_value(op, chain) for op in chain):
                return end
    return None


# Producers recomputed inside a row kernel (2-3 passes per row) must be cheap: no transcendental calls.
EXPENSIVE_OPS = {"aten.exp.default", "aten.log.default", "aten.tanh.default", "aten.sigmoid.default",
                 "aten.erf.default", "aten.gelu.default", "aten.sqrt.default", "aten.rsqrt.default"}


def _cheap_to_recompute(expr: Any) -> bool:
    ops = expression_ops(expr)
    gathers = {"aten.embedding.default", "aten.repeat.default"} | INDEX_OPS
    return len(ops) <= 6 and not EXPENSIVE_OPS.intersection(ops) and not gathers.intersection(ops)


def _reduced_dims(name: str, args: list, rank: int) -> list[int]:
    """The dims a reduction reduces, canonical and sorted: None or (except for any.dims) [] means all of them."""
    dims = None if name in ("aten.mean.default", "aten.any.default", "aten.prod.default") else args[1]
    if isinstance(dims, int):
        dims = [dims]
    if dims is None or (len(dims) == 0 and name != "aten.any.dims"):
        return list(range(rank))
    return sorted({_norm_dim(d, rank) for d in dims}) if rank else []


def _row_view(view: View, dims: list[int]) -> tuple[View, int] | None:
    """`view` with the reduced `dims` merged into one row dim (and that dim's position), or None when their
    strides do not form one run. Size-1 dims stay as (trivial) outer dims; no dim to reduce gives a row of one."""
    dims = [d for d in dims if not same_dim(view.shape[d], 1)]
    if not dims:
        return View(view.buffer, [*view.shape, 1], [*view.strides, sympy.Integer(0)], view.offset), len(view.shape)
    for a, b in zip(dims, dims[1:]):
        if not same_dim(view.strides[a], sympy.expand(view.strides[b] * as_dim(view.shape[b]))):
            return None
    shape, strides = [], []
    for k, (size, stride) in enumerate(zip(view.shape, view.strides)):
        if k == dims[0]:
            shape.append(sympy.expand(sympy.Mul(*[as_dim(view.shape[d]) for d in dims])))
            strides.append(view.strides[dims[-1]])
        elif k not in dims:
            shape.append(size)
            strides.append(stride)
    return View(view.buffer, shape, strides, view.offset), dims[0]


def _same_shape(a: list, b: list) -> bool:
    return len(a) == len(b) and all(map(same_dim, a, b))


def _divides(a: Any, b: Any) -> bool:
    """`a` divides `b` with a quotient other than 1 (sizes: positive integers or their products)."""
    quotient = sympy.cancel(as_dim(b) / as_dim(a))
    return quotient != 1 and sympy.fraction(quotient)[1] == 1


def _view_strides(source: View, shape: list) -> list | None:
    """Strides that read `source`'s elements in row-major order as `shape`, without a copy: where every run of dims
    the reshape merges or splits lies evenly in memory (torch's rule for `view`: a transposed KV cache viewed without
    its batch dim of 1 stays a view). None when only a copy gives that order."""
    if any(same_dim(d, 0) for d in source.shape):
        return None
    groups = _reshape_groups(shape, list(source.shape))
    if groups is None:
        return None
    strides: list = []
    for out_dims, in_dims in groups:
        used = [(as_dim(source.shape[k]), source.strides[k]) for k in in_dims if not same_dim(source.shape[k], 1)]
        if any(not same_dim(outer, inner * size) for (_, outer), (size, inner) in zip(used, used[1:])):
            return None  # the group's elements are not one evenly strided run
        running, group = (as_dim(used[-1][1]) if used else sympy.Integer(1)), []
        for k in reversed(out_dims):
            group.insert(0, running)
            running = sympy.expand(running * as_dim(shape[k]))
        strides += group
    return strides


def _reshape_groups(a: list, b: list) -> list[tuple[list[int], list[int]]] | None:
    """Pair up runs of dims of shapes `a` and `b` with equal products (how a reshape maps one onto the other)."""
    groups, i, j = [], 0, 0
    while i < len(a) or j < len(b):
        ga, gb, pa, pb = [], [], sympy.Integer(1), sympy.Integer(1)
        if i < len(a):
            ga, pa, i = [i], as_dim(a[i]), i + 1
        if j < len(b):
            gb, pb, j = [j], as_dim(b[j]), j + 1
        while not same_dim(pa, pb):
            if _divides(pa, pb) and i < len(a):
                ga, pa, i = ga + [i], pa * as_dim(a[i]), i + 1
            elif _divides(pb, pa) and j < len(b):
                gb, pb, j = gb + [j], pb * as_dim(b[j]), j + 1
            else:
                return None
        groups.append((ga, gb))
    return groups


def _respace(expr: Any, shape: list, space: list) -> Any:
    """`expr`, indexed over `shape`, re-indexed over `space` (a reshape of it with the same flat order), or None
    when some load's strides cannot be written per dim of `space`."""
    if _same_shape(shape, space):
        return expr
    groups = _reshape_groups(space, shape)
    if groups is None:
        return None

    def convert(node: Any) -> Any:
        if isinstance(node, Constant):
            return node
        if isinstance(node, Apply):
            args = [convert(arg) if isinstance(arg, (Load, Apply, Constant, Accumulator, Gather, Iota, Tile)) else arg
                    for arg in node.args]
            return None if any(a is None for a in args) else dataclasses.replace(node, args=args)
        if not isinstance(node, Load):
            return None  # accumulators, gathers and iotas are tied to their own index space
        strides: list = []
        for space_dims, shape_dims in groups:
            used = [(shape[k], node.strides[k]) for k in shape_dims if not same_dim(shape[k], 1)]
            if all(same_dim(stride, 0) for _, stride in used):
                strides += [sympy.Integer(0)] * len(space_dims)
                continue
            if any(not same_dim(outer, inner * as_dim(size)) for (_, outer), (size, inner) in zip(used, used[1:])):
                return None  # not one contiguous run within the group
            running, group = as_dim(used[-1][1]), []
            for k in reversed(space_dims):
                group.insert(0, running)
                running = sympy.expand(running * as_dim(space[k]))
            strides += group
        return Load(node.buffer, strides, node.offset)

    return convert(expr)


def _op_name(op: Any) -> str:
    return getattr(getattr(op, "opdef", None), "name", "")


def _scatter_identity(reduce: str, dtype: dtypes.DType) -> bool | int | float:
    """What a targeted element starts from when scatter_reduce excludes self: ATen's identity of the reduction, in
    the dtype's own range (the lowest int8 for an int8 amax, not a wider type's cast down)."""
    if reduce in ("sum", "mean", "prod"):
        return 1 if reduce == "prod" else 0
    low = reduce == "amax"
    if dtype == dtypes.bool_:
        return not low
    if dtype.is_floating_point:
        return -math.inf if low else math.inf
    limits = np.iinfo(dtype.numpy)
    return int(limits.min if low else limits.max)


def _pads_a_convolution(result: Any, pads: list, value: Any) -> bool:
    """Whether constant_pad_nd's `result` only feeds a (not transposed) convolution's input and pads its spatial dims
    with +0 by whole non-negative widths: the convolution then reads the unpadded source with its leading padding
    grown by each dim's leading pad (its trailing pad is where the output's shape stops reading)."""
    uses = list(result.uses)
    if len(uses) != 1 or _op_name(uses[0].operation) != "aten.convolution.default" or uses[0].index != 0:
        return False
    if bound_arguments(uses[0].operation)[6] or value != 0 or math.copysign(1.0, value) < 0:
        return False  # transposed, or another fill
    rank = len(result.type.shape)
    return (len(pads) <= 2 * (rank - 2) and all(isinstance(p, int) and p >= 0 for p in pads))


def _per_dim(value: Any, n: int) -> list:
    values = list(value) if isinstance(value, (list, tuple)) else [value]
    return values * n if len(values) == 1 else values


def sparse_weight_key(target: str, component: str) -> str:
    """The weights-file name of one component of a sparse weight."""
    return f"{target}.{component}"


def schedule(program: ExportedProgram, target: Target) -> Schedule:
    """Group a decomposed program's ops into kernels for `target` (a backend's TARGET); rejects every op the target
    does not support at once. Shape arithmetic (a slice's wrapped start) is decided over the program's ranges:
    `x[..., -n:]` starts at `size - n` for every n in range, which no fresh environment can tell."""
    with active_shape_env(program.shape_env(hints=False)):
        return _Scheduler(program, target).run()


def data_dependent_problems(program: ExportedProgram, target: Target) -> dict[str, str]:
    """The ops whose result sizes depend on the input values, with why `target` cannot compile them. Symbols the
    caller binds are those of the input shapes; any other symbol in a result's shape is data-dependent (an unbacked
    `u0`: `item()`'s value, nonzero's row count, a mask's count), even where it has a range. A target that binds
    data-dependent sizes (C) reads them while running and allocates the outputs they size, so only sizes bound
    otherwise and reads inside a loop's body are problems there."""
    bound = input_symbols(program)
    problems: dict[str, str] = {}
    for op in program.body.walk():
        name = getattr(getattr(op, "opdef", None), "name", op.name)
        if isinstance(op, (func.ReturnOp, YieldOp)):
            continue
        if name in BIND_OPS:
            why = _unbindable(op, target)
            if why is None:
                bound.add(bound_symbol(op))
            elif why:
                problems.setdefault(name, why)
            continue
        unbound = _unbound(op.results, bound)
        if unbound:
            problems.setdefault(name, f"its result's size depends on the input values (data-dependent size "
                                      f"{unbound}), and the {target.name} ABI sizes every buffer from the input "
                                      f"shapes")
    return problems


def input_symbols(program: ExportedProgram) -> set:
    """The symbols the input shapes bind."""
    return set().union(*(type_symbols(arg.type) for arg in program.body.args))


def asserted_dims(shape: list, program: ExportedProgram) -> list:
    """A shape with each dim the program's runtime assertions equate to an expression without data-dependent sizes
    written as that expression: split pieces concatenated back (`Eq(u0 + u1 + u2, n)`) are n rows."""
    inputs = input_symbols(program)
    equal: dict[Any, Any] = {}
    for guard in program.runtime_asserts:
        if isinstance(guard.expr, sympy.Eq):
            for a, b in (guard.expr.args, reversed(guard.expr.args)):
                if not a.free_symbols <= inputs and b.free_symbols <= inputs:
                    equal.setdefault(sympy.expand(a), b)
    return [equal.get(sympy.expand(d), d) if isinstance(d, sympy.Expr) else d for d in shape]


def _unbound(values: Any, bound: set) -> str:
    """The symbols of the tensors' shapes outside `bound`, listed ('' when none)."""
    return ", ".join(sorted(str(s) for s in set().union(*(type_symbols(v.type) for v in values if _is_tensor(v)))
                            - bound))


def _unbindable(op: Any, target: Target) -> str | None:
    """Why `target` cannot read this `item()` or nonzero's count into a size while running: '' when its value is no
    size (a float, or an expression of sizes already known), None when it can."""
    symbol = bound_symbol(op)
    if symbol is None:
        return ""  # a float, or an integer the shapes already decide: a plain scalar, the op's own check
    if not target.binds_data_dependent_sizes:
        return (f"it reads a tensor's values into a size while running (data-dependent size {symbol}), and the "
                f"{target.name} ABI sizes every buffer from the input shapes")
    if not isinstance(op.parent_op(), func.FuncOp):
        return (f"it reads a tensor's values into a size inside a loop's body (data-dependent size {symbol}); "
                f"the {target.name} backend binds such sizes only between the program's top-level kernels")
    return None


def bound_symbol(op: Any) -> Any:
    """The symbol a BIND_OPS op names (nonzero's row count, an integer item()), or None (a float item(), or a size
    the shapes decide)."""
    result = op.results[0].type
    size = result.shape[0] if isinstance(result, TensorType) else result.expr if isinstance(result, SymIntType) \
        else None
    return size if isinstance(size, sympy.Symbol) else None


def refuse(problems: dict[str, str], target: Target) -> None:
    """Raise the UnsupportedError naming every op `target` cannot compile and why (nothing when none)."""
    if not problems:
        return
    listed = ", ".join(f"{n} ({why})" for n, why in sorted(problems.items()))
    # Registry ops can gain a lowering or a decomposition; region ops (kiln.map) and forms the kernels
    # do not take are better run elsewhere.
    lowerable = [n for n, why in problems.items() if why == target.no_lowering and n in REGISTRY]
    if any(REGISTRY[n].schema.namespace == "quantized_decomposed" for n in lowerable):
        raise UnsupportedError(
            f"the {target.name} backend computes these quantize ops only through integer lowering or "
            f"decomposition: {listed}", fix="start the pipeline with 'lower-quantized,decompose{namespaces="
                                            "aten,quantized_decomposed}' (kiln.compile's default does)")
    decomposable = any(REGISTRY[n].decomposition is not None and REGISTRY[n].schema.namespace == "aten"
                       for n in lowerable)
    fix = ("add 'decompose' to the pipeline (kiln.compile's default has it); " if decomposable else "") + (
        f"add a {target.name} lowering (kiln/codegen/{target.folder}) or a decomposition "
        "(kiln.ir.registry.register_decomposition), or export to ONNX" if lowerable else
        "run this program on kiln's interpreter or export it to ONNX, which handle these forms")
    raise UnsupportedError(f"the {target.name} backend cannot compile {len(problems)} op(s): {listed}",
                           fix=fix)
