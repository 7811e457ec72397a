"""Shared helpers for the pass tests: zoo programs exported once, interpreter outputs, torch's tolerances."""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np

import kiln
import kiln.models
from kiln.ir.interpreter import run_program

def assert_close(actual: Any, expected: Any) -> None:
    """torch.testing.assert_close's check on numpy values, NaNs equal."""
    kiln.testing.assert_close(np.asarray(actual), np.asarray(expected), equal_nan=True)


def outputs(program: kiln.ExportedProgram, args: tuple) -> list[np.ndarray]:
    """Every output of `program` (signature order) on the interpreter."""
    return [np.asarray(o) for o in run_program(program, [np.asarray(a.numpy()) for a in args])]


def assert_same_outputs(program: kiln.ExportedProgram, reference: list[np.ndarray], args: tuple) -> None:
    got = outputs(program, args)
    assert len(got) == len(reference)
    for value, expected in zip(got, reference):
        assert_close(value, expected)


@functools.cache
def zoo(name: str) -> tuple[Any, kiln.ExportedProgram, list[tuple]]:
    """(entry, exported program, input sets: the example and one with each dynamic dim resized)."""
    entry = kiln.models.get(name)
    program = kiln.export(entry.model, entry.args, dynamic_shapes=entry.dynamic_shapes)
    resized = {dim: values[-1] for dim, values in entry.dim_examples.items()}
    return entry, program, [entry.args, _inputs_at(entry, resized)]


def _inputs_at(entry: Any, sizes: dict[str, int]) -> tuple:
    names = list(inspect.signature(entry.model.forward).parameters)
    new_args = []
    kiln.manual_seed(1)
    for name, example in zip(names, entry.args):
        shape = list(example.shape)
        for axis, dim in (entry.dynamic_shapes.get(name) or {}).items():
            shape[axis] = sizes.get(dim.name, shape[axis])
        if example.dtype is kiln.int64:
            new_args.append(kiln.randint(0, int(example.numpy().max()) + 1, shape))
        else:
            new_args.append(kiln.randn(*shape))
    return tuple(new_args)


def op_names(program: kiln.ExportedProgram) -> list[str]:
    return [op.name for op in program.nodes()]


def count(program: kiln.ExportedProgram, *names: str) -> int:
    return sum(1 for op in program.nodes() if op.name in names or op.name.removeprefix("aten.") in names)
