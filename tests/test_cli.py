"""The `kiln` command: version, op table, errors with exit code 2."""

from __future__ import annotations

import json
import subprocess
import sys

import kiln
from kiln.cli.main import main
from kiln.ir.core_ops import CORE_ATEN_OPS
from kiln.ir.registry import REGISTRY


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kiln.cli.main", *args], capture_output=True, text=True)


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0 and result.stdout.strip() == f"kiln {kiln.__version__}"


def test_ops_table_lists_every_op(capsys):
    assert main(["ops", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["op"] for r in rows} == set(REGISTRY)
    by_name = {r["op"]: r for r in rows}
    assert by_name["aten.add.Tensor"]["schema"] == "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
    assert "interpreter" in by_name["aten.add.Tensor"]["lowered_by"]
    assert "decomposes" in by_name["aten.linear.default"]["lowered_by"]
    assert sum(r["kind"] == "core" for r in rows) == len(CORE_ATEN_OPS & set(REGISTRY))


def test_ops_filter_and_human_table(capsys):
    assert main(["ops", "relu"]) == 0
    out = capsys.readouterr().out
    assert "aten.relu.default" in out and "aten.add.Tensor" not in out


def test_bad_command_exits_2_with_hint():
    result = run_cli("frobnicate")
    assert result.returncode == 2
    assert "invalid choice" in result.stderr and "kiln --help" in result.stderr
