# call 2: generation after the per-layer cache and bf16 weights; HellaSwag's cold start; training memory; peer
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
python -c "
import torch; torch.manual_seed(0)
from model import GPT, GPTConfig
GPT(GPTConfig(vocab_size=50304)).save_pretrained('rand_124M')" > $OUT/save.log 2>&1
timeout 120 python bench.py --only generation --out $OUT/generation.md > $OUT/generation.log 2>&1
timeout 50 python sample.py --model rand_124M --num_samples 8 --max_new_tokens 256 > $OUT/sample8.log 2>&1
timeout 50 python sample.py --model rand_124M --num_samples 1 --max_new_tokens 256 > $OUT/sample1.log 2>&1
timeout 60 python dev/bench_hellaswag.py .gpu/hellaswag_val.jsonl --batch_size 64 --repeat 2 > $OUT/hs_bench.log 2>&1
timeout 40 python hellaswag.py --model rand_124M --data .gpu/hellaswag_val.jsonl > $OUT/hellaswag_cli.log 2>&1
timeout 60 python -m pytest tests/test_gpu.py -n 0 -q -x -k generation > $OUT/test_gpu.log 2>&1
PYTHONPATH=. timeout 120 python .gpu/mem.py 64 > $OUT/mem.log 2>&1
timeout 200 python .gpu/peer_bench.py --B 64 --rounds 1 --steps 20 > $OUT/peer_bench.log 2>&1
for f in $OUT/*.log; do echo "== $f"; tail -n 3 $f | cut -c1-400; done; cat $OUT/generation.md | tail -5
