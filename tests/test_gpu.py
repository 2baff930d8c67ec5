"""gpu_check's claims, asserted on an NVIDIA GPU (`python bench.py --report DIR` runs this file and keeps its
output and each check's detail). Skipped without CUDA; test_bench.py runs the parts a CPU can."""
import pytest
import torch

from gptlib import gpu_check, runtime

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def test_a_fused_attention_kernel_is_used(record_property):
    ok, detail = gpu_check.check_attention(runtime.setup("cuda"))
    record_property("detail", detail)
    assert ok, detail


def test_triton_softmax_is_compiled_and_matches_torch(record_property):
    ok, detail = gpu_check.check_softmax()
    record_property("detail", detail)
    assert ok, detail


def test_compiled_nccl_run_with_evaluations(tmp_path, record_property):
    results = gpu_check.check_training_run("cuda", str(tmp_path))
    record_property("detail", "; ".join(f"{name}: {'ok' if ok else 'FAILED'} ({detail})"
                                        for name, ok, detail in results))
    assert len(results) == 7 and all(ok for _, ok, _ in results), results


def test_graphed_generation_is_exact_and_never_waits(record_property):
    ok, detail = gpu_check.check_generation(runtime.setup("cuda"))
    record_property("detail", detail)
    assert ok, detail
