"""Where and how this process runs: its rank among torchrun's processes, the device, the compute dtype, and
whether torch.compile works here. train_gpt2.py decides all of it once, at start-up; sample.py, hellaswag.py
and bench.py use the device and precision parts.
"""
import collections
import contextlib
import dataclasses
import datetime
import os
import platform
import re
import socket
import subprocess
import sys
import urllib.parse

import torch
import torch.distributed as dist


def first_line(e, limit=160):
    """The first line of an exception's message, at most about `limit` characters (cut at a word): the reason
    a one-line error quotes."""
    line = (str(e).strip().splitlines() or [type(e).__name__])[0]
    return line if len(line) <= limit else line[:limit].rsplit(" ", 1)[0] + " ..."


def hub_online(timeout=3.0):
    """Whether the Hugging Face Hub can be reached: one connection attempt of `timeout` seconds instead of
    huggingface_hub's retries (offline a download then fails in seconds, not after ~35 s of silence). False
    without asking under HF_HUB_OFFLINE=1; True without asking behind a proxy (the proxy decides)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urllib.parse.urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=timeout).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def one_line_errors():
    """Expected mistakes (a bad setting, a missing or damaged file, no network) raise OSError or ValueError
    with a message that names the fix: print it as one line and exit 1, without a traceback."""
    try:
        yield
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {e}") from None


def is_rank0():
    """Whether this process is rank 0 (torchrun sets RANK; a plain `python` run is rank 0 of 1)."""
    return int(os.environ.get("RANK", 0)) == 0


def print0(*args):
    if is_rank0():
        print(*args, flush=True)


# ---------------------------------------------------------------------------------------------- device, dtype

def pick_device(name="auto"):
    """The device to run on: "auto" is cuda, then mps (Apple GPUs), then cpu; a device that is named but not
    there is a ValueError that says so."""
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available, "cpu": lambda: True}
    if name == "auto":
        return next(kind for kind, there in available.items() if there())
    if name not in available:
        raise ValueError(f"--device={name!r}: use auto, cuda, mps or cpu")
    if not available[name]():
        raise ValueError(f"--device={name} but torch sees no {name} device here: use --device=auto (picks "
                         "cuda, mps or cpu, whichever is there)")
    return name


def native_bf16(device):
    """Whether a CUDA GPU computes bf16 in its tensor cores: compute capability 8.0 and later (Ampere, Ada,
    Hopper, ...), and AMD GPUs. Not torch.cuda.is_bf16_supported(): by default it also says yes where bf16 is
    only emulated (V100, T4, RTX 20xx), many times slower and never compiled. Reads the device's properties:
    no CUDA context is made."""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(device)[0] >= 8


def resolve_dtype(dtype, device):
    """The compute dtype: "auto" is bf16 on a CUDA GPU with native bf16 (native_bf16), fp16 with loss
    scaling on one without (V100, T4, RTX 20xx), fp32 elsewhere (CPU, Apple); bf16, fp16 and fp32 as asked."""
    kind = torch.device(device).type
    if dtype == "auto":
        return ("bf16" if native_bf16(device) else "fp16") if kind == "cuda" else "fp32"
    if dtype not in ("bf16", "fp16", "fp32"):
        raise ValueError(f"--dtype={dtype!r}: use auto, bf16, fp16 or fp32")
    if dtype != "fp32" and not torch.amp.is_autocast_available(kind):
        raise ValueError(f"--dtype={dtype}: this torch has no autocast on {kind}; use --dtype=fp32")
    return dtype


def autocast(device, dtype="auto"):
    """The project's mixed precision: matmuls in bf16 or fp16 under autocast (see resolve_dtype), or fp32."""
    dtype = resolve_dtype(dtype, device)
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type,
                          dtype=torch.bfloat16 if dtype == "bf16" else torch.float16)


def device_memory(device):
    """A CUDA GPU's total memory in bytes; None for other devices (a CPU's is not checked)."""
    if torch.device(device).type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).total_memory


def synchronize(device):
    """Wait for the device's queued work (GPUs run asynchronously): before reading a clock."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def device_name(device):
    """A device's name for logs and reports: the GPU's; for a CPU its model and cores, and whether it has bf16
    matmul instructions (AVX-512-BF16 or AMX): without them PyTorch emulates bf16 and runs it many times
    slower."""
    kind = torch.device(device).type
    if kind == "cuda":
        return torch.cuda.get_device_name(device)
    if kind == "mps":
        return "Apple GPU (mps)"
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read()
        name = re.search(r"^model name\s*:\s*(.*)$", info, re.M).group(1)
        flags = re.search(r"^flags\s*:\s*(.*)$", info, re.M).group(1).split()
        bf16 = "with" if {"avx512_bf16", "amx_bf16"} & set(flags) else "no"
    except (OSError, AttributeError):  # not Linux
        name, bf16 = platform.processor() or "CPU", "unknown"
    return f"{name} ({os.cpu_count()} cores, {bf16} AVX-512-BF16/AMX)"


def compile_probe(device):
    """None if torch.compile's default backend works on this device, else why not. Inductor needs triton on a
    GPU and a C++ compiler on a CPU; finding out costs a few seconds here, not minutes into a run."""
    try:
        probe = torch.compile(lambda x: (x * 2).sin().sum())
        probe(torch.ones(8, device=device)).item()
        return None
    except Exception as e:  # whatever the backend raises: no triton, no compiler, an unsupported GPU
        return first_line(e, 200)
    finally:
        torch._dynamo.reset()


# ------------------------------------------------------------------------------------------------ processes

@dataclasses.dataclass
class Runtime:
    """This process's place in the run and the device choices made for it, once, at start-up."""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    distributed: bool = False  # launched by torchrun (also with one process): a process group, DDP or FSDP
    kind: str = "cpu"  # cuda, mps or cpu
    dtype: str = "fp32"  # the compute dtype: bf16, fp16 (with loss scaling) or fp32 (CUDA's auto: start())
    device: str = "cpu"  # cuda:<local rank> on GPUs, else kind
    compile: bool = False
    memory: int = None  # bytes: the smallest GPU of all ranks (their B must be the same); None off CUDA

    @property
    def master(self):
        return self.rank == 0


def processes(device="auto", dtype="auto"):
    """A Runtime with the rank, the world and the device kind and dtype, before any process group exists: a
    bad --device or --dtype fails here in one line. torchrun sets RANK, LOCAL_RANK and WORLD_SIZE."""
    distributed = "RANK" in os.environ
    rank, local_rank, world_size = (int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]),
                                    int(os.environ["WORLD_SIZE"])) if distributed else (0, 0, 1)
    with one_line_errors():
        kind = pick_device(device)
        if not (kind == "cuda" and dtype == "auto"):  # CUDA's auto: decided on the rank's own GPU, in start()
            dtype = resolve_dtype(dtype, kind)
    return Runtime(rank, local_rank, world_size, distributed, kind, dtype, kind)


# How long a rank waits in a collective before the run is aborted (NCCL's default is 10 minutes): the other
# ranks wait while rank 0 writes a checkpoint, and 1558M's (~19 GB with its AdamW states) takes minutes on
# slow storage; 30 minutes is enough at 11 MB/s.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


def start(rt, compile):
    """The process group (NCCL between GPUs, gloo between CPU processes), this rank's GPU, TF32 matmuls, and
    whether torch.compile is used: as asked, unless this device cannot (Apple GPUs; elsewhere the probe says)
    or another rank cannot. Returns the NOTEs to print."""
    if rt.distributed:
        dist.init_process_group("nccl" if rt.kind == "cuda" else "gloo", timeout=COLLECTIVE_TIMEOUT)
    if rt.kind == "cuda":
        rt.device = f"cuda:{rt.local_rank}"
        torch.cuda.set_device(rt.device)
        torch.set_float32_matmul_precision("high")  # TF32 matmuls on Ampere and later
    notes, rt.compile = [], compile
    if rt.kind == "cuda":
        rt.dtype = resolve_dtype(rt.dtype, rt.device)
        if rt.dtype == "bf16" and not native_bf16(rt.device):
            major, minor = torch.cuda.get_device_capability(rt.device)
            notes.append(f"dtype=bf16 on a GPU without bf16 tensor cores (compute capability "
                         f"{major}.{minor}): emulated, many times slower and not compiled; --dtype=auto uses "
                         f"fp16 here")
    if compile and rt.kind == "mps":
        notes.append("compile=True: torch.compile is not used on Apple GPUs (mps); running eager")
        rt.compile = False
    elif compile:
        why = compile_probe(rt.device)
        if why:
            notes.append(f"compile=True but torch.compile does not work here ({why}); running eager. Install "
                         f"triton (GPU) or a C++ compiler (CPU), or set --compile=False to skip this check")
            rt.compile = False
    rt.memory = device_memory(rt.device)
    if rt.distributed:  # every rank runs the same way: compiled only if it works everywhere
        everywhere = [None] * rt.world_size
        dist.all_gather_object(everywhere, (rt.compile, rt.memory))
        rt.compile = all(ok for ok, _ in everywhere)
        rt.memory = None if rt.memory is None else min(memory for _, memory in everywhere)
    return notes


def broadcast_object(obj):
    """Rank 0's obj on every rank (a small picklable object)."""
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def git_state():
    """(commit, dirty) of the code that runs: HEAD, and whether tracked files differ from it; (None, None)
    outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], cwd=os.path.dirname(os.path.abspath(__file__)),
                              capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    try:
        return git("rev-parse", "HEAD"), bool(git("status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return None, None


def exit_process(status, wait=True):
    """Ends a process: under torchrun every rank first waits for the others (wait=True), takes the process
    group down and exits without Python's interpreter shutdown. gloo's worker threads outlive
    destroy_process_group and may still be releasing the last collectives' tensors, which takes the GIL;
    during interpreter shutdown that aborts the process ("terminate called without an active exception":
    9 of 60 runs of a 2-process FSDP test on a busy CPU). Logs and checkpoints are closed by then."""
    if not dist.is_initialized():
        sys.exit(status)
    if wait:  # every rank ends at the same step; an error may have stopped this rank alone: no waiting
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_info(rt, optimizers):
    """What ran this run, for the first record of its log (plot.py --baseline compares two): versions, the
    devices of all ranks, the code's commit, and the choices made at start-up. Every rank must call it (it
    gathers the device names)."""
    me = [(socket.gethostname(), device_name(rt.device))]
    if rt.distributed:
        everyone = [None] * rt.world_size
        dist.all_gather_object(everyone, me[0])
        me = everyone
    commit, dirty = git_state()
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "devices": dict(collections.Counter(name for _, name in me)),
            "hosts": len({host for host, _ in me}), "git_commit": commit, "git_dirty": dirty,
            "backend": dist.get_backend() if rt.distributed else None, "dtype": rt.dtype,
            "compile": rt.compile,
            "tf32": rt.kind == "cuda" and torch.backends.cuda.matmul.allow_tf32,
            "fused_adamw": any(isinstance(o,
                                          torch.optim.AdamW) and bool(o.defaults["fused"])
                                          for o in optimizers)}
