"""gpu_check's claims, asserted on an NVIDIA GPU (`python bench.py --gpu-check` reports the same checks).
Skipped without CUDA; test_train.py and test_bench.py run the parts a CPU can."""
import pytest
import torch

import gpu_check
import runtime

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_a_fused_attention_kernel_is_used():
    ok, detail = gpu_check.check_attention(runtime.setup("cuda"))
    assert ok, detail


def test_triton_softmax_is_compiled_and_matches_torch():
    ok, detail = gpu_check.check_softmax()
    assert ok, detail


def test_compiled_nccl_run_with_evaluations(tmp_path):
    results = gpu_check.check_training_run("cuda", str(tmp_path))
    assert len(results) == 7 and all(ok for _, ok, _ in results), results


def test_graphed_generation_is_exact_and_never_waits():
    ok, detail = gpu_check.check_generation(runtime.setup("cuda"))
    assert ok, detail
