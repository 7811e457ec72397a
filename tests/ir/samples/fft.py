"""Samples of the FFTs: ATen's primitives and torch.fft's functions over them."""

from __future__ import annotations

import numpy as np

from tests.ir.samples import Sample, rand, samples


@samples("aten._fft_r2c.default")
def _fft_r2c(rng):
    yield Sample((rand(rng, 4, 8), [1], 0, True), note="one-sided")
    yield Sample((rand(rng, 4, 7), [1], 2, False), note="two-sided, 1/n")
    yield Sample((rand(rng, 3, 4, 6, dtype="float64"), [0, 2], 1, True), note="2-D transform, ortho")
    yield Sample((rand(rng, 3, 5, 4), [2, 0], 0, True), note="the last listed dim is halved")


@samples("aten._fft_c2r.default")
def _fft_c2r(rng):
    yield Sample((rand(rng, 4, 5, dtype="complex64"), [1], 0, 8), note="unnormalized inverse")
    yield Sample((rand(rng, 4, 4, dtype="complex64"), [1], 2, 7), note="odd length, 1/n")
    yield Sample((rand(rng, 3, 4, 4, dtype="complex128"), [0, 2], 1, 6), note="2-D, ortho")
    yield Sample((rand(rng, 3, 5, 6, dtype="complex64"), [2, 1], 2, 9), note="last listed dim is the real one")


@samples("aten._fft_c2c.default")
def _fft_c2c(rng):
    yield Sample((rand(rng, 4, 8, dtype="complex64"), [1], 0, True), note="forward")
    yield Sample((rand(rng, 4, 7, dtype="complex64"), [1], 2, False), note="inverse, 1/n")
    yield Sample((rand(rng, 3, 4, 6, dtype="complex128"), [0, 2], 1, True), note="2-D, ortho")
    yield Sample((rand(rng, 3, 5, 4, dtype="complex64"), [2, 0], 0, False), note="2-D inverse, unnormalized")
    yield Sample((rand(rng, 2, 1, dtype="complex64"), [1], 2, True), note="length 1")


@samples("aten.real.default")
def _real(rng):
    yield Sample((rand(rng, 3, 4, dtype="complex64"),))
    yield Sample((rand(rng, 3, dtype="complex128"),), note="complex128")
    yield Sample((rand(rng, 2, 3),), note="a real tensor is itself")


@samples("aten.imag.default")
def _imag(rng):
    yield Sample((rand(rng, 3, 4, dtype="complex64"),))
    yield Sample((rand(rng, 3, dtype="complex128"),), note="complex128")


def _one_dimensional(kind: str):
    def generate(rng):
        real = kind in ("fft", "ifft", "rfft")
        x = (lambda *shape, dtype="float32": rand(rng, *shape, dtype=dtype)) if real else (
            lambda *shape, dtype="complex64": rand(rng, *shape, dtype=dtype))
        yield Sample((x(3, 8),), note="defaults")
        yield Sample((x(3, 7), 5, 0, "ortho"), note="cut to n along dim 0, ortho")
        yield Sample((x(2, 6), 11, -1, "forward"), note="zero-padded to n, forward scale")
        yield Sample((x(2, 5, dtype="float64" if real else "complex128"), None, 1, "backward"), note="double")
        if kind in ("fft", "ifft"):
            yield Sample((rand(rng, 2, 6, dtype="complex64"),), note="complex input")
            yield Sample((rand(rng, 4, dtype="int64"),), note="integers become float")
    return generate


def _many_dimensional(kind: str, form: str):
    def generate(rng):
        real = kind in ("fft", "ifft", "rfft")
        dtype = "float32" if real else "complex64"
        if form == "2":
            yield Sample((rand(rng, 2, 4, 6, dtype=dtype),), note="defaults: the last two dims")
            yield Sample((rand(rng, 3, 4, 5, dtype=dtype), [5, 3], [0, 2], "ortho"), note="sizes and dims")
        else:
            yield Sample((rand(rng, 2, 4, 6, dtype=dtype),), note="defaults: every dim")
            yield Sample((rand(rng, 3, 4, 5, dtype=dtype), None, [1, 2]), note="FNet's (seq, hidden) mix")
            yield Sample((rand(rng, 3, 4, 5, dtype=dtype), [6, 4]), note="sizes name the last dims")
            yield Sample((rand(rng, 3, 4, 6, dtype=dtype), [-1, 8], [0, 2], "forward"), note="-1 keeps a size")
            if kind in ("fft", "ifft"):  # no dims to transform: the identity (the one-sided ones refuse it)
                yield Sample((np.asarray(rand(rng, dtype=dtype)),), note="0-d: the value as complex")
                yield Sample((rand(rng, 3, 4, dtype=dtype), None, []), note="dim=[]: the input as complex")
    return generate


for _kind in ("fft", "ifft", "rfft", "irfft"):
    samples(f"aten.fft_{_kind}.default")(_one_dimensional(_kind))
    samples(f"aten.fft_{_kind}2.default")(_many_dimensional(_kind, "2"))
    samples(f"aten.fft_{_kind}n.default")(_many_dimensional(_kind, "n"))
