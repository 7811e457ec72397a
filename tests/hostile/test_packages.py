"""Hostile compiled C packages: kiln.runtime.load refuses each with a KilnError before any native code of the package
runs, and never opens or dlopens a path outside the package folder."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import kiln
import kiln.runtime
from kiln.codegen.c import ABI_VERSION
from kiln.ir.errors import InputError, KilnError
from kiln.runtime.package import _ABI_FUNCTIONS
from tests.hostile.support import opened_paths, opened_under

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")


def _edit(package: Path, change: Callable[[dict], Any]) -> None:
    manifest = json.loads((package / "manifest.json").read_text())
    change(manifest)
    (package / "manifest.json").write_text(json.dumps(manifest))


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """A manifest edit setting the entry at `path` ("weights.0.offset") to `value`, or deleting it when value is
    _DELETE."""
    def change(manifest: dict) -> None:
        *parents, last = [int(part) if part.isdigit() else part for part in path.split(".")]
        for part in parents:
            manifest = manifest[part]
        if value is _DELETE:
            del manifest[last]
        else:
            manifest[last] = value
    return change


_DELETE = object()


def _refused(package: Path, match: str) -> str:
    """Load `package`, expecting a one-line KilnError matching `match` with a fix; nothing outside it is opened."""
    with opened_paths() as opened, pytest.raises(KilnError, match=match) as raised:
        kiln.runtime.load(package)
    assert "\n" not in raised.value.cause and raised.value.fix
    outside = [path for path in opened if "/" in path and not opened_under([path], package)
               and not path.endswith((".py", ".pyc")) and path not in _SYSTEM_FILES]
    assert outside == []
    return str(raised.value)


_SYSTEM_FILES = ("/proc/cpuinfo",)  # read to know the CPU's capabilities


def _shared_library(folder: Path, source: str, name: str = "lib.so") -> Path:
    folder.mkdir(exist_ok=True)
    (folder / "lib.c").write_text(source)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(folder / name), str(folder / "lib.c")], check=True)
    return folder / name


def _marking_library(folder: Path, marker: Path, build_id: str = "", leave_out: str = "",
                     abi_version: int = ABI_VERSION) -> Path:
    """A library with no load-time code whose every function, if ever called, creates `marker`: it exports the
    kiln ABI except `leave_out`, and claims `build_id` and `abi_version`."""
    functions = [f"int {name}(void) {{ mark(); return 0; }}" for name in _ABI_FUNCTIONS
                 if name not in (leave_out, "kiln_build_id", "kiln_abi_version")]
    source = "\n".join([
        "#include <stdio.h>",
        f'static void mark(void) {{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}',
        f'const char* kiln_build_id(void) {{ mark(); return "{build_id}"; }}' if leave_out != "kiln_build_id" else "",
        f"int kiln_abi_version(void) {{ mark(); return {abi_version}; }}" if leave_out != "kiln_abi_version" else "",
        *functions])
    return _shared_library(folder, source)


def _evil_library(folder: Path, marker: Path) -> Path:
    """A library that creates `marker` as soon as it is dlopened (its constructor)."""
    return _shared_library(folder, f'#include <stdio.h>\n__attribute__((constructor)) static void pwn(void) '
                                   f'{{ FILE* f = fopen("{marker}", "w"); if (f) fclose(f); }}\n', "evil.so")


def test_the_genuine_package_loads_and_runs(genuine, package):
    program, _ = genuine
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    with opened_paths() as opened:
        model = kiln.runtime.load(package)
    np.testing.assert_allclose(model(x), np.asarray(program(x)), rtol=1.3e-6, atol=1e-5)
    # the record the other tests rely on sees the loader's opens: weights.bin (mapped) and model.so (dlopened)
    assert {Path(path).name for path in opened_under(opened, package)} >= {"weights.bin", "model.so"}


# ---------------------------------------------------------------------------------------------
# manifest vs weights.bin


@pytest.mark.parametrize("change, match", [
    (_set("weights.0.nbytes", 4), "does not fit"),
    (_set("weights.0.nbytes", 1 << 62), "does not fit"),
    (_set("weights.1.offset", 1 << 40), "does not fit"),
    (_set("weights.1.shape", [1 << 31, 1 << 31, 16]), "does not fit"),
    (_set("weights.0.offset", -64), "non-negative integer"),
    (_set("weights.0.offset", "0"), "non-negative integer"),
    (_set("weights.0.nbytes", 8.0), "non-negative integer"),
    (_set("weights.0.shape", [-2]), "malformed shape"),
    (_set("weights.0.shape", ["2"]), "malformed shape"),
    (_set("weights.0.shape", 2), "must be a list"),
    (_set("weights.0.dtype", "float99"), "unknown dtype"),
    (_set("weights.0.dtype", "object"), "unknown dtype"),
    (_set("weights.0.bits", 7), "bits per value"),
    (_set("weights.0.name", None), "must be a string"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_manifest_disagreeing_with_the_weights_is_refused(package, change, match):
    _edit(package, change)
    _refused(package, match)


def test_truncated_weights_file_is_refused(package):
    blob = package / "weights.bin"
    blob.write_bytes(blob.read_bytes()[:-10])
    _refused(package, "does not fit")


def test_empty_weights_file_is_refused(package):
    (package / "weights.bin").write_bytes(b"")
    _refused(package, "0-byte weights file")


# ---------------------------------------------------------------------------------------------
# files named outside the package folder: never opened, never dlopened


@pytest.mark.parametrize("name", ["../outside/evil.so", "{outside}/evil.so", "sub/../../outside/evil.so",
                                  "..\\outside\\evil.so", "", "."])
def test_library_outside_the_folder_is_never_dlopened(package, tmp_path, name):
    marker = tmp_path / "pwned"
    _evil_library(tmp_path / "outside", marker)
    _edit(package, _set("library", name.format(outside=tmp_path / "outside")))
    with opened_paths() as opened:
        _refused(package, "outside the package folder")
    assert not marker.exists()
    assert opened_under(opened, tmp_path / "outside") == []


def test_library_symlink_escaping_the_folder_is_never_dlopened(package, tmp_path):
    marker = tmp_path / "pwned"
    evil = _evil_library(tmp_path / "outside", marker)
    (package / "model.so").unlink()
    (package / "model.so").symlink_to(evil)
    with opened_paths() as opened:
        _refused(package, "outside the package folder")
    assert not marker.exists() and opened_under(opened, tmp_path / "outside") == []


@pytest.mark.parametrize("name", ["../outside/weights.bin", "{outside}/weights.bin", "/etc/passwd", "/dev/zero"])
def test_weights_file_outside_the_folder_is_never_opened(package, tmp_path, name):
    (tmp_path / "outside").mkdir()
    shutil.copy(package / "weights.bin", tmp_path / "outside" / "weights.bin")
    _edit(package, _set("weights_file", name.format(outside=tmp_path / "outside")))
    with opened_paths() as opened:
        _refused(package, "outside the package folder")
    assert opened_under(opened, tmp_path / "outside") == [] and name not in opened


def test_weights_symlink_escaping_the_folder_is_never_opened(package, tmp_path):
    (tmp_path / "outside").mkdir()
    shutil.move(package / "weights.bin", tmp_path / "outside" / "weights.bin")
    (package / "weights.bin").symlink_to(tmp_path / "outside" / "weights.bin")
    with opened_paths() as opened:
        _refused(package, "outside the package folder")
    assert opened_under(opened, tmp_path / "outside") == []


def test_a_symlink_inside_the_folder_is_followed(genuine, package):
    (package / "data").mkdir()
    shutil.move(package / "weights.bin", package / "data" / "weights.bin")
    (package / "weights.bin").symlink_to(package / "data" / "weights.bin")
    x = np.ones((2, 3), np.float32)
    np.testing.assert_allclose(kiln.runtime.load(package)(x), np.asarray(genuine[0](x)), rtol=1.3e-6, atol=1e-5)


@pytest.mark.parametrize("file", ["weights.bin", "model.so"])
def test_a_missing_or_special_file_is_refused(package, file):
    (package / file).unlink()
    _refused(package, "missing or not a regular file")
    (package / file).mkdir()
    _refused(package, "missing or not a regular file")


# ---------------------------------------------------------------------------------------------
# the library: swapped, foreign, missing functions, other ABI


def test_model_so_of_another_package_is_refused_by_build_id(package, other_package):
    shutil.copy(other_package / "model.so", package / "model.so")
    _refused(package, "was not built from this package's model.c .build id: ")


def test_library_missing_kiln_run_is_refused_before_any_of_it_runs(package, tmp_path):
    marker = tmp_path / "called"
    build_id = json.loads((package / "manifest.json").read_text())["build_id"]
    library = _marking_library(tmp_path / "fake", marker, build_id=build_id, leave_out="kiln_run")
    shutil.copy(library, package / "model.so")
    _refused(package, "does not export kiln_run")
    assert not marker.exists()


def test_library_of_another_abi_version_is_refused(package, tmp_path):
    build_id = json.loads((package / "manifest.json").read_text())["build_id"]
    library = _marking_library(tmp_path / "fake", tmp_path / "called", build_id=build_id, abi_version=99)
    shutil.copy(library, package / "model.so")
    _refused(package, f"ABI version: 99 in the library, {ABI_VERSION} in manifest.json")


def test_manifest_of_another_abi_version_is_refused(package):
    _edit(package, _set("abi_version", 2))
    _refused(package, f"has ABI version 2, this kiln reads {ABI_VERSION}")


@pytest.mark.parametrize("content", [b"", b"\x7fELF" + bytes(60), b"#!/bin/sh\necho pwned\n"])
def test_a_library_that_is_not_one_is_refused(package, content):
    (package / "model.so").write_bytes(content)
    _refused(package, "cannot load model.so")


def test_renamed_input_is_refused_by_the_library_names(package):
    _edit(package, _set("inputs.0.name", "y"))
    _refused(package, "input names: \\['x'\\] in the library, \\['y'\\] in manifest.json")


def test_an_output_the_library_does_not_allocate_is_refused(package):
    # a manifest claiming the run allocates an output (ABI 5's kiln_allocated_output) that the library writes into
    # the caller's array would hand the library a struct to write a whole tensor into
    _edit(package, _set("outputs.0.data_dependent", True))
    _refused(package, "outputs it allocates: \\[False\\] in the library, \\[True\\] in manifest.json")


def test_an_output_sized_by_unknown_symbols_is_refused(package):
    _edit(package, _set("outputs.0.shape", ["u0", "3"]))
    _refused(package, "malformed dim")
    _edit(package, _set("outputs.0.data_dependent", True))
    _refused(package, "malformed dim")  # a data-dependent output's sizes are named in data_dependent_symbols
    _edit(package, _set("data_dependent_symbols", [{"name": "batch"}]))
    _refused(package, "data-dependent symbol 0 has the malformed name 'batch'")  # not a caller's symbol


# ---------------------------------------------------------------------------------------------
# symbols: bad ranges refused at load, sizes outside them refused at call


@pytest.mark.parametrize("change, match", [
    (_set("symbols.0.lower", 9), "range \\[9, 8\\]"),
    (_set("symbols.0.lower", -1), "range \\[-1, 8\\]"),
    (_set("symbols.0.upper", 1 << 63), "< 2\\*\\*63"),
    (_set("symbols.0.lower", True), "integer or null"),
    (_set("symbols.0.upper", "64"), "integer or null"),
    (_set("symbols.0.name", "__import__('os').system('true')"), "malformed name"),
    (_set("inputs.0.shape", ["batch*", "3"]), "malformed dim"),
    (_set("inputs.0.shape", ["seq", "3"]), "malformed dim"),
    (_set("inputs.0.shape", ["batch", 3]), "malformed dim"),
    (_set("inputs.0.shape", ["batch", "-3"]), "malformed dim"),
    (_set("outputs.0.dtype", "float128"), "unknown dtype"),
], ids=lambda value: value if isinstance(value, str) else None)
def test_malformed_symbols_and_dims_are_refused(package, change, match):
    _edit(package, _set("symbols.0.upper", 8))
    _edit(package, change)
    _refused(package, match)


def test_calls_outside_the_manifest_ranges_are_refused_before_native_code(package):
    _edit(package, _set("symbols.0.upper", 8))  # narrower than the library's plan: still safe, and enforced
    model = kiln.runtime.load(package)
    for batch in (0, 9, 65):
        with pytest.raises(InputError, match="outside the range of symbol batch"):
            model(np.ones((batch, 3), np.float32))
    assert model(np.ones((8, 3), np.float32)).shape == (8, 2)


def test_a_symbol_range_without_bounds_means_none(genuine, package):
    """A range's bound may be null or absent (the checks allowed both; the loader read an absent one as a KeyError):
    the library's own plan still bounds the call."""
    _edit(package, _set("symbols.0.lower", _DELETE))
    _edit(package, _set("symbols.0.upper", _DELETE))
    model = kiln.runtime.load(package)
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(model(x), genuine[0](x), rtol=1.3e-6, atol=1e-5)
    with pytest.raises(KilnError, match="symbol batch = 100 is outside its range"):
        model(np.ones((100, 3), np.float32))


def test_manifests_changed_at_random_places_run_or_are_refused(genuine, tmp_path):
    """tests/serde/mutate.py's mutations on the manifest (a key deleted, a value of another type, a name swapped,
    an entry repeated or dropped): each package loads and runs, or is refused with a KilnError."""
    import copy
    import random

    from tests.serde.mutate import mutate
    original, rng, escapes = json.loads((genuine[1] / "manifest.json").read_text()), random.Random(0), []
    for number in range(300):
        folder = Path(shutil.copytree(genuine[1], tmp_path / f"pkg{number}"))
        document = copy.deepcopy(original)
        changes = [mutate(document, rng) for _ in range(rng.choice([1, 1, 2]))]
        (folder / "manifest.json").write_text(json.dumps(document))
        try:
            model = kiln.runtime.load(folder)
            try:
                model(np.ones((3, 3), np.float32))
            except KilnError:
                pass
        except KilnError:
            pass
        except Exception as error:  # noqa: BLE001  (what the test is for)
            escapes.append(f"{type(error).__name__}: {error} after {changes}")
        shutil.rmtree(folder)
    assert not escapes, "\n".join(escapes[:5])


def test_a_manifest_range_wider_than_the_library_is_refused_by_kiln_run(package):
    _edit(package, _set("symbols.0.upper", 10_000))  # the library's memory plan assumed batch <= 64
    model = kiln.runtime.load(package)
    with pytest.raises(KilnError, match="symbol batch = 100 is outside its range"):
        model(np.ones((100, 3), np.float32))


# ---------------------------------------------------------------------------------------------
# malformed manifests: KilnError, never KeyError / TypeError / AttributeError / RecursionError


@pytest.mark.parametrize("text, match", [
    (b"", "not valid JSON"),
    (b'{"format": ', "not valid JSON"),
    (b"\xff\xfe garbage", "not valid JSON"),
    (b"[]", "is a JSON list, not an object"),
    (b'"kiln-c-package"', "is a JSON str"),
    (b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
])
def test_unreadable_manifests_are_refused(package, text, match):
    (package / "manifest.json").write_bytes(text)
    _refused(package, match)


@pytest.mark.parametrize("key", ["weights", "symbols", "inputs", "outputs", "library", "weights_file", "build_id"])
def test_a_missing_manifest_key_is_refused(package, key):
    _edit(package, _set(key, _DELETE))
    _refused(package, f"manifest key {key!r} must be")


@pytest.mark.parametrize("key, value, match", [
    ("format", _DELETE, "format null, not one of kiln-c-package"),
    ("format", ["kiln-c-package"], r'format \["kiln-c-package"\], not one of'),
    ("weights", {"a": 1}, "'weights' must be a list"),
    ("weights", [1, 2], "'weights' must be a list of objects"),
    ("inputs", "x", "'inputs' must be a list"),
    ("outputs", None, "'outputs' must be a list"),
    ("symbols", [[]], "'symbols' must be a list of objects"),
    ("library", 5, "'library' must be a string"),
    ("build_id", 123, "'build_id' must be a string"),
    ("abi_version", str(ABI_VERSION), f"ABI version {ABI_VERSION}, this kiln reads {ABI_VERSION}"),
    ("cpu_capability", ["AVX2"], "was built for \\['AVX2'\\]"),
])
def test_wrong_json_types_are_refused(package, key, value, match):
    _edit(package, _set(key, value))
    _refused(package, match)


def test_missing_manifest_is_refused(package):
    (package / "manifest.json").unlink()
    _refused(package, "cannot read the package manifest")


def test_kiln_run_refuses_a_hostile_package_with_exit_2(package, tmp_path, capsys):
    from tests.hostile.support import cli_error
    np.save(tmp_path / "x.npy", np.ones((2, 3), np.float32))
    _edit(package, _set("library", "../../../../../../usr/lib/libc.so.6"))
    line = cli_error(capsys, "run", str(package), "--input", f"x={tmp_path / 'x.npy'}")
    assert "outside the package folder" in line


def test_loading_and_running_write_nothing_into_the_package(package):
    before = {path.name: path.stat().st_mtime_ns for path in package.iterdir()}
    kiln.runtime.load(package)(np.ones((1, 3), np.float32))
    assert {path.name: path.stat().st_mtime_ns for path in package.iterdir()} == before


# ---------------------------------------------------------------------------------------------
# kiln inspect PACKAGE reads the manifest only, and says what loading would do


def test_inspect_says_loading_runs_native_code(package, capsys):
    from kiln.cli.main import main
    assert main(["inspect", str(package)]) == 0
    trust = [line for line in capsys.readouterr().out.splitlines() if line.startswith("trust:")]
    assert trust == ["trust: loading this package runs its native code (model.so), as unpickling would; load only "
                     "packages you trust"]


@pytest.mark.parametrize("source", ["../outside/model.c", "{outside}/model.c", "/etc/passwd", "/dev/zero"])
def test_inspect_never_reads_a_source_named_outside_the_package(package, tmp_path, capsys, source):
    from kiln.cli.inspect import inspect_file
    (tmp_path / "outside").mkdir()
    shutil.copy(package / "model.c", tmp_path / "outside" / "model.c")
    _edit(package, _set("source", source.format(outside=tmp_path / "outside")))
    with opened_paths() as opened:
        summary = inspect_file(package)
    assert summary["kernels"] == [] and opened_under(opened, tmp_path / "outside") == []
    assert source not in opened


@pytest.mark.parametrize("text, match", [
    (b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
    (b"[1, 2]", "is a JSON list, not an object"),
    (b'{"format": "kiln-c-package", "inputs": 5}', "is malformed"),
    (b'{"format": "kiln-c-package", "inputs": [], "outputs": [], "symbols": [], "weights": [{"shape": "x"}]}',
     "is malformed"),
])
def test_inspect_refuses_malformed_manifests(package, capsys, text, match):
    from tests.hostile.support import cli_error
    (package / "manifest.json").write_bytes(text)
    assert re.search(match, cli_error(capsys, "inspect", str(package)))


# ---------------------------------------------------------------------------------------------
# state: the buffers a program mutates, which the model keeps; the runtime views them by the manifest's shapes


def _accumulating_program() -> Any:
    """A program keeping a 4 x 3 float32 buffer that each run adds its input to."""
    torch = pytest.importorskip("torch")

    class Accumulate(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(4, 3))

        def forward(self, x):
            self.total.add_(x)
            return self.total * 2

    return kiln.from_torch(Accumulate(), (torch.ones(4, 3),))


@pytest.fixture(scope="module")
def stateful(tmp_path_factory) -> Path:
    """The accumulating program's C package."""
    folder = tmp_path_factory.mktemp("stateful") / "pkg"
    kiln.compile(_accumulating_program(), output=folder)
    return folder


@pytest.mark.parametrize("change, match", [
    (_set("states.0.shape", [400, 3]), "state sizes: \\[48\\] in the library, \\[4800\\] in manifest.json"),
    (_set("states.0.dtype", "float64"), "state sizes: \\[48\\] in the library, \\[96\\] in manifest.json"),
    (_set("states", []), "number of states: 1 in the library, 0 in manifest.json"),
    (_set("states.0.name", "other"), "state names: \\['total'\\] in the library, \\['other'\\] in manifest.json"),
    (_set("states.0.shape", [4, -3]), "malformed shape"),
    (_set("states.0.shape", "4x3"), "must be a list"),
], ids=["bigger", "wider dtype", "none", "renamed", "negative dim", "not a list"])
def test_a_state_the_library_does_not_keep_is_refused(stateful, tmp_path, change, match):
    """The runtime reads and writes a state buffer through a view of the manifest's size: a manifest claiming more
    than the library allocated would let it read and write outside the model's memory."""
    package = Path(shutil.copytree(stateful, tmp_path / "pkg"))
    _edit(package, change)
    _refused(package, match)


@pytest.mark.parametrize("package", ["stateful", "stateful_triton"])
def test_the_genuine_stateful_package_keeps_its_state(package, request):
    model = kiln.runtime.load(request.getfixturevalue(package))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for step in (1, 2):
        np.testing.assert_array_equal(model(x), 2 * step * x)
    np.testing.assert_array_equal(dict(model.named_buffers())["total"], 2 * x)


@pytest.fixture(scope="module")
def stateful_triton(tmp_path_factory) -> Path:
    """The accumulating program's Triton package."""
    pytest.importorskip("triton")
    folder = tmp_path_factory.mktemp("stateful_triton") / "pkg"
    kiln.compile(_accumulating_program(), target="triton", output=folder)
    return folder


@pytest.mark.parametrize("change, match", [
    (_set("states.0.shape", [400, 3]), r"state 'total' has no float32\[400, 3\] values in weights.bin"),
    (_set("states.0.dtype", "float64"), r"state 'total' has no float64\[4, 3\] values in weights.bin"),
    (_set("states.0.name", "other"), r"state 'other' has no float32\[4, 3\] values in weights.bin"),
    (_set("states.0.shape", [4, -3]), "malformed shape"),
], ids=["bigger", "wider dtype", "renamed", "negative dim"])
def test_a_triton_state_without_its_values_is_refused(stateful_triton, tmp_path, change, match):
    """Triton kernels index the state as compiled: a manifest whose state does not match its stored values would let
    them read and write past the tensor."""
    package = Path(shutil.copytree(stateful_triton, tmp_path / "pkg"))
    _edit(package, change)
    _refused(package, match)
