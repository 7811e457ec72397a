"""What a code generator's kernels can do: each backend declares a `Target` (its dtypes, the ops it lowers and
the argument forms they take, and its cost model), and the shared scheduler consults it before grouping ops."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from kiln.codegen.kernels import same_dim
from kiln.codegen.schedule import (
    BIND_OPS, CHANNEL_OPS, CONV_OPS, MATMUL_OPS, REDUCTION_OPS, SORT_OPS, VIEW_OPS, WINDOW_OPS, bound_symbol,
)
from kiln.ir import dtypes
from kiln.ir.dialect import bound_arguments
from kiln.ir.types import TensorType


def tensor_value(value: Any) -> bool:
    return hasattr(value, "type") and isinstance(value.type, TensorType)


@dataclass(frozen=True)
class Target:
    """A backend's capabilities.

    `ops` are the op names its renderer lowers; `dtypes` the element types its kernels read and write;
    `unsupported_arguments(op)` says why an op's argument forms fall outside its kernels (None when they fit), and
    `unsupported_sparse(op, name, layouts)` the same for ops with sparse operands. `work(kernel)` is its cost model:
    a kernel's operation count, which sizes thread teams and launch grids.
    """

    name: str    # as messages say it: "C", "Triton"
    folder: str  # kiln/codegen/<folder>
    dtypes: frozenset
    ops: frozenset
    unsupported_arguments: Callable[[Any], str | None]
    unsupported_sparse: Callable[[Any, str, list[str]], str | None]
    work: Callable[[Any], Any]
    # whether the scheduler makes a scan whose body is an LSTM cell of this hidden size one `lstm_cell` kernel per
    # step (asked at each schedule, so a backend's switch can turn it off)
    fuses_lstm_cell: Callable[[int], bool] = lambda hidden: False
    # whether a bmm with one output column reads its A batch entries through an index of whole matrices (Hugging
    # Face's batched mixture of experts: each token's expert weights), instead of a gathered copy of them
    gathers_matrix_vector_batches: bool = False
    # whether a cat's parts may be written in place into its result (Buffer.inside): the renderer then points each
    # such part into its cat's storage
    places_cat_parts: bool = False
    # whether a 2:4 linear layer's kernel reads its activations transposed (the C kernels read the rows as they are)
    transposes_24_activations: bool = True
    # whether the run reads an integer `item()` into a size (a `bind` kernel) and sizes later buffers by it
    binds_data_dependent_sizes: bool = False
    # whether the package keeps the buffers the program mutates (a KV cache) from run to run
    keeps_state: bool = False
    # whether kernels compute on float16 and bfloat16; a target that only stores them (C) runs every other op on
    # them in float32 (legalize.py) and keeps only `half_native` ops on the stored values
    computes_half: bool = True

    @property
    def no_lowering(self) -> str:
        return f"no {self.name} lowering"

    def unsupported(self, op: Any, name: str) -> str | None:
        """Why this target cannot run `op` (None when it can)."""
        sparse = [v.type.layout.kind for v in op.operands if tensor_value(v) and v.type.is_sparse]
        if sparse:
            return self.unsupported_sparse(op, name, sparse)
        if name not in self.ops:
            return self.no_lowering
        for value in list(op.operands) + list(op.results):
            if tensor_value(value) and value.type.dtype not in self.dtypes:
                return f"dtype {value.type.dtype.name} is not supported"
        if not hasattr(op, "opdef"):  # a region op (a loop): its body's ops are checked one by one
            return None
        operands, results = tensor_dtypes(op)
        if not self.computes_half and not half_native(name, operands, results):
            half = next(d for d in operands + results if d in dtypes.REDUCED_FLOATS)
            return (f"{half.name} is computed in float32 here, which differs from ATen's {half.name} arithmetic for "
                    f"this op")
        return self.unsupported_arguments(op)


# Ops a target that only stores half-precision floats keeps on them: views and plain copies move the stored bits
HALF_MOVES = VIEW_OPS | {"aten.cat.default", "aten.clone.default"}
# Ops whose half-precision result ATen does not compute as float32 rounded once (its product rounds at every step, and
# overflows where float32's would not): a target that only stores half refuses them
HALF_ARITHMETIC = frozenset({"aten.prod.dim_int", "aten.prod.default"})


def tensor_dtypes(op: Any) -> tuple[list[dtypes.DType], list[dtypes.DType]]:
    """The dtypes of an op's tensor operands and results."""
    return ([v.type.dtype for v in op.operands if tensor_value(v)],
            [v.type.dtype for v in op.results if tensor_value(v)])


def half_native(name: str, operands: list[dtypes.DType], results: list[dtypes.DType]) -> bool:
    """Whether an op with these tensor dtypes runs on stored half-precision values as it is, on a target that only
    stores them: it touches none, or it moves them unchanged (a view, a copy, a cat of one dtype), or converts
    between them and float32 (exactly, or rounding as ATen does)."""
    touched = set(operands) | set(results)
    if not touched & set(dtypes.REDUCED_FLOATS):
        return True
    if name in HALF_MOVES:
        return len(touched) == 1
    return name == "aten._to_copy.default" and len(operands) == 1 and (
        operands == results or {*operands, *results} <= {dtypes.float32, *dtypes.REDUCED_FLOATS} and
        dtypes.float32 in touched)


# Reductions C also computes over integers and bools (CLIP's text pooling is the argmax of its token ids); the
# others are float math (mean, var) or take floats only in Triton (its target refuses these too).
INTEGER_REDUCTIONS = frozenset({"aten.argmax.default", "aten.argmin.default", "aten.max.dim", "aten.min.dim",
                                "aten.amax.default", "aten.amin.default", "aten.sum.dim_IntList",
                                "aten.prod.dim_int", "aten.prod.default"})


def kernel_argument_limits(op: Any) -> str | None:
    """Why this op's arguments fall outside the forms the scheduler's kernel kinds take (None when they fit): the
    checks every backend shares, before its own."""
    name = op.opdef.name
    args = bound_arguments(op)
    rank = len(op.operands[0].type.shape) if op.operands else 0
    if name in REDUCTION_OPS:
        dtype_position = {"aten.sum.dim_IntList": 3, "aten.mean.dim": 3, "aten.prod.dim_int": 3,
                          "aten.mean.default": 1, "aten.prod.default": 1}.get(name)
        if dtype_position is not None and args[dtype_position] is not None:
            return "dtype= is not supported"
        if not name.startswith("aten.any.") and name not in INTEGER_REDUCTIONS and \
                op.operands[0].type.dtype not in (dtypes.float32, dtypes.float64):
            return "only floating reductions are supported (any accepts every dtype)"
    if name in ("aten._softmax.default", "aten._log_softmax.default"):
        if rank == 0 or args[2]:
            return "only softmax of a tensor with dims, without half_to_float, is supported"
    if name == "aten.cumsum.default":
        if rank == 0:
            return "only cumsum of a tensor with dims is supported"
        if args[2] is not None and (args[2] != op.operands[0].type.dtype or args[2] == dtypes.bool_):
            return "dtype= other than the input's dtype is not supported"
    if name in SORT_OPS and rank == 0:
        return "only sorting a tensor with dims is supported"
    if name in ("aten.index_select.default", "aten.gather.default"):
        if rank == 0 or len(op.operands[1].type.shape) not in ((0, 1) if "index_select" in name else (rank,)):
            return "only indexing a tensor with dims (gather: an index of the same rank) is supported"
    if name in ("aten.index.Tensor", "aten.index_put.default"):
        given = [i for i in args[1] if i is not None]
        masks = [i for i in given if i.type.dtype not in (dtypes.int64, dtypes.int32)]
        if masks and name == "aten.index.Tensor":
            return ("a boolean mask index makes the result's size depend on the mask's values (an unbacked size "
                    "symbol), which this backend does not read while running (C reads a mask of rank 1 or more); "
                    "index with integer tensors (or use where / masked_fill)")
        if masks and not put_fits(op):
            return ("index_put with a boolean mask is supported only as the sole index (the other entries None) with "
                    "values that broadcast along the mask's count (size 1 or absent there)")
    if name in BIND_OPS and bound_symbol(op) is None:
        return ("only reads of a data-dependent size (an integer `.item()` or `.tolist()`, nonzero's row count) are "
                "supported")
    if name == "aten.scatter_reduce.two" and args[4] not in ("sum", "prod", "mean", "amax", "amin", "max", "min"):
        return f"reduce={args[4]!r}"
    if name == "aten.native_layer_norm.default" and (len(args[1]) != 1 or rank == 0):
        return "only layer norm over the last dim is supported"
    if name == "aten.native_group_norm.default":
        shape = op.operands[0].type.shape
        if not isinstance(shape[1], int) or any(same_dim(d, 0) for d in shape[1:]):
            return "only group norm with a static channel count and non-empty channels and spatial dims is supported"
        if any(tensor_value(a) and a.type.dtype not in (dtypes.float32, dtypes.float64) for a in args[:3]):
            return "only floating inputs are supported"
    if name in ("aten.div.Scalar_mode", "aten.fmod.Scalar", "aten.remainder.Scalar") and args[1] == 0:
        if not op.results[0].type.dtype.is_floating_point:
            return "integer division by zero"  # the interpreter raises; a compiled kernel cannot
    if name == "aten.gelu.default" and args[1] not in ("none", "tanh"):
        return f"approximate={args[1]!r}"
    if name == "aten.convolution.default":
        if len(op.results[0].type.shape) < 3:
            return "only batched convolutions are supported"
    if name in CONV_OPS | WINDOW_OPS | CHANNEL_OPS:
        # max pools also take the int8/uint8 values of quantized programs (kiln/passes/quant/lower.py)
        allowed = (dtypes.float32, dtypes.float64) + ((dtypes.int8, dtypes.uint8) if "max_pool" in name else ())
        for value in op.operands:
            if value.type.dtype not in allowed:
                return "only floating inputs are supported" + (" (and int8/uint8 for max pools)" if allowed[2:] else
                                                               "")
    if name in CHANNEL_OPS and rank < 2:
        return "only inputs with a channel dim are supported"
    if name in MATMUL_OPS and any(value.type.dtype == dtypes.bool_ for value in op.operands):
        return "bool matmuls are not supported (nor are they in ATen)"
    return None


def put_fits(op: Any) -> bool:
    """mask_put_fits for an index_put op."""
    input, indices, values = bound_arguments(op)[:3]
    return mask_put_fits(input.type.shape, [i and (i.type.dtype, i.type.shape) for i in indices], values.type.shape)


def mask_put_fits(shape: list, indices: list, values: list) -> bool:
    """Whether the scatter kernel takes an index_put of `values` (a shape) into `shape` at `indices` (each a
    (dtype, shape) or None): one boolean mask (the other entries None) whose values do not vary along the mask's
    count."""
    given = [(d, index) for d, index in enumerate(indices) if index is not None]
    if len(given) != 1 or given[0][1][0] != dtypes.bool_:
        return False
    position, width = given[0][0], len(given[0][1][1])
    values = list(values)
    aligned = position - (len(shape) - width + 1 - len(values))  # the values dim lined up with the count
    return len(values) <= len(shape) - width + 1 and (aligned < 0 or same_dim(values[aligned], 1))


# The sparse weights the scheduler's sparse_linear / sparse_conv kernels take, as `sparsify` stores them.
SPARSE_LINEAR_LAYOUTS = ("sparse_csr", "sparse_bsr", "semi_structured")
SPARSE_CONV_LAYOUTS = ("sparse_csr", "sparse_bsr")


def sparse_kernel_limits(op: Any, name: str, layouts: list[str], backend: str) -> str | None:
    """Why an op with sparse operands falls outside the scheduler's sparse kernels (None for linear on a CSR, BSR or
    2:4 weight, and an ungrouped, non-transposed convolution on a CSR or BSR weight of static shape whose taps are
    dense dims): the forms every backend shares, before its dtype rules."""
    refusal = (f"no {backend} kernel for {', '.join(dict.fromkeys(layouts))} operands (the {backend} backend runs "
               f"linear layers with {', '.join(SPARSE_LINEAR_LAYOUTS)} weights and convolutions with "
               f"{' or '.join(SPARSE_CONV_LAYOUTS)} weights whose kernel taps are dense dims, as `sparsify` "
               "stores them)")
    data, weight = op.operands[0].type, op.operands[1].type if len(op.operands) > 1 else None
    if weight is None or data.is_sparse or any(v.type.is_sparse for v in op.operands[2:] if tensor_value(v)):
        return refusal
    if name == "aten.linear.default":
        return None if weight.layout.kind in SPARSE_LINEAR_LAYOUTS else refusal
    if name != "aten.convolution.default":
        return refusal
    args = bound_arguments(op)
    if weight.layout.kind not in SPARSE_CONV_LAYOUTS or weight.layout.dense_dim != len(weight.shape) - 2:
        return refusal
    if args[6] or args[8] != 1:
        return f"sparse convolutions run ungrouped and not transposed in {backend}"
    if not all(isinstance(d, int) for d in weight.shape):
        return "a sparse convolution's weight needs a static shape"
    return None
