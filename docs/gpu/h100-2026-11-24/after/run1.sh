# call 1: generation, HellaSwag, GPU checks, sample.py; each part logged under $OUT
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python -c "import torch, triton; print(torch.__version__, torch.version.cuda, torch.backends.cudnn.version(), triton.__version__)"; } > $OUT/env.txt 2>&1
python -c "
import torch; torch.manual_seed(0)
from model import GPT, GPTConfig
GPT(GPTConfig(vocab_size=50304)).save_pretrained('rand_124M')" > $OUT/save.log 2>&1
timeout 140 python bench.py --only generation --out $OUT/generation.md > $OUT/generation.log 2>&1
timeout 100 python dev/bench_hellaswag.py .gpu/hellaswag_val.jsonl --batch_size 64 --repeat 3 > $OUT/hs_bench.log 2>&1
timeout 45 python hellaswag.py --model rand_124M --data .gpu/hellaswag_val.jsonl > $OUT/hellaswag_cli.log 2>&1
timeout 170 python -m pytest tests/test_gpu.py -n 0 -q -x > $OUT/test_gpu.log 2>&1
timeout 60 python sample.py --model rand_124M --num_samples 8 --max_new_tokens 256 > $OUT/sample8.log 2>&1
timeout 50 python dev/bench_hellaswag.py .gpu/hellaswag_val.jsonl --batch_size 64 --repeat 2 --no_cudnn > $OUT/hs_bench_nocudnn.log 2>&1
tail -n 6 $OUT/*.log $OUT/generation.md
