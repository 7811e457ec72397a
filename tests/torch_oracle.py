"""Converting between numpy/kiln values and torch for oracle comparisons (tests only)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import pytest

from kiln.ir import dtypes
from kiln.ir.sparse import SPARSE_KINDS, SparseArray

try:
    import torch  # type: ignore[no-redef]
    import torch.ao.quantization.fx._decomposed  # noqa: F401  (defines torch.ops.quantized_decomposed)
except ImportError:  # pragma: no cover - CI installs torch
    torch = None

requires_torch = pytest.mark.skipif(torch is None, reason="torch is not installed")


def torch_dtype(dt: dtypes.DType) -> Any:
    return getattr(torch, dt.name)


def to_torch(value: Any) -> Any:
    """numpy arrays → tensors (bfloat16 through float32), kiln dtypes → torch dtypes, containers recursively."""
    if isinstance(value, np.ndarray):
        if value.dtype == dtypes.bfloat16.numpy:
            return torch.from_numpy(value.astype(np.float32)).to(torch.bfloat16)
        return torch.from_numpy(np.array(value, copy=True, order="C"))
    if isinstance(value, SparseArray):
        return sparse_to_torch(value)
    if isinstance(value, str) and value in SPARSE_KINDS[:-1]:  # a layout argument: torch.sparse_csr, ...
        return getattr(torch, value)
    if isinstance(value, dtypes.DType):
        return torch_dtype(value)
    if isinstance(value, list):
        return [to_torch(v) for v in value]
    if isinstance(value, tuple):
        return tuple(to_torch(v) for v in value)
    if isinstance(value, dict):
        return {k: to_torch(v) for k, v in value.items()}
    return value


def sparse_to_torch(value: SparseArray) -> Any:
    """A kiln sparse value as the torch sparse tensor with the same components (2:4 has no CPU form: dense)."""
    kind = value.layout.kind
    parts = {name: to_torch(array) for name, array in value.components.items()}
    if kind == "sparse_coo":
        return torch.sparse_coo_tensor(parts["indices"], parts["values"], value.shape,
                                       is_coalesced=value.layout.coalesced or None)
    if kind == "semi_structured":
        return to_torch(value.to_dense())
    constructor = getattr(torch, f"{kind}_tensor")
    names = list(value.components)
    return constructor(parts[names[0]], parts[names[1]], parts["values"], value.shape)


def to_numpy(value: Any) -> Any:
    if torch is not None and isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:
            return value.float().numpy().astype(dtypes.bfloat16.numpy)
        return value.detach().numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v) for v in value)
    return value


def assert_close_to_torch(actual: Any, expected: Any, *, check_values: bool = True, rtol: float | None = None,
                          atol: float | None = None, where: str = "",
                          dtype_tolerances: Mapping[str, tuple[float, float]] | None = None) -> None:
    """kiln result (numpy) vs torch result under torch.testing.assert_close's default tolerances.

    An explicit rtol/atol applies to every output; `dtype_tolerances` ({"bfloat16": (rtol, atol)}) only to the
    outputs of those dtypes, for an op whose reduced-precision rounding differs between torch's kernels."""
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), (
            f"{where}: kiln returned {type(actual).__name__} of {len(actual) if hasattr(actual, '__len__') else '?'}"
            f" results, torch {len(expected)}")
        for index, (a, e) in enumerate(zip(actual, expected)):
            assert_close_to_torch(a, e, check_values=check_values, rtol=rtol, atol=atol, where=f"{where}[{index}]",
                                  dtype_tolerances=dtype_tolerances)
        return
    if isinstance(expected, torch.Tensor) and expected.layout != torch.strided or isinstance(actual, SparseArray):
        kind = actual.layout.kind if isinstance(actual, SparseArray) else "strided"
        assert kind == str(expected.layout).removeprefix("torch."), (
            f"{where}: layout {kind} != torch's {expected.layout}")
        assert_close_to_torch(actual.to_dense(), expected.to_dense(), check_values=check_values, rtol=rtol, atol=atol,
                              where=f"{where} (densified)", dtype_tolerances=dtype_tolerances)
        return
    if not isinstance(expected, torch.Tensor):
        if check_values:
            assert actual == pytest.approx(expected, nan_ok=True), f"{where}: {actual} != {expected}"
        return
    actual_tensor = to_torch(np.asarray(actual))
    assert actual_tensor.dtype == expected.dtype, f"{where}: dtype {actual_tensor.dtype} != torch's {expected.dtype}"
    assert tuple(actual_tensor.shape) == tuple(expected.shape), (
        f"{where}: shape {tuple(actual_tensor.shape)} != torch's {tuple(expected.shape)}")
    if check_values:
        dtype_name = str(expected.dtype).removeprefix("torch.")
        if rtol is not None:
            kwargs = {"rtol": rtol, "atol": atol or 0.0}
        elif dtype_tolerances and dtype_name in dtype_tolerances:
            dtype_rtol, dtype_atol = dtype_tolerances[dtype_name]
            kwargs = {"rtol": dtype_rtol, "atol": dtype_atol}
        else:
            kwargs = {}  # assert_close's defaults for the dtype
        torch.testing.assert_close(actual_tensor, expected, equal_nan=True, msg=lambda m: f"{where}: {m}", **kwargs)


def module_pair(name: str, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    """The same nn module in torch and kiln (`name` in both namespaces), kiln holding torch's weights, both in
    eval mode: (torch module, kiln module)."""
    import kiln.nn
    torch.manual_seed(0)
    reference = getattr(torch.nn, name)(*args, **kwargs).eval()
    module = getattr(kiln.nn, name)(*args, **kwargs).eval()
    module.load_state_dict(reference.state_dict())
    return reference, module
