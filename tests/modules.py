"""Small kiln.nn modules the tests build programs from."""

from __future__ import annotations

from typing import Any, Callable

import kiln
import kiln.nn.functional as KF


class FunctionModule(kiln.nn.Module):
    """A module whose forward is `fn(F, *inputs)`, F being kiln.nn.functional: one function, many namespaces."""

    def __init__(self, fn: Callable[..., Any]):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: Any) -> Any:
        return self.fn(KF, *inputs)


class LambdaModule(kiln.nn.Module):
    """A module whose forward is `fn(*inputs)`."""

    def __init__(self, fn: Callable[..., Any]):
        super().__init__()
        self.fn = fn

    def forward(self, *inputs: Any) -> Any:
        return self.fn(*inputs)
