# call 4: HellaSwag with padded_lengths (the grouping that pads the fewest tokens)
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/.."
git log -1 --format=%h > $OUT/commit.txt 2>&1
python -c "
import torch; torch.manual_seed(0)
from model import GPT, GPTConfig
GPT(GPTConfig(vocab_size=50304)).save_pretrained('rand_124M')" > $OUT/save.log 2>&1
timeout 40 python dev/bench_hellaswag.py .gpu/hellaswag_val.jsonl --batch_size 64 --repeat 3 > $OUT/hs_bench.log 2>&1
timeout 30 python hellaswag.py --model rand_124M --data .gpu/hellaswag_val.jsonl > $OUT/hellaswag_cli.log 2>&1
cat $OUT/hs_bench.log; tail -c 200 $OUT/hellaswag_cli.log
