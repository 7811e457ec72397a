"""kiln.nn: PyTorch-compatible modules (`kiln.nn.Linear`, ...), `functional` and `init`."""

from kiln.frontend.nn import functional, init
from kiln.frontend.nn.layers import *  # noqa: F401,F403
from kiln.frontend.nn.layers import __all__ as _layers
from kiln.frontend.nn.module import Module
from kiln.frontend.nn.recurrent import *  # noqa: F401,F403
from kiln.frontend.nn.recurrent import __all__ as _recurrent
from kiln.frontend.nn.transformer import *  # noqa: F401,F403
from kiln.frontend.nn.transformer import __all__ as _transformer
from kiln.frontend.tensor import Parameter

__all__ = ["Module", "Parameter", "functional", "init", *_layers, *_recurrent, *_transformer]
