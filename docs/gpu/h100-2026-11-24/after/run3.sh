# call 3: generation (all rows), HellaSwag without Dynamo's import, training memory at B=64, the peer at B=64
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
python -c "
import torch; torch.manual_seed(0)
from model import GPT, GPTConfig
GPT(GPTConfig(vocab_size=50304)).save_pretrained('rand_124M')" > $OUT/save.log 2>&1
timeout 160 python bench.py --only generation --out $OUT/generation.md > $OUT/generation.log 2>&1
timeout 40 python dev/bench_hellaswag.py .gpu/hellaswag_val.jsonl --batch_size 64 --repeat 2 > $OUT/hs_bench.log 2>&1
timeout 30 python hellaswag.py --model rand_124M --data .gpu/hellaswag_val.jsonl > $OUT/hellaswag_cli.log 2>&1
PYTHONPATH=. timeout 100 python .gpu/mem.py 64 > $OUT/mem.log 2>&1
timeout 250 python .gpu/peer_bench.py --B 64 --rounds 1 --steps 20 > $OUT/peer_bench.log 2>&1
for f in $OUT/*.log; do echo "== $f"; tail -n 3 $f | cut -c1-300; done; tail -5 $OUT/generation.md
