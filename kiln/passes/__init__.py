"""Passes over kiln programs: the registry, pipeline strings, the built-in optimizations and the custom-pass API.

    optimized = kiln.passes.run(program, "decompose,canonicalize,fold-constants,cse,dce")

Write your own with `RewritePass` + `@pattern` (docs/writing-passes.md).
"""

from kiln.passes.base import (
    PASSES, Pass, PassError, PipelineError, add_constant, clone_program, lookup_pass, option, register_pass,
)
from kiln.passes.rewrite import Match, RewritePass, constant, current_op, pattern, producer, users, value_of
from kiln.passes.pipeline import DEFAULT_PIPELINE, PassManager, load_plugin, parse_pipeline, run

# The built-in passes register themselves on import.
from kiln.passes.decompose import Decompose
from kiln.passes.canonicalize import Canonicalize
from kiln.passes.fold_constants import FoldConstants
from kiln.passes.cse import CommonSubexpressionElimination
from kiln.passes.dce import DeadCodeElimination
from kiln.passes.fold_batchnorm import FoldBatchNorm
from kiln.passes.trim_taps import TrimConvolutionTaps
from kiln.passes.remove_dropout import RemoveDropout
from kiln.passes.recognize_gelu import RecognizeGelu
from kiln.passes.group_query_attention import GroupQueryAttention
from kiln.passes.fuse_activations import FUSE_ATTRIBUTE, FuseActivations
from kiln.passes.prepack import LAYOUTS, Prepack, register_layout
from kiln.passes.quant.transforms import AddmmToLinear
from kiln.passes.quant.lower import FoldDequantizedWeights, LowerQuantized
from kiln.passes.autodiff import JointBackward, joint_program
from kiln.passes.sparsity import Prune, Sparsify
from kiln.passes.complex import LowerComplex

__all__ = [
    "PASSES", "Pass", "PassError", "PipelineError", "add_constant", "clone_program", "lookup_pass", "option",
    "register_pass", "Match", "RewritePass", "constant", "current_op", "pattern", "producer", "users", "value_of",
    "DEFAULT_PIPELINE", "PassManager", "load_plugin", "parse_pipeline", "run", "Decompose", "Canonicalize",
    "FoldConstants", "CommonSubexpressionElimination", "DeadCodeElimination", "FoldBatchNorm", "TrimConvolutionTaps",
    "RemoveDropout",
    "RecognizeGelu", "GroupQueryAttention",
    "FUSE_ATTRIBUTE", "FuseActivations", "LAYOUTS", "Prepack", "register_layout", "AddmmToLinear",
    "FoldDequantizedWeights", "LowerQuantized", "JointBackward", "joint_program", "Prune", "Sparsify",
    "LowerComplex",
]
