"""The sweep's load and interpreter stages for every architecture in tests/models/hf_zoo.py (benchmarks/hf_sweep.py
runs all stages and writes the table in docs/models.md): torch.export with dynamic dims, saved, loaded by kiln in a
process where torch cannot be imported, and run on the interpreter at both sizes against torch eager."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.models.hf_zoo import (ARCHITECTURES, KNOWN_GAPS, expected_outputs, export_to_folder,  # noqa: E402
                                 run_in_kiln, stage_mismatch)


@pytest.mark.slow
@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.xfail(reason=KNOWN_GAPS[name], strict=True))
                                  if name in KNOWN_GAPS else name for name in ARCHITECTURES])
def test_every_architecture_loads_and_interprets(name, tmp_path):
    architecture = ARCHITECTURES[name]
    model = architecture.model()
    export_to_folder(architecture, model, tmp_path)
    report, stderr = run_in_kiln(tmp_path, ["interpreter"])
    assert all(error is None for error in report["stages"].values()), (report["stages"], stderr)
    expected = expected_outputs(architecture, model)
    mismatch = stage_mismatch(tmp_path, "interpreter", expected)
    assert mismatch is None, mismatch
