"""`kiln inspect FILE`: what a .pt2, .onnx or compiled package holds: inputs/outputs with symbolic shapes and
ranges, the op histogram, parameter count and bytes, and (packages) peak temporary memory as a formula. Reads the
files' metadata only: no program is built or run."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import Counter
from pathlib import Path
from typing import Any

from kiln.ir.errors import KilnError
from kiln.ir.files import path_inside


def register(commands: Any) -> None:
    """Add the `inspect` subcommand to the `kiln` parser's subcommands."""
    parser = commands.add_parser("inspect", help="show a model file's or compiled package's inputs, outputs, "
                                 "ops, weights and memory",
                                 description="Summarize a model file or a package directory written by "
                                 "kiln.compile. Example: kiln inspect model.pt2")
    parser.add_argument("file", help="a .pt2 (torch.export / kiln.save) or .onnx file, or a compiled package "
                        "directory")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(handler=_inspect_command)


def _inspect_command(args: argparse.Namespace) -> int:
    summary = inspect_file(args.file)
    print(json.dumps(summary, indent=2) if args.json else format_summary(summary))
    return 0


def inspect_file(path: str | Path) -> dict[str, Any]:
    """A summary dict: format, inputs, outputs, symbols, weights; ops for model files, memory for packages."""
    path = Path(path)
    if not path.exists():
        raise KilnError(f"no such file: {path}")
    if path.is_dir():
        return _inspect_package(path)
    if not path.is_file():  # a device or a pipe would be read forever
        raise KilnError(f"{path} is not a regular file", fix="pass a .pt2 or .onnx file or a package directory")
    if path.suffix == ".onnx":
        return _inspect_onnx(path)
    return _inspect_pt2(path)


# ---------------------------------------------------------------------------------------------
# .pt2

def _inspect_pt2(path: Path) -> dict[str, Any]:
    from kiln.ir.serde import archive, formats
    from kiln.ir.serde.archive import ArchiveReader
    from kiln.ir.serde.reader import check_schema_version, skipped_entries
    from kiln.ir.serde.safe_json import load_json
    from kiln.ir.serde.symexpr import parse_srepr
    from kiln.ir.serde.writer import KILN_SYMBOLS_KEY

    reader = ArchiveReader(path)
    try:
        document = load_json(reader.read(archive.MODELS_FILENAME_FORMAT.format("model")), "models/model.json")
        check_schema_version(document)
        module = document["graph_module"]
        metadata = module.get("metadata") or {}
        rename = json.loads(metadata[KILN_SYMBOLS_KEY]) if KILN_SYMBOLS_KEY in metadata else {}
        graph = module["graph"]
        values = graph.get("tensor_values") or {}

        def describe(name: str) -> str:
            meta = values.get(name)
            if meta is None:
                return "?"
            dims = [str(d["as_int"]) if "as_int" in d else str(parse_srepr(d["as_expr"]["expr_str"], rename))
                    for d in meta["sizes"]]
            return f"{formats.dtype_of_code(meta['dtype']).short}[{', '.join(dims)}]"

        inputs, outputs = [], []
        for spec in module["signature"]["input_specs"]:
            kind, body = next(iter(spec.items()))
            if kind == "user_input":
                name = next(iter(body["arg"].values()))["name"]
                inputs.append({"name": name, "type": describe(name)})
        for spec in module["signature"]["output_specs"]:
            kind, body = next(iter(spec.items()))
            arg = body["arg"]
            name = arg["name"] if "name" in arg else next(iter(arg.values())).get("name", "?")
            outputs.append({"name": name, "type": describe(name), "kind": kind})
        ops: Counter[str] = Counter()

        def count(nodes: list[Any]) -> None:
            for node in nodes:
                ops[node["target"].replace("torch.ops.", "", 1)] += 1
                for entry in node.get("inputs", []):
                    if "as_graph" in entry.get("arg", {}):
                        count(entry["arg"]["as_graph"]["graph"]["nodes"])
        count(graph["nodes"])
        symbols = {rename.get(name, name): [bounds.get("min_val"), bounds.get("max_val")]
                   for name, bounds in (document.get("range_constraints") or {}).items()}
        weights = _pt2_weights(reader, archive, load_json, formats)
        return {"file": str(path), "format": "pt2", "torch_version": document.get("torch_version"),
                "schema_version": document.get("schema_version"), "inputs": inputs, "outputs": outputs,
                "symbols": symbols, "ops": dict(ops.most_common()), "weights": weights,
                "not_read": skipped_entries(reader)}
    finally:
        reader.close()


def _pt2_weights(reader: Any, archive: Any, load_json: Any, formats: Any) -> dict[str, Any]:
    totals = {"parameters": [0, 0, 0], "buffers": [0, 0, 0], "constants": [0, 0, 0]}  # tensors, values, bytes
    for config_format, group in ((archive.WEIGHTS_CONFIG_FILENAME_FORMAT, None),
                                 (archive.CONSTANTS_CONFIG_FILENAME_FORMAT, "constants")):
        path = config_format.format("model")
        if not reader.has(path):
            continue
        for entry in load_json(reader.read(path), path).get("config", {}).values():
            meta = entry["tensor_meta"]
            elements = math.prod(d.get("as_int", 0) for d in meta["sizes"])
            key = group or ("parameters" if entry.get("is_param") else "buffers")
            totals[key][0] += 1
            totals[key][1] += elements
            totals[key][2] += elements * formats.dtype_of_code(meta["dtype"]).numpy.itemsize
    return {key: {"tensors": t, "values": v, "bytes": b} for key, (t, v, b) in totals.items()}


# ---------------------------------------------------------------------------------------------
# .onnx

def _inspect_onnx(path: Path) -> dict[str, Any]:
    try:
        import onnx
        from onnx import helper
    except ImportError as error:
        raise KilnError("inspecting .onnx files needs the onnx package", fix="pip install onnx") from error
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as error:  # onnx raises DecodeError and friends
        raise KilnError(f"{path} is not a readable ONNX model: {error}") from error
    if not model.HasField("graph"):
        raise KilnError(f"{path} holds no ONNX graph, so it is not an ONNX model",
                        fix="pass a model file an ONNX exporter wrote")
    graph = model.graph
    initializers = {i.name for i in graph.initializer}

    def describe(value: Any) -> str:
        tensor = value.type.tensor_type
        dims = [d.dim_param or str(d.dim_value) for d in tensor.shape.dim]
        try:
            dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name
        except Exception:
            dtype = str(tensor.elem_type)
        return f"{dtype}[{', '.join(dims)}]"

    ops: Counter[str] = Counter()

    pending = [iter(graph.node)]  # a stack, not recursion: If/Loop/Scan bodies may nest without limit
    while pending:
        node = next(pending[-1], None)
        if node is None:
            pending.pop()
            continue
        ops[f"{node.domain + '.' if node.domain else ''}{node.op_type}"] += 1
        subgraphs = [attribute.g for attribute in node.attribute if attribute.g is not None and attribute.g.node]
        for subgraph in subgraphs:
            for tensor in subgraph.initializer:
                _onnx_initializer_bytes(path, tensor)
        pending += [iter(subgraph.node) for subgraph in reversed(subgraphs)]
    values = size = 0
    for tensor in graph.initializer:
        values += math.prod(tensor.dims)
        size += _onnx_initializer_bytes(path, tensor)
    symbols = sorted({d.dim_param for v in graph.input for d in v.type.tensor_type.shape.dim if d.dim_param})
    return {"file": str(path), "format": "onnx",
            "opsets": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "inputs": [{"name": v.name, "type": describe(v)} for v in graph.input if v.name not in initializers],
            "outputs": [{"name": v.name, "type": describe(v), "kind": "user_output"} for v in graph.output],
            "symbols": {name: [None, None] for name in symbols}, "ops": dict(ops.most_common()),
            "weights": {"initializers": {"tensors": len(graph.initializer), "values": values, "bytes": size}}}


def _onnx_initializer_bytes(path: Path, tensor: Any) -> int:
    """An initializer's size in bytes, after checking that its dims, element type and data hold together and that
    external data lies inside the model's folder (external data is never read)."""
    from onnx import TensorProto, helper
    dims, fix = list(tensor.dims), "the file is damaged or not genuine; export the model again"
    try:
        itemsize = helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        raise KilnError(f"{path}: initializer {tensor.name!r} has the unknown element type {tensor.data_type}",
                        fix=fix) from None
    if any(d < 0 for d in dims):
        raise KilnError(f"{path}: initializer {tensor.name!r} has negative dims {dims}", fix=fix)
    values = math.prod(dims)
    if tensor.data_location == TensorProto.EXTERNAL:
        location = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
        if path_inside(path.parent, location) is None:
            raise KilnError(f"{path}: initializer {tensor.name!r} keeps its data at {location!r}, outside the "
                            "model's folder", fix="keep external data files beside the model (onnx.save_model "
                            "with save_as_external_data and a relative location)")
        return values * itemsize
    if tensor.data_type == TensorProto.STRING:  # no fixed size per value
        return values * itemsize
    nibbles = tensor.data_type in (TensorProto.INT4, TensorProto.UINT4, TensorProto.FLOAT4E2M1)  # two per byte
    if tensor.raw_data:
        held, needed = len(tensor.raw_data), -(-values // 2) if nibbles else values * itemsize
    else:
        held = sum(len(field) for field in (tensor.float_data, tensor.int32_data, tensor.int64_data,
                                            tensor.double_data, tensor.uint64_data))
        pairs = tensor.data_type in (TensorProto.COMPLEX64, TensorProto.COMPLEX128)
        needed = held if nibbles else values * (2 if pairs else 1)
    if held != needed:
        raise KilnError(f"{path}: initializer {tensor.name!r} declares dims {dims} ({values} values) but its data "
                        f"holds {held} {'bytes' if tensor.raw_data else 'values'}, not {needed}", fix=fix)
    return values * itemsize


# ---------------------------------------------------------------------------------------------
# compiled package (a directory with manifest.json, see docs/c-backend.md)

def _inspect_package(path: Path) -> dict[str, Any]:
    from kiln.ir import dtypes
    from kiln.ir.errors import ParseError
    from kiln.ir.symbolic import parse_dim

    manifest_path = path / "manifest.json"
    recompile = "recompile it with kiln.compile(program, output=DIR) or `kiln compile`"
    if not manifest_path.is_file():
        raise KilnError(f"{path} is a directory without manifest.json, so not a kiln package",
                        fix=f"pass a .pt2/.onnx file or a package directory ({recompile})")
    from kiln.runtime.package import read_manifest
    manifest = read_manifest(path)  # size and nesting checked before parsing
    try:
        if manifest.get("format") not in PACKAGE_FORMATS:
            raise KilnError(f"{manifest_path} is not a kiln package manifest (format {manifest.get('format')!r})",
                            fix=recompile)

        def describe(entry: dict[str, Any]) -> str:
            return f"{dtypes.dtype(entry['dtype']).short}[{', '.join(str(d) for d in entry['shape'])}]"

        inputs = [{"name": i["name"], "type": describe(i)} for i in manifest["inputs"]]
        outputs = [{"name": o["name"], "type": describe(o), "kind": "user_output"} for o in manifest["outputs"]]
        symbols = {s["name"]: [s["lower"], s["upper"]] for s in manifest["symbols"]}
        states = [{"name": s["name"], "type": describe(s)} for s in manifest.get("states", [])]
        weights = manifest["weights"]
        totals = {"tensors": len(weights), "values": sum(math.prod(w["shape"]) for w in weights),
                  "bytes": sum(w["nbytes"] for w in weights)}
        packed = [w for w in weights if "packed_from" in w]  # laid out by the compiler for the micro-kernels
        if packed:
            totals["packed"] = {"tensors": len(packed), "bytes": sum(w["nbytes"] for w in packed),
                                "for": str(manifest.get("cpu_capability"))}
        memory = manifest.get("memory")  # absent in packages from before memory planning
        if memory is not None:
            memory = {key: memory[key] for key in ("arena_bytes", "unplanned_bytes", "slots", "temps")}
            memory["scratch_bytes_per_thread"] = list(manifest["memory"].get("scratch_bytes_per_thread", []))
            memory["packed_weight_bytes"] = int(manifest["memory"].get("packed_weight_bytes", 0))
            for formula in [memory["arena_bytes"], memory["unplanned_bytes"], *memory["scratch_bytes_per_thread"]]:
                parse_dim(formula)
    except ParseError as error:
        raise KilnError(f"{manifest_path} has a malformed size formula: {error}", fix=recompile) from error
    except KilnError:
        raise
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        raise KilnError(f"{manifest_path} is malformed ({type(error).__name__}: {error})", fix=recompile) from error
    return {"file": str(path), "format": manifest["format"], "abi_version": manifest.get("abi_version"),
            "inputs": inputs, "outputs": outputs, "states": states, "symbols": symbols,
            "weights": {"weights.bin": totals},
            "memory": memory, "kernels": _package_kernels(path_inside(path, manifest.get("source")))}


PACKAGE_FORMATS = ("kiln-c-package", "kiln-triton-package")
# The comment each kernel's source starts with: `/* kind: ops */` (C) or `# kind: ops` (Triton)
_KERNEL_COMMENT = re.compile(r"^(?:/\* |# )(\w+): ([\w.]+(?:, [\w.]+)*)(?: \*/)?$", re.M)


def _package_kernels(source: Path | None) -> list[dict[str, str]]:
    """The kernels a package's source defines (kind and the ops each fuses), in run order; [] without a source (or
    with one named outside the package folder, which is never read)."""
    if source is None or not source.is_file():
        return []
    try:
        text = source.read_text()
    except (OSError, UnicodeDecodeError):
        return []
    return [{"kind": kind, "ops": ops} for kind, ops in _KERNEL_COMMENT.findall(text)]


def _memory_lines(memory: dict[str, Any] | None, symbols: dict[str, list]) -> list[str]:
    if memory is None:
        return ["peak temporary memory: unknown (the package predates memory planning; recompile it)"]
    lines = [f"peak temporary memory: {memory['arena_bytes']} bytes",
             f"  naive (no reuse): {memory['unplanned_bytes']} bytes; "
             f"{memory['slots']} arena slots for {memory['temps']} temporaries"]
    if symbols and all(upper is not None for _, upper in symbols.values()):
        from kiln.ir.symbolic import evaluate_dim, parse_dim, symbol
        bindings = {symbol(name): upper for name, (_, upper) in symbols.items()}
        at = ", ".join(f"{name}={upper}" for name, (_, upper) in symbols.items())
        peak = evaluate_dim(parse_dim(memory["arena_bytes"]), bindings)
        lines.append(f"  at the largest sizes ({at}): {_bytes(peak)}")
    scratch = memory.get("scratch_bytes_per_thread") or []
    if scratch:
        largest = scratch[0] if len(scratch) == 1 else f"max({', '.join(scratch)})"
        lines.append(f"  plus per-thread GEMM scratch: {largest} bytes")
    if memory.get("packed_weight_bytes"):
        lines.append(f"packed weight panels (allocated once, at load): {_bytes(memory['packed_weight_bytes'])}")
    return lines


# ---------------------------------------------------------------------------------------------

def _bytes(count: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1024  # type: ignore[assignment]
    return str(count)


def format_summary(summary: dict[str, Any]) -> str:
    lines = [f"{summary['file']}: {summary['format']}"]
    if summary["format"] == "kiln-c-package":
        lines[0] += f" (ABI {summary.get('abi_version')})"
    if summary["format"] == "pt2":
        version = summary.get("schema_version") or {}
        lines[0] += f" (torch {summary.get('torch_version')}, schema {version.get('major')}.{version.get('minor')})"
    lines.append("inputs:")
    lines += [f"  {i['name']}: {i['type']}" for i in summary["inputs"]]
    lines.append("outputs:")
    lines += [f"  {o['name']}: {o['type']}" + ("" if o["kind"] == "user_output" else f"  ({o['kind']})")
              for o in summary["outputs"]]
    if summary.get("states"):
        lines.append("state (buffers the model keeps from run to run):")
        lines += [f"  {state['name']}: {state['type']}" for state in summary["states"]]
    if summary["symbols"]:
        lines.append("symbols:")
        for name, (lower, upper) in summary["symbols"].items():
            lines.append(f"  {name}: [{'?' if lower is None else lower}, {'inf' if upper is None else upper}]"
                         if summary["format"] != "onnx" else f"  {name}")
    if "ops" in summary:
        total = sum(summary["ops"].values())
        lines.append(f"ops ({total} nodes, {len(summary['ops'])} kinds):")
        width = max((len(name) for name in summary["ops"]), default=0)
        lines += [f"  {name:<{width}}  {count}" for name, count in summary["ops"].items()]
    lines.append("weights:")
    for group, info in summary["weights"].items():
        lines.append(f"  {group}: {info['tensors']} tensors, {info['values']:,} values, {_bytes(info['bytes'])}")
        if "packed" in info:
            packed = info["packed"]
            lines.append(f"    of which {packed['tensors']} packed by the compiler for {packed['for']}'s GEMM "
                         f"tiles (mapped, not copied, at load): {_bytes(packed['bytes'])}")
    if summary["format"] in PACKAGE_FORMATS:
        lines += _memory_lines(summary["memory"], summary["symbols"])
        kernels = summary.get("kernels") or []
        lines.append(f"kernels ({len(kernels)}):")
        lines += [f"  {number}. {k['kind']}: {k['ops']}" for number, k in enumerate(kernels)]
        code = "native code (model.so)" if summary["format"] == "kiln-c-package" else "code (model.py)"
        lines.append(f"trust: loading this package runs its {code}, as unpickling would; load only packages you "
                     "trust")
    if summary.get("not_read"):
        lines.append("not read:")
        lines += [f"  {name}: {why}" for name, why in summary["not_read"].items()]
    return "\n".join(lines)
