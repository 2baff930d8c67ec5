"""fused_softmax.softmax against torch.softmax, in Triton's interpreter on CPU (TRITON_INTERPRET=1)."""
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")
pytestmark = pytest.mark.slow  # every test here starts processes or compiles
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CHECK = r"""
import torch
from gptlib import fused_softmax
torch.manual_seed(0)
cases = [torch.randn(1, 1), torch.randn(3, 7), torch.randn(17, 1000) * 30, torch.randn(2, 5000),
         torch.randn(4, 64)[:, :50],  # strided rows
         torch.tensor([[0.0, float("-inf"), 1.0], [float("-inf"), 2.0, float("-inf")]])]
for x in cases:
    ref = torch.softmax(x.float(), dim=-1)
    for name, fn in (("triton", fused_softmax.softmax), ("naive", fused_softmax.naive_softmax)):
        y = fn(x)
        assert y.shape == x.shape and y.dtype == x.dtype, name
        assert torch.allclose(y, ref, atol=1e-6, rtol=1e-5), (name, tuple(x.shape), (y - ref).abs().max())
x = torch.randn(5, 300).to(torch.bfloat16)
y = fused_softmax.softmax(x)
assert y.dtype == torch.bfloat16 and torch.allclose(y.float(), torch.softmax(x.float(), -1), atol=1e-2)
for bad, match in ((torch.randn(2, 3, 4), "2-D"), (torch.randn(4, 3).t(), "contiguous rows"),
                   (torch.randn(1, 70000), "exceed 65536")):
    try:
        fused_softmax.softmax(bad)
        raise AssertionError("no error for " + match)
    except ValueError as e:
        assert match in str(e), e
print("ok")
"""


def test_triton_softmax_matches_torch_in_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    r = subprocess.run([sys.executable, "-c", CHECK], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr[-3000:]


def test_bench_softmax_section_in_interpreter():
    """bench.py's softmax section (CUDA-only in bench.py itself) runs and checks the kernel, here on CPU."""
    code = "import bench; print('\\n'.join(bench.softmax_bandwidth('cpu', ((8, 100), (3, 1500)), reps=1)))"
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "TRITON_INTERPRET": "1"},
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]
    lines = r.stdout.splitlines()
    assert lines[0].startswith("softmax, fp32") and "memory bandwidth unknown" in lines[0]
    for i, shape in ((1, "8 x 100"), (5, "3 x 1500")):
        assert lines[i].startswith(f"  {shape} (Triton vs torch.softmax: max |difference| ")
        assert float(lines[i].rsplit(" ", 1)[1].rstrip(")")) < 1e-6
        assert [line.split(":")[0].strip() for line in lines[i + 1:i + 4]] == ["naive "
                                                                               "PyTorch", "torch.softmax",
                                                                              "Triton fused"]
