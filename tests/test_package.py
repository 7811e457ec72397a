"""`import kiln` makes every public subpackage reachable, as `import torch` does torch.export and torch.onnx."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import kiln

PUBLIC = sorted(module.name for module in pkgutil.iter_modules(kiln.__path__) if not module.name.startswith("_"))


def test_every_public_subpackage_is_an_attribute_after_import_kiln():
    probe = ("import sys, kiln\n"
             f"for name in {PUBLIC!r}:\n"
             "    module = getattr(kiln, name)\n"
             "    assert module is sys.modules['kiln.' + name], name\n"
             "ep = kiln.export(kiln.nn.Linear(4, 2), (kiln.randn(3, 4),))\n"
             "kiln.passes.run(ep, 'decompose,canonicalize,cse,dce')\n"
             "assert kiln.models.get('mlp').name == 'mlp'\n"
             "assert kiln.compile is kiln.compiler.compile\n")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert {"cli", "models", "passes", "runtime", "testing", "onnx"} <= set(PUBLIC)


def test_heavy_subpackages_load_on_first_use():
    probe = "import sys, kiln; print(' '.join(sorted(m for m in sys.modules if m.startswith('kiln.'))))"
    loaded = set(subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
                 .stdout.split())
    assert not loaded & {"kiln.passes", "kiln.models", "kiln.cli", "kiln.onnx", "kiln.codegen.onnx", "kiln.runtime"}


def test_unknown_attribute_is_an_attribute_error():
    try:
        kiln.no_such_thing
    except AttributeError as error:
        assert "no_such_thing" in str(error)
    else:
        raise AssertionError("kiln.no_such_thing resolved")
    assert "passes" in dir(kiln) and "compile" in dir(kiln)


def test_pyproject_applies_without_setuptools_warnings():
    """Installing printed setuptools' deprecation of `project.license` as a table; the SPDX string is the form."""
    pyprojecttoml = pytest.importorskip("setuptools.config.pyprojecttoml")
    from setuptools.dist import Distribution

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = pyprojecttoml.apply_configuration(Distribution(), Path(__file__).resolve().parents[1] / "pyproject.toml")
    assert [str(w.message) for w in caught] == []
    assert dist.metadata.license_expression == "Apache-2.0"
