"""kiln.optim: torch.optim's optimizers (SGD, Adam, AdamW, RMSprop) and `lr_scheduler` on kiln.Tensor parameters."""

from kiln.frontend.optim import lr_scheduler
from kiln.frontend.optim.adam import Adam, AdamW
from kiln.frontend.optim.optimizer import Optimizer, OptimizerArgumentError
from kiln.frontend.optim.rmsprop import RMSprop
from kiln.frontend.optim.sgd import SGD

__all__ = ["Optimizer", "OptimizerArgumentError", "SGD", "Adam", "AdamW", "RMSprop", "lr_scheduler"]
