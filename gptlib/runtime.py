"""Where and how this process runs: its rank among torchrun's processes, the device, the compute dtype.
setup() decides all of it once, at start-up, for every entry point (train_gpt2.py, sample.py, hellaswag.py,
bench.py, gpu_check.py); the rest are the helpers they share.
"""
import collections
import contextlib
import ctypes
import dataclasses
import datetime
import os
import platform
import re
import signal
import socket
import subprocess
import sys
import urllib.parse

import torch
import torch.distributed as dist

from gptlib.errors import PeerFailed, UserError, find_cause, first_line, plural, say


MIN_TORCH = (2, 9)  # the oldest torch the whole suite passes on (requirements.txt)


def torch_older_than(version):
    """Whether this torch is older than version (major, minor); 2.9.0a0+git... (NVIDIA's) counts as 2.9."""
    return tuple(int(n) for n in re.match(r"(\d+)\.(\d+)", torch.__version__).groups()) < version


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


def is_rank0():
    """Whether this process is rank 0 (torchrun sets RANK; a plain `python` run is rank 0 of 1)."""
    return int(os.environ.get("RANK", 0)) == 0


def print0(*args):
    if is_rank0():
        say(" ".join(map(str, args)))


@contextlib.contextmanager
def catch_stop_signals():
    """While it lasts, a one-item list that SIGTERM, SIGINT (Ctrl-C) or SIGUSR1 (Slurm's warning before the
    time limit, --signal=USR1@SECONDS) set to their number, said at once: the step in progress finishes and a
    checkpoint is written. A second signal stops the process at once, without a checkpoint."""
    received = [0]

    def handler(signum, frame):
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        again, received[0] = received[0], received[0] or signum
        said = (f"{name} again: stopped now, without a checkpoint" if again else
                f"{name}: stopping after this step with a checkpoint; {name} again stops now without one")
        if is_rank0():  # os.write: safe inside a signal handler, unlike print
            with contextlib.suppress(OSError, ValueError):  # a stdout gone (Ctrl-C also ends a `| tee`)
                os.write(sys.stdout.fileno(), f"\n{said}\n".encode())
        if again:
            os._exit(128 + signum)  # now: no checkpoint, nothing flushed
    # SIGUSR1 does not exist on Windows
    stops = [signal.SIGTERM, signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    before = {sig: signal.signal(sig, handler) for sig in stops}
    try:
        yield received
    finally:
        for sig, previous in before.items():
            signal.signal(sig, previous)


# ---------------------------------------------------------------------------------------------- device, dtype

def pick_device(name="auto"):
    """The device kind to run on: "auto" is cuda, then mps (Apple GPUs), then cpu."""
    available = {"cuda": torch.cuda.is_available, "mps": torch.backends.mps.is_available, "cpu": lambda: True}
    if name == "auto":
        return next(kind for kind, there in available.items() if there())
    if name not in available:
        raise UserError(f"--device={name!r}: use auto, cuda, mps or cpu")
    if not available[name]():
        raise UserError(f"--device={name} but torch sees no {name} device here: use --device=auto (picks "
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
        raise UserError(f"--dtype={dtype!r}: use auto, bf16, fp16 or fp32")
    if dtype != "fp32" and not torch.amp.is_autocast_available(kind):
        raise UserError(f"--dtype={dtype}: this torch has no autocast on {kind}; use --dtype=fp32")
    return dtype


TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def autocast(device, dtype):
    """The project's mixed precision for a resolved dtype: matmuls in bf16 or fp16 under autocast, or fp32."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=TORCH_DTYPES[dtype])


def synchronize(device):
    """Wait for the device's queued work (GPUs run asynchronously): before reading a clock."""
    kind = torch.device(device).type
    if kind == "cuda":
        torch.cuda.synchronize(device)
    elif kind == "mps":
        torch.mps.synchronize()


def device_name(device):
    """A device's name for logs and reports: the GPU's; a CPU's model, cores and whether it has bf16 matmul
    instructions (AVX-512-BF16 or AMX: without them PyTorch emulates bf16, many times slower)."""
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


def is_out_of_memory(e):
    """Whether an exception is the GPU (torch.OutOfMemoryError) or the CPU (its allocator's RuntimeError)
    running out of memory, also when compiled code wrapped it in another exception (it is then a cause or
    context of the one raised; not one hidden by `from None`)."""
    return find_cause(e, lambda x: isinstance(x, torch.OutOfMemoryError)
                      or "DefaultCPUAllocator: can't allocate memory" in str(x)) is not None


# ------------------------------------------------------------------------------------------------ processes

@dataclasses.dataclass
class Runtime:
    """This process's place in the run and the device choices made for it, once, by setup()."""
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    distributed: bool = False  # launched by torchrun (also with one process): a process group, DDP or FSDP
    kind: str = "cpu"  # cuda, mps or cpu
    dtype: str = "fp32"  # the compute dtype: bf16, fp16 (with loss scaling) or fp32
    device: str = "cpu"  # cuda:<local rank> on GPUs, else kind
    memory: int = None  # bytes: the smallest GPU of all ranks (their B must be the same); None off CUDA
    patient: object = None  # a process group of all ranks with COLLECTIVE_TIMEOUT: waits on checkpoint files
    cpus: int = 1  # CPU threads for host-side work (tokenizing): this process's share of the node's cores
    notes: list = dataclasses.field(default_factory=list)  # what setup() found worth a NOTE

    @property
    def master(self):
        return self.rank == 0


# How long a rank waits for the others while rank 0 writes or reads a checkpoint (the patient group): 1558M's
# (~19 GB with its AdamW states) takes minutes on slow storage; 30 minutes is enough at 11 MB/s. Also the
# default of the process group, which train_gpt2.py shortens for its steps (collective_timeout).
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


def setup(device="auto", dtype="auto", timeout=None):
    """This process's Runtime: its rank (torchrun sets RANK, LOCAL_RANK and WORLD_SIZE), its device and dtype
    (use_gpu), the process groups under torchrun (join); a UserError for a device or dtype not here."""
    rt = torchrun_ranks() if "RANK" in os.environ else Runtime()
    rt.kind = rt.device = pick_device(device)
    # torchrun starts LOCAL_WORLD_SIZE processes on this node: each takes its share of the cores it may use
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()  # Linux
    rt.cpus = max(1, cores // int(os.environ.get("LOCAL_WORLD_SIZE", 1)))
    if torch_older_than(MIN_TORCH):
        oldest = ".".join(map(str, MIN_TORCH))
        rt.notes.append(f"torch {torch.__version__} is older than {oldest}, the oldest this project is "
                        f"tested on: pip install -r requirements.txt upgrades it")
    if rt.kind == "cpu" and platform.libc_ver()[0] == "glibc":  # Linux's usual C library (not musl)
        # a step's largest tensors (the logits and their gradients, B*T x vocab_size floats each) would be
        # fresh pages each micro-step, which the kernel zero-fills one by one: about half a laptop's step.
        # The main thread's memory comes from the heap instead, and what is freed stays there for reuse: the
        # process holds its peak, which fragmentation raises (the quick start's: about 3 GiB, not 1.7)
        libc = ctypes.CDLL(None)
        libc.mallopt(-4, 0)  # M_MMAP_MAX: no mapping of its own for a large block
        libc.mallopt(-1, -1)  # M_TRIM_THRESHOLD: -1, the heap is never shrunk
    if rt.kind == "cuda":
        use_gpu(rt, dtype)
    else:
        rt.dtype = resolve_dtype(dtype, rt.kind)
    if rt.kind == "cpu" and rt.dtype == "fp16":  # runs as asked: the fp16 path (loss scaling) on a laptop
        rt.notes.append("dtype=fp16 on a CPU: no fp16 matrix units, so autocast and loss scaling make each "
                        "step slower than fp32 (the quick start's 25x on this project's 2-core CPU): for "
                        "trying the fp16 path; --dtype=auto (fp32 here) trains faster")
    if rt.distributed:
        join(rt, timeout)
    return rt


def torchrun_ranks():
    """setup()'s Runtime under torchrun: its RANK, LOCAL_RANK and WORLD_SIZE."""
    if "WORLD_SIZE" not in os.environ:
        raise UserError("RANK is set but WORLD_SIZE is not: launch with torchrun (or set WORLD_SIZE, "
                        "MASTER_ADDR and MASTER_PORT as well)")
    # launchers that start one process a node (Kubeflow's PyTorchJob) set RANK and WORLD_SIZE, not LOCAL_RANK
    return Runtime(int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0)),
                   int(os.environ["WORLD_SIZE"]), distributed=True)


def use_gpu(rt, dtype):
    """setup()'s CUDA part: this rank's own GPU (one a process), its memory, TF32 matmuls, the dtype decided
    on it."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", rt.local_rank + 1))  # processes on this node
    if local > (gpus := torch.cuda.device_count()):  # every rank of the node finds it; LOCAL_RANK 0 says
        raise UserError(f"{local} processes on this node (torchrun --nproc_per_node={local}) but it has "
                        f"{plural(gpus, 'GPU')} visible (CUDA_VISIBLE_DEVICES="
                        f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}): one process a GPU, so use "
                        f"--nproc_per_node={gpus}")
    rt.device = f"cuda:{rt.local_rank}"
    torch.cuda.set_device(rt.device)  # before any capability is read: the rank's own GPU, not GPU 0
    torch.set_float32_matmul_precision("high")  # TF32 matmuls on Ampere and later
    rt.memory = torch.cuda.get_device_properties(rt.device).total_memory  # what settings.fit fits B to
    rt.dtype = resolve_dtype(dtype, rt.device)
    if rt.dtype == "bf16" and not native_bf16(rt.device):
        major, minor = torch.cuda.get_device_capability(rt.device)
        rt.notes.append(f"dtype=bf16 on a GPU without bf16 tensor cores (compute capability "
                        f"{major}.{minor}): emulated, many times slower and not compiled; --dtype=auto "
                        f"uses fp16 here")


def join(rt, timeout):
    """setup()'s torchrun part: the process group (NCCL between GPUs, gloo between CPU processes; a collective
    that waits `timeout` seconds for another rank fails), the patient group beside it, and the GPU memory
    every rank's B is fitted to (the smallest)."""
    wait = datetime.timedelta(seconds=timeout) if timeout else COLLECTIVE_TIMEOUT
    # device_id: NCCL binds the rank's GPU now, so a barrier need not guess it (and say so in a warning)
    dist.init_process_group("nccl" if rt.kind == "cuda" else "gloo", timeout=wait,
                            device_id=torch.device(rt.device) if rt.kind == "cuda" else None)
    rt.patient = dist.new_group(timeout=COLLECTIVE_TIMEOUT)
    # every rank connected before any leaves: a rank that stops at once (a mistake every rank finds, only
    # local rank 0 says) would break the connections a slower rank is still making, with a traceback
    dist.barrier(group=rt.patient)
    if rt.memory is not None:  # every rank's B is the same: the smallest GPU decides
        rt.memory = min(all_gather(rt.memory))


def compile_blocker(rt):
    """None if torch.compile works on this device (on every rank), else why not, in a few words. Inductor
    needs triton on a GPU and a C++ compiler on a CPU; finding out costs a few seconds here, not minutes
    into a run."""
    why = None
    try:
        probe = torch.compile(lambda x: (x * 2).sin().sum())
        probe(torch.ones(8, device=rt.device)).item()
    except Exception as e:  # whatever the backend raises: no triton, no compiler, an unsupported GPU
        why = first_line(e)
    finally:
        torch._dynamo.reset()
    if rt.distributed:  # compiled only if it works everywhere
        why = next((w for w in all_gather(why) if w), None)
    return why


def eager_note(why):
    """The NOTE's sentence when compile_blocker found torch.compile unusable here (why): what runs instead
    and the fix; train_gpt2.py and sample.py both say it."""
    return (f"torch.compile does not work here ({why}); running eager. Install triton (GPU) or a C++ "
            f"compiler (CPU), or set --compile=False to skip this check")


def compile_choice(choice, rt):
    """(compile, note): whether a script compiles, from its --compile (auto: on CUDA; True; False), and the
    NOTE to print where torch.compile does not work here (None otherwise)."""
    want = choice == "True" or (choice == "auto" and rt.kind == "cuda")
    why = compile_blocker(rt) if want else None
    return (False, eager_note(why)) if why else (want, None)


def all_gather(obj):
    """[every rank's obj] (small picklable objects)."""
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def broadcast_object(obj, group=None):
    """Rank 0's obj on every rank (a small picklable object); group: the patient one where rank 0 may first
    spend minutes on a checkpoint file."""
    box = [obj]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


@contextlib.contextmanager
def together(rt, group=None, guard=True):
    """A block that one rank may fail alone (its GPU runs out of memory, an item only it encodes is damaged,
    only rank 0 writes a file), run by every rank before collectives that all must reach: at its end the
    ranks agree, by one small all-reduce, whether any failed. The lowest rank that failed raises its own
    error, marked as its to say (its rank set: errors.main_guard names it); every other rank raises
    PeerFailed, which says nothing. So all ranks leave the block the same way at the same point, and none
    waits out the collective timeout for a failure another already knows. guard=False where the block's
    forwards are themselves collective (FSDP's gathers): a rank that fails inside one cannot agree with ranks
    waiting in a gather, and its error goes out unagreed (the others then stop when the collective times out
    or the failed process's connection closes: peer_lost). group: the process group to agree in. Ctrl-C
    (KeyboardInterrupt) or a SystemExit inside the block is a failure too: agreed on, then raised as it is."""
    if not rt.distributed:
        yield
        return
    try:
        yield
    except BaseException as e:
        if not guard:
            raise
        first = first_failure(rt, group, failed=True)
        if first != rt.rank and isinstance(e, Exception):  # a lower rank failed as well: it says why
            raise PeerFailed(f"rank {first} failed") from e
        e.rank = rt.rank
        raise
    first = first_failure(rt, group, failed=False)
    if first is not None:
        raise PeerFailed(f"rank {first} failed")


def first_failure(rt, group, failed):
    """The lowest rank whose block failed (failed: this rank's did), or None: one all-reduce."""
    flag = torch.tensor([rt.rank if failed else rt.world_size], device=rt.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    first = int(flag.item())  # CPU-GPU sync point
    return None if first == rt.world_size else first


def sharded(model):
    """Whether a model's forward is itself collective: FSDP2-sharded, each block gathers its parameters."""
    from torch.distributed.fsdp import FSDPModule
    return isinstance(model, FSDPModule)


def agreed(e, rt):
    """Whether the failure e is known to every rank at the same point (a together block's, or any failure of
    a single process): the ranks can still act together on it, a checkpoint for one."""
    return not rt.distributed or isinstance(e, PeerFailed) or getattr(e, "rank", None) is not None


def agree(rt, error=None, stop=0):
    """What every rank decides alike, in one small all-reduce: a line a rank has to stop with (error: a
    UserError there, PeerFailed on the others), and after a step the stop signal any rank received."""
    if rt.distributed:
        flags = torch.tensor([stop, error is not None], device=rt.device)
        dist.all_reduce(flags, op=dist.ReduceOp.MAX)
        stop, failed = (int(v) for v in flags.tolist())
        if failed and error is None:
            raise PeerFailed("another rank failed")
    if error:  # agreed on, like a together block's failure: the ranks can still act together (agreed)
        e = UserError(error)
        e.rank = rt.rank
        raise e
    return stop


def timed_out(e):
    """Whether an exception is a collective that waited out the process group's timeout for another rank
    (gloo raises it; NCCL's watchdog ends the process itself), also as the cause or context of another."""
    return find_cause(e, lambda x: isinstance(x, RuntimeError) and "timed out" in str(x).lower()) is not None


# what a collective raises when another rank's process has ended: gloo's closed connection, NCCL's abort
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe",
             "communicator was aborted", "remote process exited")


def peer_lost(e):
    """Whether an exception is a collective that lost another rank: it timed out (the rank hangs) or the
    rank's process ended (it failed where no agreement was possible, or was killed); also as the cause or
    context of another."""
    return timed_out(e) or find_cause(e, lambda x: isinstance(x, RuntimeError)
                                      and any(words in str(x).lower() for words in PEER_GONE)) is not None


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
    group down and exits without Python's interpreter shutdown: gloo's worker threads outlive
    destroy_process_group and may still be releasing the last collectives' tensors, which takes the GIL, and
    during interpreter shutdown that aborts the process ("terminate called without an active exception").
    Logs and checkpoints are closed by then."""
    if not dist.is_initialized():
        sys.exit(status)
    if wait:  # every rank ends at the same step; an error may have stopped this rank alone: no waiting
        dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def run_info(rt, compiled, optimizers):
    """What ran this run, for its log's first record (plot.py --baseline compares two): versions, every rank's
    device (gathered: every rank calls it), the code's commit, the choices made at start-up."""
    me = (socket.gethostname(), device_name(rt.device))
    everyone = all_gather(me) if rt.distributed else [me]
    commit, dirty = git_state()
    return {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),
            "devices": dict(collections.Counter(name for _, name in everyone)),
            "hosts": len({host for host, _ in everyone}), "git_commit": commit, "git_dirty": dirty,
            "backend": dist.get_backend() if rt.distributed else None, "dtype": rt.dtype, "compile": compiled,
            "tf32": rt.kind == "cuda" and torch.backends.cuda.matmul.allow_tf32,
            "fused_adamw": any(isinstance(o, torch.optim.AdamW) and bool(o.defaults["fused"])
                               for o in optimizers)}
