"""Op definitions, one module per family; importing this package registers every op."""

from kiln.ir.ops import (  # noqa: F401  (imported for registration)
    pointwise,
    reduction,
    shape,
    indexing,
    linalg,
    nn,
    factory,
    composite,
    backward,
    misc,
    symbolic,
    quant,
    complex,
    fft,
    sparse,  # last: it attaches sparse rules to the ops above
)
