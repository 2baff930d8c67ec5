"""Every GPU figure docs/speed.md quotes, from one command: `python bench.py --report DIR`.

Each section below runs in its own process (a crash or an out-of-memory in one loses no other), its output
kept as DIR/<section>.log, its result as DIR/<section>.json; DIR/report.md is written again after each
section: the GPU, the versions, the date, the commit and every command, each section's wall time and how
much of it was compiling and warming up, then what each section measured. Every section compiles into one
Inductor cache, DIR/inductor_cache, so a graph one section compiled is a cache hit in the next (the script's
step, ours in the peer's rounds and the levers' default are the step section's). A rerun into the same DIR
runs only the sections it does not hold for this commit and device, so a report stopped by --budget is
finished by the next call. On a CPU the same sections run at a tiny size (the test suite does, so the
command cannot rot): the figures then mean nothing.
"""
import contextlib
import datetime
import glob
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

import torch

from gptlib.checkpoint import checkpoints
from gptlib.errors import UserError
from gptlib.runlog import metrics_path, nearest_existing, read_log
from gptlib.runtime import device_name, git_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repo: gptlib/..


def sections(out, cuda, device, hellaswag_data, peer=None):
    """[(name, title, argv)] in the order they run, docs/speed.md's plan of three calls of `--budget 560`:
    what decides, in the first two (the checks, the training step at B=64, llm.c's reference where --peer
    names it, generation; the levers), then the rest (the ladder, the script, HellaSwag, CORE). On a CPU:
    tiny sizes, no compile (minutes on 2 cores)."""
    py, dev = sys.executable, ["--device", device]
    data = ["--hellaswag_data", hellaswag_data] if hellaswag_data else []
    few = [] if cuda else ["--steps", "1", "--warmup", "1"]
    quick = few + ([] if cuda else ["--skip", "compile"])
    # evaluations before the last step's, the first cold and a later one warm: their difference is the
    # evaluations' compiling, which warming() counts (the one after the last step has no next step to time it)
    script = (["--max_steps=10", "--warmup_steps=5", "--eval_interval=4", "--val_tokens=16384"] if cuda else
              ["--device=cpu", "--compile=False", "--n_layer=2", "--n_head=4", "--n_kv_head=4", "--n_embd=64",
               "--T=64", "--warmup_steps=1", "--B=4", "--total_batch_size=512", "--max_steps=4",
               "--eval_interval=1", "--val_tokens=256"])
    peer_B, peer_T = (64, 1024) if cuda else (8, 64)

    def bench(name, *args):
        return [py, "bench.py", *args, *dev, "--out", os.path.join(out, f"{name}.md")]
    return [  # the first call
        ("checks", "GPU checks (tests/test_gpu.py)",
         [py, "-m", "pytest", "tests/test_gpu.py", "-v", "-n0", "-rA", "-p", "no:cacheprovider",
          "-o", "junit_family=legacy",  # the details the tests record go into the XML without a warning
          f"--junitxml={os.path.join(out, 'checks.xml')}"]),
        ("step", "the compiled step at B=64, train_gpt2.py's micro-batch" if cuda else "the step",
         bench("step", "--only", "step", *quick)),
        *([] if peer is None else [
            ("peer", f"train_gpt2.py against llm.c's PyTorch reference at B={peer_B}, T={peer_T}, in turns, "
                     "the same shards",
             bench("peer", "--only", "peer", "--peer", peer, "--B", str(peer_B), "--T", str(peer_T), *few))]),
        ("generation", "generation, batch 1 and 8, --span at batch 8, where a decode step's time goes",
         bench("generation", "--only", "generation")),
        # the second call: the levers, a section each (a long compile stopped by --budget loses no other's)
        *[(name, f"{what}, A/B'd in turns against the step" + (" at B=64" if cuda else ""),
           bench(name, "--only", "levers", "--levers", levers, *quick)) for name, what, levers in [
            ("levers", "the levers: SDPA forced to each fused backend", "flash,cudnn,efficient"),
            ("tuning", "the lever coordinate_descent_tuning", "coordinate"),
            ("autotune", "the lever max-autotune-no-cudagraphs (a compile of 3 min at most)", "autotune")]],
        # the third call
        ("training", ("the ladder at B=16" if cuda else "the ladder") + " and where its last rung's time "
                     "goes, memory (the estimates against its peak and an eager step's), the softmax "
                     "kernel's GB/s",
         bench("training", "--only", "training,memory,softmax", *quick)),
        # the step at B=64 again, as a user runs it: its graphs are the step section's (a cache hit)
        ("script", "train_gpt2.py's default recipe, its first 10 steps (B=64 x 8 micro-steps), evaluating "
                   "every 4" if cuda else "train_gpt2.py, a tiny model's first steps, evaluating every step",
         [py, "train_gpt2.py", "--data_root=input.txt", "--hellaswag=0", "--checkpoint_interval=1000",
          f"--log_dir={os.path.join(out, 'script_log')}", *script]),
        ("hellaswag", "HellaSwag, cold and warm", bench("hellaswag", "--only", "hellaswag", *data)),
        ("core", "CORE on dev/make_core_bundle.py's bundle, 16 examples a forward",
         bench("core", "--only", "core", *data))]


def environment(device, commit):
    """What ran: the device, the versions, the date and the commit."""
    driver = None
    if torch.device(device).type == "cuda":
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=30).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):  # no nvidia-smi: the driver goes unnamed
            pass
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    if commit is None:
        commit, dirty = git_state()
        commit = commit and commit + (" with local changes" if dirty else "")
    return {"device": device_name(device), "driver": driver, "python": platform.python_version(),
            "torch": torch.__version__, "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "triton": triton_version, "commit": commit or "unknown (not a git checkout: pass --commit)",
            "date": datetime.date.today().isoformat()}


def run_section(argv, log_path, deadline, cache, session=True):
    """Run argv from the project root, its output into log_path (and on to ours), compiling into the
    Inductor cache folder `cache`; the exit status, or None if it was stopped at the deadline. All it started
    ends with it: in a session of its own, every process group of it (a lever's compile's too); without
    `session` (a lever's compile, inside a section), its process group."""
    with open(log_path, "w") as log:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TORCHINDUCTOR_CACHE_DIR": cache}
        p = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             errors="replace", env=env, start_new_session=session,
                             preexec_fn=None if session else os.setpgrp)

        def copy():  # a line at a time: the log holds what ran even if we are killed
            for line in p.stdout:
                log.write(line)
                log.flush()
                sys.stdout.write(line)
                sys.stdout.flush()
        reader = threading.Thread(target=copy, daemon=True)
        reader.start()
        try:  # the deadline holds while the section prints nothing (a compile, the peer's rounds)
            return p.wait(timeout=None if deadline is None else max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            return None
        finally:  # the deadline, Ctrl-C, or what the section left running: nothing of ours stays
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)  # first: it starts no other group
            for pid in (int(path[6:]) for path in glob.glob("/proc/[0-9]*")):
                with contextlib.suppress(OSError):  # a process that ended meanwhile
                    if os.getsid(pid) == p.pid:
                        os.killpg(os.getpgid(pid), signal.SIGKILL)
            p.wait()
            reader.join()


def warming(name, out):
    """Seconds a finished section spent compiling and warming up, or None where it cannot say (the checks):
    bench.py's last line says it; the script's records, script_warming."""
    if name == "script":
        return script_warming(metrics_path(os.path.join(out, "script_log")))
    with open(os.path.join(out, f"{name}.log")) as f:  # run_section wrote it
        found = re.findall(r"^compiling and warm-up: (\d+(?:\.\d+)?) s$", f.read(), re.M)
    return float(found[-1]) if found else None


def script_warming(log_path):
    """train_gpt2.py's compiling and warming up from its metrics.jsonl: its first step over the median of the
    later ones, and its first evaluation over the median of the later ones (an evaluation's time: from its
    step's record to the next step's, less that step), or None without two of each. Never negative: an
    eager run's first step may be its fastest."""
    steps = logged_steps(log_path)
    evaluated = {r["step"] for r in read_log(log_path) if "val_loss" in r}
    ms = [r["ms"] / 1000 for r in steps]
    evaluations = [after["elapsed"] - before["elapsed"] - after["ms"] / 1000
                   for before, after in zip(steps, steps[1:]) if before["step"] in evaluated]
    if len(ms) < 2 or len(evaluations) < 2:
        return None
    return sum(max(0.0, times[0] - statistics.median(times[1:])) for times in (ms, evaluations))


def logged_steps(log_path):
    """train_gpt2.py's step records in a metrics.jsonl."""
    return [r for r in read_log(log_path) if "loss" in r and "event" not in r]


def summary(name, out):
    """The lines report.md shows for a finished section: bench.py's markdown (without its title), the
    checks' results, or the training script's steps."""
    if name == "checks":
        return check_results(os.path.join(out, "checks.xml"))
    if name == "script":
        return script_steps(metrics_path(os.path.join(out, "script_log")))
    path = os.path.join(out, f"{name}.md")
    if not os.path.exists(path):
        return ["(no output: see the log)"]
    with open(path) as f:
        return f.read().splitlines()[2:]  # bench.py's title and blank line


def check_results(xml_path):
    """Each test of the junit XML pytest wrote: its outcome and the detail it recorded."""
    if not os.path.exists(xml_path):
        return ["(pytest wrote no results: see the log)"]
    lines = ["| test | result | detail |", "| --- | --- | --- |"]
    counts = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        outcome = next((tag for tag in ("failure", "error", "skipped") if case.find(tag) is not None),
                       "passed")
        counts[outcome] = counts.get(outcome, 0) + 1
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        detail = props.get("detail") or (case.find(outcome).get("message", "") if outcome != "passed" else "")
        lines.append(f"| {case.get('name')} | {outcome} | {detail.replace('|', '/')[:600]} |")
    return lines + ["", ", ".join(f"{n} {k}" for k, n in counts.items())]


def script_steps(log_path, skip=3):
    """Medians over train_gpt2.py's steps after the first `skip` (compiling, warming up)."""
    steps = logged_steps(log_path)[skip:]
    if not steps:
        return [f"(fewer than {skip + 1} steps logged: see the log)"]
    med = {k: statistics.median(r[k] for r in steps) for k in ("ms", "tok_s")}
    mfu = [r["mfu"] for r in steps if r.get("mfu") is not None]
    mem = [r["peak_memory"] for r in steps if r.get("peak_memory") is not None]
    return [f"median of steps {steps[0]['step']}-{steps[-1]['step']}: {med['ms']:,.1f} ms/step, "
            f"{med['tok_s']:,.0f} tok/s" + (f", MFU {statistics.median(mfu):.1%}" if mfu else "")
            + (f"; a step's peak memory {max(mem) / 2**30:.2f} GiB" if mem else "")]


def write(out, env, command, done):
    """DIR/report.md from the environment and the sections done so far."""
    lines = [f"# GPU report: {env['device']}", "",
             f"- versions: Python {env['python']}, torch {env['torch']}, CUDA {env['cuda']}, cuDNN "
             f"{env['cudnn']}, Triton {env['triton']}, driver {env['driver']}",
             f"- date: {env['date']}; code: commit {env['commit']}",
             f"- command: `{command}` (from the project root; each section's raw output is "
             "DIR/<section>.log)", "",
             "| section | command | result | wall time | compiling and warm-up |",
             "| --- | --- | --- | ---: | ---: |"]
    for name, record in done.items():
        result = "finished" if record["rc"] == 0 else f"FAILED (exit status {record['rc']})"
        warm = "n/a" if record.get("warming") is None else f"{record['warming']:.1f} s"
        lines.append(f"| [{name}](#{name}) | `{record['command']}` | {result} | {record['seconds']:.0f} s | "
                     f"{warm} |")
    total = sum(record["seconds"] for record in done.values())
    lines += ["", f"{len(done)} sections, {total:.0f} s in all (the machine's start and the transfers "
                  "not counted)"]
    for name, record in done.items():
        lines += ["", f"## {name}", "", f"{record['title']}: `{name}.log`", ""] + record["summary"]
    tmp = os.path.join(out, "report.md.tmp")
    with open(tmp, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, os.path.join(out, "report.md"))


def run(out, device, hellaswag_data=None, budget=None, commit=None, peer=None):
    """bench.py --report: every section this DIR lacks for this commit and device; the exit status (1: a
    section failed; 2: stopped at the budget, a rerun continues)."""
    where = nearest_existing(out)  # the folder itself, or where it will be made
    if not os.path.isdir(where) or not os.access(where, os.W_OK):
        raise UserError(f"--report {out}: {where} is not a folder that can be written: choose another folder")
    os.makedirs(out, exist_ok=True)
    env = environment(device, commit)
    command = f"python bench.py --report {out}" + (f" --hellaswag_data {hellaswag_data}" if hellaswag_data
                                                   else "") + (f" --peer {peer}" if peer else "")
    cache = os.path.abspath(os.path.join(out, "inductor_cache"))
    deadline = None if budget is None else time.time() + budget
    done, status = {}, 0
    for name, title, argv in sections(out, torch.device(device).type == "cuda", device, hellaswag_data, peer):
        path = os.path.join(out, f"{name}.json")
        record = None
        if os.path.exists(path):
            with open(path) as f:
                record = json.load(f)
            if (record["commit"], record["device"]) != (env["commit"], env["device"]):
                record = None  # another commit's or device's: measured again
        if record is None:
            print(f"== {name}: {title}", flush=True)
            t0 = time.time()
            rc = run_section(argv, os.path.join(out, f"{name}.log"), deadline, cache)
            if rc is None:
                write(out, env, command, done)
                print(f"stopped at the budget during {name}: rerun the same command to continue")
                return 2
            record = {"title": title, "command": " ".join(["python", *argv[1:]]), "rc": rc,
                      "seconds": time.time() - t0, "warming": warming(name, out), "commit": env["commit"],
                      "device": env["device"], "summary": summary(name, out)}
            with open(path + ".tmp", "w") as f:
                json.dump(record, f, indent=1)
            os.replace(path + ".tmp", path)
        done[name] = record
        status = status or (1 if record["rc"] else 0)
        write(out, env, command, done)
    for path in checkpoints(os.path.join(out, "script_log")):  # gigabytes the report does not need
        os.remove(path)
    print(f"wrote {os.path.join(out, 'report.md')}")
    return status
