"""What a kernel schedule is made of: buffers and strided views, the expression trees pointwise kernels and
epilogues compute, kernels with each kind's typed detail, and the Schedule the scheduler (schedule.py) builds and
the renderers read."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import sympy

from kiln.ir import dtypes

# ---------------------------------------------------------------------------------------------
# Schedule data

@dataclass(eq=False)
class Buffer:
    """A contiguous allocation: a program input, a weight, an output, or a temporary."""

    index: int
    name: str
    dtype: dtypes.DType
    shape: list  # dims: ints or sympy expressions over the program's symbols
    # "input" | "weight" | "temp" | "output" | "window" (placed by its loop every step) | "state" (a buffer the
    # program mutates: the package keeps it between runs) | "next_state" (its new value, which replaces it after a run)
    kind: str = "temp"
    weight_key: str | None = None
    io_index: int = -1  # position among user inputs / outputs
    # (buffer, element offset): a temporary that lives in another buffer's storage, a part of a cat its producer
    # writes in place (schedule._Scheduler.place_cat_part); it has no storage of its own
    inside: tuple[Buffer, Any] | None = None

    @property
    def numel(self) -> Any:
        return sympy.Mul(*[sympy.Integer(d) if isinstance(d, int) else d for d in self.shape])

    def home(self) -> tuple[Buffer, Any]:
        """The buffer whose storage holds this one (itself unless placed `inside` another, transitively) and this
        one's element offset in it."""
        buf, offset = self, sympy.Integer(0)
        while buf.inside is not None:
            buf, at = buf.inside
            offset = sympy.expand(offset + at)
        return buf, offset


@dataclass(eq=False)
class View:
    """A strided window on a buffer: element i is at offset + sum(i_k * strides[k])."""

    buffer: Buffer
    shape: list
    strides: list
    offset: Any = 0

    @property
    def is_contiguous(self) -> bool:
        expected = contiguous_strides(self.shape)
        return all(same_dim(d, 1) or same_dim(s, e) for d, s, e in zip(self.shape, self.strides, expected))


@dataclass(eq=False)
class Load:
    """Read a view at the kernel's output index; `strides` are per output dim (0 where broadcast)."""

    buffer: Buffer
    strides: list
    offset: Any


@dataclass(eq=False)
class Gather:
    """embedding: row `index` of a 2-D view, column = the kernel's last index. With `dim` set (index_select,
    gather): `table` (the source, of the kernel's rank) at the kernel's index with dim `dim` replaced by `index`,
    which the kernel checks against `size` at run time. index.Tensor: `index`, `dim`, `size` and `stride` are
    lists (one entry per index tensor); each checked, wrapped index adds index * stride to the table position."""

    table: View
    index: Any  # an expression node (index.Tensor: a list of them)
    dtype: dtypes.DType
    dim: Any = None
    size: Any = None
    op: str = "aten.embedding.default"
    stride: Any = None


@dataclass(eq=False)
class Tile:
    """repeat: read `buffer` at offset + sum((i_k % sizes[k]) * strides[k]) (no modulo where sizes[k] is None)."""

    buffer: Buffer
    strides: list
    offset: Any
    sizes: list
    op: str = "aten.repeat.default"


@dataclass(eq=False)
class ScatterIndex:
    """A scatter's target position along `dim`: the index tensor's element (a Load over the iteration space),
    checked against `size` at run time; negative values wrap when `wrap` (index_put), else they are errors."""

    index: Load
    size: Any
    dim: int
    wrap: bool


@dataclass(eq=False)
class Iota:
    start: Any
    step: Any
    dtype: dtypes.DType


@dataclass(eq=False)
class Constant:
    value: Any
    dtype: dtypes.DType
    op: str = "aten.scalar_tensor.default"


@dataclass(eq=False)
class Accumulator:
    """The GEMM result inside a matmul kernel's epilogue."""

    dtype: dtypes.DType


@dataclass(eq=False)
class Apply:
    op: str  # the aten op name; the renderer's rule table is keyed by it
    args: list  # expression nodes for tensors, Python values for other arguments
    dtype: dtypes.DType
    arg_dtypes: list = field(default_factory=list)
    # PROMOTING_OPS: the dtype ATen converts every operand to first (torch.result_type: a 0-d tensor or a Python
    # scalar takes a dimensioned operand's dtype in its category, wrapping integers and rounding floats)
    operand_dtype: dtypes.DType | None = None


@dataclass(eq=False)
class Kernel:
    """One loop nest. `kind` names its template (pointwise, matmul, conv, rows, window, cat, pad, scatter, distance,
    bags, qlinear, wlinear, qconv, qpool, sparse_linear, sparse_conv, loop, attention, lstm_cell, bind, nonzero) and
    `detail` holds what the template needs: the kind's *Detail dataclass below (None for pointwise). `ops` names its
    aten ops."""

    kind: str
    name: str
    ops: list[str]
    outputs: list[Buffer]
    shape: list  # the iteration shape (pointwise, matmul: the output's)
    expr: Any = None  # pointwise value, or the matmul epilogue (over an Accumulator)
    detail: KernelDetail | None = None


@dataclass(eq=False)
class Carry:
    """A loop-carried value of a `loop` kernel: the body reads it through the `read` window and writes the next
    one through the `write` window. Step 0 reads `init`; the steps in between alternate between the two `slots`;
    the last step writes `final` (which holds `init` after zero steps). A carry the body also yields as a per-step
    output has no slots: it is `stacked`, step t reading slice t - 1, and its last slice is copied to `final`."""

    init: View
    read: Buffer
    write: Buffer
    slots: list[Buffer]
    final: Buffer
    stacked: "Window | None" = None


@dataclass(eq=False)
class Window:
    """A buffer the body sees as one step's slice of `source` (an x, read) or of `stacked` (an output, written):
    `source`'s elements from `offset + step * numel(window)`."""

    window: Buffer
    source: Buffer
    offset: Any = 0


# ---------------------------------------------------------------------------------------------
# Kernel details: what each kind's template needs besides the iteration shape and epilogue

# A GEMM operand: its buffer, its strides over [batch, rows, columns] (batch stride 0 for mm and addmm), its offset.
GemmOperand = tuple[Buffer, list, Any]


@dataclass(eq=False)
class MatmulDetail:
    """mm / addmm / bmm: A [.., M, K] and B [.., K, N]; addmm's `bias` (a Load over the output) enters as
    beta * bias + alpha * A @ B."""

    a: GemmOperand
    b: GemmOperand
    k: Any
    bias: Load | None = None
    beta: Any = 1
    alpha: Any = 1
    # index.Tensor of whole matrices feeding A (schedule._batch_gather): A's batch entry bi is `a` at offset
    # checked(a_gather.index[0] at bi) * a_gather.stride[0]; only a target's matrix-vector kernels take it
    a_gather: "Gather | None" = None


def matrix_vector(shape: list, detail: MatmulDetail, out_dtype: dtypes.DType) -> bool:
    """A float32 GEMM with one static output column (a linear layer to one output; a bmm of one vector per batch
    entry, as Hugging Face's batched mixture-of-experts layers make) whose A rows are contiguous along K and whose
    column has a static stride: a target's matrix-vector kernel takes it (dot products of A's rows with the column)
    where a panel micro-kernel would compute one of its columns."""
    static = [sympy.sympify(d) for d in (shape[-1], detail.a[1][-1], detail.b[1][-2])]
    return detail.a[0].dtype == detail.b[0].dtype == out_dtype == dtypes.float32 and \
        all(d.is_Integer for d in static) and static[0] == 1 and static[1] == 1


@dataclass(eq=False)
class ConvDetail:
    """convolution: the input, the weight [C_out, C_in / groups, *taps] (transposed: [C_in, C_out / groups, *taps]),
    the bias per output channel, and per-spatial-dim stride, padding and dilation."""

    input: View
    weight: View
    bias: View | None
    stride: list
    padding: list
    dilation: list
    groups: int
    transposed: bool


@dataclass(eq=False)
class RowsDetail:
    """A row kernel (reductions, softmax, cumsum, sort, layer and group norm) over `dim` of `input`; a fused
    pointwise producer instead of an input is `input_expr` over `input_shape`. `constants` are the op's named
    constants (var's CORR); `descending` is sort's; `weight`, `bias`, `eps` are the norms', and group norm's
    channel of element k in row (n, group) is group * per_group + k // hxw."""

    input: View | None
    dim: int
    constants: dict[str, float] = field(default_factory=dict)
    descending: bool | None = None
    input_expr: Any = None
    input_shape: list | None = None
    weight: View | None = None
    bias: View | None = None
    eps: float | None = None
    per_group: Any = None
    hxw: Any = None
    input_dtype: Any = None  # the row op's operand dtype (integer reductions compute in it)


@dataclass(eq=False)
class WindowDetail:
    """A window kernel over the `n` trailing spatial dims of `input`. Pools: `kernel`, `stride`, `padding`,
    `dilation` per dim (adaptive pools: none), avg_pool's `count_include_pad` and `divisor_override`. Upsampling:
    `scales` per dim (None: from the sizes), bilinear's `align_corners`. grid_sampler_2d: `grid`, `interpolation`,
    `padding_mode` (ATen's codes) and `align_corners`."""

    input: View
    n: int
    kernel: list | None = None
    stride: list | None = None
    padding: list | None = None
    dilation: list | None = None
    count_include_pad: bool | None = None
    divisor_override: int | None = None
    grid: View | None = None
    interpolation: int | None = None
    padding_mode: int | None = None
    align_corners: bool | None = None
    scales: list | None = None


@dataclass(eq=False)
class CatDetail:
    """cat along `dim`: each part as (a Load over its shape, its shape, its start along `dim`)."""

    parts: list[tuple[Load, list, Any]]
    dim: int


@dataclass(eq=False)
class PadDetail:
    """A pad: output element i reads `input` at i - before; outside it, `mode` "constant" gives `value`, "reflect"
    mirrors about the edges and "replicate" clamps to them."""

    input: View
    before: list
    value: Any
    mode: str


@dataclass(eq=False)
class ScatterDetail:
    """A copy of `input` (a Load over the output), then `value` (an expression over `space`) combined by `reduce`
    (assign, sum, prod, mean, amax, amin) into the target each element of `space` picks: `targets` has per output
    dim a space dim (int) or a ScatterIndex. `parallel` marks the space dims that may split between threads
    (distinct values target distinct elements); `mask` (index_put's bool index) skips elements; `include_self`
    is scatter_reduce's, and without it a targeted element starts from `identity` (ATen's identity of the
    reduction, within the output dtype's range). `in_place`: the output is the input's storage (a state updated in
    place, schedule.in_place_scatter), so there is nothing to copy."""

    input: Load
    space: list
    parallel: list[bool]
    targets: list
    value: Any
    mask: Load | None
    reduce: str
    include_self: bool
    identity: bool | int | float | None = None
    in_place: bool = False


@dataclass(eq=False)
class DistanceDetail:
    """cdist (two `sides`) or pdist (one): Loads over [..., rows, columns]; a `p`-norm over `columns`.
    `compute_mode` is cdist's: whether p = 2 takes the matrix-product formula (None or 0: past 25 rows, 1: always,
    2: never)."""

    sides: list[Load]
    rows: list
    columns: Any
    p: float
    compute_mode: int | None


@dataclass(eq=False)
class BagsDetail:
    """_embedding_bag: rows of `weight` picked by `indices`, bags between `offsets`, reduced by `mode` (0 sum,
    1 mean, 2 max), optionally scaled by `per_sample_weights`."""

    weight: View
    indices: View
    offsets: View
    mode: int
    per_sample_weights: View | None
    include_last_offset: bool
    padding_idx: int | None


@dataclass(eq=False)
class QLinearDetail:
    """quant.qlinear_pointwise: activations `x` as [M, K] rows, the int8 `weight` [N, K] with per-column
    `weight_scale` and `bias`; `x_scale` and `x_zero_point` (numbers, Loads for the .tensor overload, or with
    `per_token` contiguous Views of one per row); the output qparams; `post_op`. `signed`: int8 activations;
    `narrow`: uint8 proven at most 127."""

    x: View
    weight: View
    weight_scale: View
    bias: View | None
    x_scale: Any
    x_zero_point: Any
    output_scale: float
    output_zero_point: int
    quant_min: int
    quant_max: int
    post_op: str
    m: Any
    k: Any
    n: Any
    signed: bool
    narrow: bool
    per_token: bool = False


@dataclass(eq=False)
class WLinearDetail:
    """quant.linear_weight_only: float rows `x` [M, K] against an int8 or int4 (`bits`) `weight` [N, K] with
    `scales` and `zero_points` per `group_size` columns."""

    x: View
    weight: View
    scales: View
    zero_points: View | None
    bias: View | None
    group_size: int
    bits: int
    m: Any
    k: Any
    n: Any


@dataclass(eq=False)
class QPoolDetail:
    """quant.qadaptive_avg_pool2d: integer NCHW `x`, its qparams and the output's."""

    x: View
    x_scale: float
    x_zero_point: int
    output_scale: float
    output_zero_point: int
    quant_min: int
    quant_max: int


@dataclass(eq=False)
class QConvDetail:
    """quant.qconv2d_pointwise: NCHW integer `x`, the int8 `weight` [C_out, C / groups, kH, kW] with per-channel
    `weight_scale` and `bias`, an optional float residual `other`; qparams, `post_op`, `signed` and `narrow` as
    QLinearDetail's; `k` = C / groups * kH * kW."""

    x: View
    weight: View
    weight_scale: View
    bias: View | None
    other: View | None
    x_scale: Any
    x_zero_point: Any
    stride: list
    padding: list
    dilation: list
    groups: int
    output_scale: float
    output_zero_point: int
    quant_min: int
    quant_max: int
    post_op: str
    signed: bool
    narrow: bool
    k: Any


@dataclass(eq=False)
class BindDetail:
    """A data-dependent size (torch's unbacked `u0`), which later kernels' loops and buffers are sized by: the one
    element of `source` (`_local_scalar_dense`, a tensor's `.item()`) or, with `count`, how many of its elements
    are nonzero (nonzero's rows). A `nonzero` kernel has the same detail: it writes those elements' coordinates."""

    symbol: sympy.Symbol
    source: View
    count: bool = False


@dataclass(eq=False)
class SparseLinearDetail:
    """linear with a sparse weight [N, K] (`layout` sparse_csr, sparse_bsr or semi_structured, `block` its
    blocksize): rows `x` [M, K], first transposed into `xT` (None: the target reads 2:4 rows as they are);
    `components` names the weight's buffers (values, col_indices, ...); `bias` is a Load over the output."""

    x: View
    xT: Buffer | None
    m: Any
    k: Any
    n: Any
    layout: str
    block: tuple
    components: dict[str, Buffer]
    bias: Load | None


@dataclass(eq=False)
class SparseConvDetail:
    """convolution with a hybrid BSR weight of `weight_shape` (blocks over [C_out, C_in * taps]), fields as
    ConvDetail's and SparseLinearDetail's."""

    input: View
    weight_shape: list
    components: dict[str, Buffer]
    layout: str
    block: tuple
    bias: View | None
    stride: list
    padding: list
    dilation: list
    groups: int


@dataclass(eq=False)
class LoopDetail:
    """A loop's `body` kernels, run once per step, its `carries`, the windows it points at each step's slice of an
    x (`slices`) or of a stacked output (`stacked`). A while loop (no trip count) also has `cond`, the kernels that
    compute its `predicate` before each step."""

    body: list[Kernel]
    carries: list[Carry]
    slices: list[Window]
    stacked: list[Window]
    cond: list[Kernel] | None = None
    predicate: View | None = None

    def region_kernels(self) -> list[Kernel]:
        """The cond's kernels (a while loop's), then the body's."""
        return (self.cond or []) + self.body


@dataclass(eq=False)
class AttentionDetail:
    """The fused attention kernel (kiln/codegen/attention.py): `q` and `k` are the scores GEMM's operands
    (Q [batch, queries, dim], Kᵀ [batch, dim, keys]), `scores` its epilogue (over acc_value and (i0, i1, i2) =
    (batch, query, key)), `v` the output GEMM's B (V [batch, keys, value dim]); `safe`: a row of scores that is all
    -inf gives zeros, not NaN (torch's safe softmax)."""

    q: GemmOperand
    k: GemmOperand
    dim: Any
    keys: Any
    scores: Any
    v: GemmOperand
    safe: bool


@dataclass(eq=False)
class LstmCellDetail:
    """One step of an LSTM layer (torch's cell, kiln/codegen/recurrent.py) as one kernel: the gates
    `h @ weightᵀ + bias + x` ([batch, 4 x hidden], torch's gate order i, f, g, o) are a GEMM whose epilogue computes
    c' = σ(f)·c + σ(i)·tanh(g) and h' = σ(o)·tanh(c') (the kernel's outputs h', c'). `h`, `c` and `x` are the step's
    contiguous carry and slice windows, `weight` the constant recurrent weight [4 x hidden, hidden]."""

    h: View
    c: View
    x: View
    weight: View
    bias: View | None
    batch: Any
    hidden: int


KernelDetail = (MatmulDetail | ConvDetail | RowsDetail | WindowDetail | CatDetail | PadDetail | ScatterDetail
                | DistanceDetail | BagsDetail | QLinearDetail | WLinearDetail | QPoolDetail | QConvDetail
                | SparseLinearDetail | SparseConvDetail | LoopDetail | AttentionDetail | LstmCellDetail | BindDetail)


@dataclass
class Schedule:
    buffers: list[Buffer]
    kernels: list[Kernel]
    inputs: list[Buffer]
    outputs: list[tuple[Buffer, list]]  # buffer and the output's shape
    symbols: list[sympy.Symbol]  # bound from the input shapes by the caller
    output_names: list[str]
    input_names: list[str]
    # data-dependent sizes, in the order the run binds them (each by its `bind` kernel): no buffer of the caller's
    # is sized by one, and a temporary sized by one is allocated once it is bound
    unbacked: list[sympy.Symbol] = field(default_factory=list)
    # (state buffer, its next value) per buffer the program mutates: a run writes the next value, and a successful
    # run makes it the state (C swaps the two); no next value where a scatter updates the state in place
    state: list[tuple[Buffer, Buffer | None]] = field(default_factory=list)

    def allocated_outputs(self) -> list[Buffer]:
        """The outputs whose shapes depend on data-dependent sizes: the run allocates them (the C ABI's caller
        allocates the others, those the program's assertions equate to sizes of the inputs included)."""
        return [buf for buf, shape in self.outputs if self._names_unbacked(shape)]

    def is_dynamic(self, buffer: Buffer) -> bool:
        """Whether a buffer's size depends on a data-dependent size (so it has no place in the static plan)."""
        return self._names_unbacked(buffer.shape)

    def _names_unbacked(self, shape: list) -> bool:
        return any(s in self.unbacked for d in shape for s in getattr(d, "free_symbols", ()))

    def all_kernels(self) -> list[Kernel]:
        """Every kernel, those inside loop kernels' bodies included (each after its loop)."""
        return flatten_kernels(self.kernels)


def flatten_kernels(kernels: list[Kernel]) -> list[Kernel]:
    found = []
    for kernel in kernels:
        found.append(kernel)
        if kernel.kind == "loop":
            found += flatten_kernels(kernel.detail.region_kernels())
    return found


# ---------------------------------------------------------------------------------------------
# Helpers

def as_dim(d: Any) -> Any:
    """A dim as sympy: an int becomes an Integer."""
    return sympy.Integer(d) if isinstance(d, int) else d


def same_dim(a: Any, b: Any) -> bool:
    """Two dims (ints or sympy expressions) provably equal."""
    return sympy.expand(as_dim(a) - as_dim(b)) == 0


def contiguous_strides(shape: list) -> list:
    strides, running = [], sympy.Integer(1)
    for d in reversed(shape):
        strides.append(running)
        running = sympy.expand(running * as_dim(d))
    return list(reversed(strides))
