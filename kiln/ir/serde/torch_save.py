"""torch.save's file format, written without torch: the example inputs a .pt2 carries in data/sample_inputs/.

The file is a zip (root `archive/`) holding `data.pkl`, a protocol-2 pickle emitted here opcode by opcode from plain
values (tuple, list, dict, None, bool, int, float, str) and arrays, and one `data/<key>` file of raw little-endian
bytes per tensor, which the pickle names by persistent id exactly as torch.save does. kiln only writes this format.
"""

from __future__ import annotations

import io
import struct
from typing import Any

import numpy as np

from kiln.ir.serde.archive import ArchiveWriter
from kiln.ir.serde.errors import SerdeError

# torch/storage.py `_dtype_to_storage_type_map`: these dtypes are pickled as typed (legacy) storages ...
LEGACY_STORAGES = {
    "float64": "DoubleStorage", "float32": "FloatStorage", "float16": "HalfStorage", "bfloat16": "BFloat16Storage",
    "int64": "LongStorage", "int32": "IntStorage", "int16": "ShortStorage", "int8": "CharStorage",
    "uint8": "ByteStorage", "bool": "BoolStorage", "complex128": "ComplexDoubleStorage",
    "complex64": "ComplexFloatStorage",
}
# ... and these as an UntypedStorage (numel counted in bytes) plus the dtype, through _rebuild_tensor_v3.
UNTYPED_STORAGE_DTYPES = {"uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                          "float8_e5m2fnuz"}

STORAGE_ALIGNMENT = 64  # torch.save's default (torch.utils.serialization.config.save.storage_alignment)
TORCH_SAVE_VERSION = "3\n"  # what PyTorchFileWriter writes in `version` for a plain torch.save
FORMAT_VERSION = "1"


class _Pickler:
    """Protocol-2 opcodes for the values torch.save writes in (args, kwargs); tensors become storages."""

    def __init__(self) -> None:
        self.out = io.BytesIO()
        self.storages: list[bytes] = []

    def emit(self, opcodes: bytes) -> None:
        self.out.write(opcodes)

    def global_(self, module: str, name: str) -> None:
        self.emit(b"c" + module.encode() + b"\n" + name.encode() + b"\n")

    def string(self, text: str) -> None:
        data = text.encode("utf-8")
        self.emit(b"X" + struct.pack("<I", len(data)) + data)

    def integer(self, value: int) -> None:
        if 0 <= value < 256:
            self.emit(b"K" + struct.pack("<B", value))
        elif 0 <= value < 65536:
            self.emit(b"M" + struct.pack("<H", value))
        elif -(1 << 31) <= value < (1 << 31):
            self.emit(b"J" + struct.pack("<i", value))
        else:  # LONG1: little-endian two's complement
            data = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.emit(b"\x8a" + struct.pack("<B", len(data)) + data)

    def tuple_of(self, items: Any) -> None:
        items = list(items)
        if len(items) > 3:
            self.emit(b"(")
        for item in items:
            self.value(item)
        self.emit({0: b")", 1: b"\x85", 2: b"\x86", 3: b"\x87"}.get(len(items), b"t"))

    def value(self, value: Any) -> None:
        if hasattr(value, "__kiln_array__"):
            value = value.__kiln_array__()
        if isinstance(value, np.generic):
            value = value.item()
        if value is None:
            self.emit(b"N")
        elif isinstance(value, bool):
            self.emit(b"\x88" if value else b"\x89")
        elif isinstance(value, int):
            self.integer(value)
        elif isinstance(value, float):
            self.emit(b"G" + struct.pack(">d", value))
        elif isinstance(value, str):
            self.string(value)
        elif isinstance(value, np.ndarray):
            self.tensor(value)
        elif type(value) is tuple:
            self.tuple_of(value)
        elif type(value) is list:
            self.emit(b"]")
            if value:
                self.emit(b"(")
                for item in value:
                    self.value(item)
                self.emit(b"e")  # APPENDS
        elif type(value) is dict:
            self.emit(b"}")
            if value:
                self.emit(b"(")
                for key, item in value.items():
                    self.value(key)
                    self.value(item)
                self.emit(b"u")  # SETITEMS
        else:
            raise SerdeError(f"an example input of type {type(value).__name__} has no torch.save encoding in kiln "
                             "(it writes tensors, None, bool, int, float, str, and tuples, lists and dicts of them)",
                             fix="pass plain containers of tensors as the example inputs, or save without them")

    def tensor(self, array: np.ndarray) -> None:
        from kiln.ir.serde.writer import tensor_bytes
        name = array.dtype.name  # numpy's and ml_dtypes' names are torch's (bfloat16, float8_e4m3fn)
        if name not in LEGACY_STORAGES and name not in UNTYPED_STORAGE_DTYPES:
            raise SerdeError(f"an example input of dtype {name} has no torch.save encoding in kiln")
        array = np.array(array, order="C", copy=not array.flags.c_contiguous)  # ascontiguousarray makes 0-d 1-d
        key = str(len(self.storages))
        self.storages.append(tensor_bytes(array))
        legacy = name in LEGACY_STORAGES
        self.global_("torch._utils", "_rebuild_tensor_v2" if legacy else "_rebuild_tensor_v3")
        self.emit(b"(")
        # persistent id: ('storage', storage type, key, location, numel); torch.load looks up data/<key>
        self.emit(b"(")
        self.string("storage")
        if legacy:
            self.global_("torch", LEGACY_STORAGES[name])
        else:
            self.global_("torch.storage", "UntypedStorage")
        self.string(key)
        self.string("cpu")
        self.integer(int(array.size) if legacy else int(array.nbytes))
        self.emit(b"tQ")  # TUPLE, BINPERSID
        self.integer(0)  # storage offset
        self.tuple_of(int(d) for d in array.shape)
        strides, running = [], 1
        for dim in reversed(array.shape):
            strides.append(running)
            running *= max(int(dim), 1)  # torch's contiguous strides treat an empty dim as size 1
        self.tuple_of(reversed(strides))
        self.emit(b"\x89")  # requires_grad=False
        self.global_("collections", "OrderedDict")  # backward hooks: OrderedDict()
        self.emit(b")R")
        if not legacy:
            self.global_("torch", name)
        self.emit(b"tR")  # TUPLE, REDUCE


def torch_save_bytes(obj: Any) -> bytes:
    """The bytes `torch.save(obj, buffer, pickle_protocol=2)` writes for plain containers of arrays (kiln Tensors,
    numpy arrays) and Python scalars; `torch.load(..., weights_only=True)` reads them back as torch tensors."""
    pickler = _Pickler()
    pickler.emit(b"\x80\x02")  # PROTO 2
    pickler.value(obj)
    pickler.emit(b".")
    writer = ArchiveWriter("archive", alignment=STORAGE_ALIGNMENT)  # torch.save's record order
    writer.add("data.pkl", pickler.out.getvalue())
    writer.add(".format_version", FORMAT_VERSION)
    writer.add(".storage_alignment", str(STORAGE_ALIGNMENT))
    writer.add("byteorder", "little")
    for key, data in enumerate(pickler.storages):
        writer.add(f"data/{key}", data)
    writer.add("version", TORCH_SAVE_VERSION)
    writer.add(".data/serialization_id", writer.serialization_id())
    return writer.to_bytes()


def check_example_inputs(example_inputs: Any, in_spec: Any) -> tuple[tuple, dict]:
    """(args, kwargs) with the structure the program was exported with, as torch's example_inputs setter demands."""
    if not (isinstance(example_inputs, tuple) and len(example_inputs) == 2 and isinstance(example_inputs[0], tuple)
            and isinstance(example_inputs[1], dict)):
        raise SerdeError("example inputs must be (args, kwargs): a tuple of the positional arguments and a dict of "
                         f"the keyword arguments, got {type(example_inputs).__name__}",
                         fix="pass example_inputs=((x,), {}) for one positional input")
    if in_spec is not None:
        from kiln.ir.pytree import check_structure
        check_structure(in_spec, example_inputs, "example inputs")  # an InputError naming both structures
    return example_inputs
