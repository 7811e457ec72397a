"""The KilnError family: every user-facing failure is one of these, with a cause, a location and a fix."""

from __future__ import annotations


class KilnError(Exception):
    """Base class of every error kiln raises for a user mistake.

    The message is one line saying what is wrong; `source` (the user's file:line, when known) and
    `fix` (a suggested remedy) are appended on their own lines.
    """

    def __init__(self, cause: str, *, source: str | None = None, fix: str | None = None):
        self.cause = cause
        self.source = source
        self.fix = fix
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [self.cause]
        if self.source:
            lines.append(f"  at {self.source}")
        if self.fix:
            lines.append(f"  fix: {self.fix}")
        return "\n".join(lines)


class UnknownOpError(KilnError):
    """An operator name that is not in the op registry."""


class OpArgumentError(KilnError, TypeError):
    """Arguments that do not fit an operator's schema (missing, extra, or of the wrong type)."""


class ShapeError(KilnError, ValueError):
    """Tensor shapes that an operator cannot accept (incompatible broadcast, bad dim, bad size)."""


class DTypeError(KilnError, TypeError):
    """A dtype an operator does not support, or an unknown dtype name."""


class VerificationError(KilnError):
    """A program whose recorded types disagree with the op registry's meta rules."""


class InputError(KilnError, ValueError):
    """Runtime inputs that do not match a program's signature (count, dtype, rank, dims, ranges)."""


class ParseError(KilnError, ValueError):
    """Text (a schema, a symbolic expression, MLIR) that cannot be parsed."""


class GuardError(KilnError):
    """A symbolic-shape question that cannot be decided: no hint and not statically known."""


class DataDependentError(KilnError):
    """Tracing needed a tensor's value (`bool(t)`, `t.item()`), which a graph cannot know ahead of time."""


class ConstraintViolationError(KilnError):
    """Export found that the declared dynamic shapes are wider than the program allows."""


class UnsupportedError(KilnError):
    """A feature kiln does not support (yet), with the workaround."""
