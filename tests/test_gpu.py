"""What we claim on an NVIDIA GPU, checked there (bench.py --gpu-check runs the same checks and reports them):
flash attention is the kernel SDPA runs, the Triton softmax is compiled and correct, and a compiled torchrun
run (NCCL) with evaluations recompiles nothing at later evaluations and uses fused AdamW and TF32. Skipped
without CUDA; tests/test_bench.py and test_train.py run the parts a CPU can."""
import pytest
import torch

import bench

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_flash_attention_is_the_kernel_used():
    ok, detail = bench.check_flash("cuda")
    assert ok, detail


def test_triton_softmax_is_compiled_and_matches_torch():
    ok, detail = bench.check_softmax()
    assert ok, detail


def test_compiled_nccl_run_with_evaluations(tmp_path):
    results = bench.check_training_run("cuda", str(tmp_path))
    assert len(results) == 7 and all(ok for _, ok, _ in results), results
