import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_bench_cpu_smoke(tmp_path):
    """The whole ladder but torch.compile (minutes to compile on 2 cores; the training tests cover it)."""
    out = tmp_path / "bench.md"
    r = subprocess.run([sys.executable, "bench.py", "--skip", "compile", "--steps", "1", "--warmup", "1",
                        "--out", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    report = out.read_text()
    rows = re.findall(r"^\| (\+ [^|]+|fp32, eager) \| ([\d.]+) \| ([\d,]+) \| n/a \| n/a \| ([\d.]*x?) \|$", report, re.M)
    assert [name for name, *_ in rows] == ["fp32, eager", "+ TF32 matmuls", "+ bf16 autocast", "+ flash attention",
                                           "+ vocab 50304", "+ fused AdamW"]
    for name, ms, tok_s, speedup in rows:
        assert float(ms) > 0 and int(tok_s.replace(",", "")) > 0 and (speedup or name == "fp32, eager")
    assert "identical tokens: True" in report and "model.py estimate" in report


def test_bench_bad_rung():
    r = subprocess.run([sys.executable, "bench.py", "--skip", "warp"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "rungs are fp32, tf32, bf16, compile, flash, vocab, fused" in r.stderr
