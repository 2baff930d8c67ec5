"""A CORE eval bundle in DCLM's layout built from local files, for timing core_eval.py without the network:
HellaSwag zero-shot and 10-shot (multiple choice, from hellaswag_val.jsonl, as DCLM's hellaswag.jsonl holds
it: query, choices, gold; 10,042 each), LAMBADA-like tasks zero- and 10-shot (language modelling: a line of
input.txt, then its last word; 5,000 each) and a Winograd-like one (schema: two contexts, one continuation;
1,267): 31,351 examples, about a third of CORE's ~91k with its heaviest task, the shapes the H200 run of
2026-11-26 measured. --n N keeps at most N of each task. Not DCLM's data: its scores mean nothing, its shapes
(prompt lengths, options, shots) are CORE's.

    python dev/make_core_bundle.py hellaswag_val.jsonl core_bench            # the full size
    python dev/make_core_bundle.py hellaswag_val.jsonl core_small --n 500
    python core_eval.py --model log/model_000150.pt --bundle core_bench --device cpu
    python core_eval.py --model log/model_000150.pt --bundle core_bench --device cpu --unbatched
"""
import argparse
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# core.yaml's first line, for its reader (core_eval.py knows such a bundle by its tasks' category, bench)
MARK = "made_by: dev/make_core_bundle.py  # not DCLM's data: its CORE means nothing"


def write(path, rows):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("hellaswag", help="hellaswag_val.jsonl")
    parser.add_argument("out", help="the bundle's folder")
    parser.add_argument("--n", type=int, default=None, help="at most N examples per task (default: all)")
    args = parser.parse_args()
    n = args.n or 10 ** 9
    with open(args.hellaswag, encoding="utf-8") as f:
        hs = [json.loads(line) for _, line in zip(range(n), f)]
    with open(os.path.join(ROOT, "input.txt"), encoding="utf-8") as f:
        lines = [line.strip() for line in f if len(line.split()) >= 6]
    n_lm, n_schema = min(n, 5000), min(n, 1267)
    mc = [{"query": ex["ctx"], "choices": ex["endings"], "gold": int(ex["label"])} for ex in hs]
    lm = [{"context": " ".join(line.split()[:-1]), "continuation": line.split()[-1]}
          for line in lines[:2 * n_lm]]
    skip = 2 * n_lm  # the schema task's lines come after the language modelling ones
    schema = [{"context_options": [lines[skip + i], lines[skip + n_schema + i]],
               "continuation": "and so it ends.", "gold": i % 2} for i in range(n_schema)]
    at = "language_understanding/"
    tasks = [("hellaswag_zeroshot", "multiple_choice", 0, " ", 25.0, at + "hellaswag.jsonl", mc),
             ("hellaswag", "multiple_choice", 10, " ", 25.0, at + "hellaswag.jsonl", mc),
             ("lambada_like", "language_modeling", 0, " ", 0.0, at + "lambada_like.jsonl", lm[:n_lm]),
             ("lambada_like_10shot", "language_modeling", 10, " ", 0.0, at + "lambada_like_10.jsonl",
              lm[n_lm:]),
             ("winograd_like", "schema", 0, " ", 50.0, at + "winograd_like.jsonl", schema)]
    config = [MARK, "icl_tasks:"]
    meta = ["Eval Task,Task Category,Task Type,#shots,#datapoints,Random baseline"]
    for label, kind, shots, delim, baseline, uri, rows in tasks:
        config += [f"- label: {label}", f"  dataset_uri: {uri}", f"  num_fewshot: [{shots}]",
                   f"  icl_task_type: {kind}", f"  continuation_delimiter: {json.dumps(delim)}"]
        meta.append(f"{label},bench,{kind},{shots},{len(rows)},{baseline}")
        write(os.path.join(args.out, "eval_data", uri), rows)
    with open(os.path.join(args.out, "core.yaml"), "w", encoding="utf-8") as f:
        f.write("\n".join(config) + "\n")
    with open(os.path.join(args.out, "eval_meta_data.csv"), "w", encoding="utf-8") as f:
        f.write("\n".join(meta) + "\n")
    print(f"{args.out}: {len(tasks)} tasks, {sum(len(t[-1]) for t in tasks):,} examples "
          f"({', '.join(f'{t[0]}: {len(t[-1]):,}' for t in tasks)})")


if __name__ == "__main__":
    main()
