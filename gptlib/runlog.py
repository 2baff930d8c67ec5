"""A run's log_dir and its log: the lock that lets one run at a time into a log_dir, and metrics.jsonl (one
JSON record per line, rank 0 appends): RunLog, its one writer (also feeding TensorBoard and W&B), and its
readers (read_log for plot.py, report.md and the checks; log_lines for the resume, which trims what a failed
attempt wrote after its checkpoint); and the run's Clock (elapsed time, ETA).
"""
import collections
import json
import os
import socket
import time

from gptlib import runtime
from gptlib.errors import UserError
from gptlib.runtime import agree
from gptlib.trackers import open_trackers


# ------------------------------------------------------------------------------------------------ log_dir

HELD = {}  # log_dir -> its lock, held until this process ends (the OS releases it however it ends)


def nearest_existing(path):
    """path if it exists, else its nearest parent that does: where a folder not yet made will be."""
    path = os.path.abspath(path)
    while not os.path.exists(path):
        path = os.path.dirname(path)
    return path


def hold_log_dir(log_dir, rt, create=False):
    """Every rank: rank 0 locks log_dir (a second run into it: one line naming the first) before the resume,
    and as the run makes it (create=True: a refused run leaves none); unwritable: one line, before a model."""
    agree(rt, lock(log_dir, create) if rt.master and log_dir not in HELD else None)


def lock(log_dir, create):
    """Rank 0's part of hold_log_dir: the line to stop with, or None."""
    fix = "make it writable or choose another --log_dir"
    if not log_dir:  # --log_dir=$DIR with DIR unset, say
        return "--log_dir is empty: name a folder, such as --log_dir=log"
    if os.path.exists(log_dir) and not os.path.isdir(log_dir):
        return f"--log_dir={log_dir} is a file, not a directory: choose another --log_dir"
    if not create and not os.path.isdir(log_dir):  # made later (create=True): its parent must take it
        parent = nearest_existing(os.path.dirname(os.path.abspath(log_dir)))
        return None if os.access(parent, os.W_OK) else (
            f"--log_dir={log_dir} cannot be created: {parent} is not writable (read-only or no permission): "
            f"{fix}")
    from filelock import FileLock, Timeout  # comes with torch; works on Windows too, unlike fcntl
    try:
        os.makedirs(log_dir, exist_ok=True)
        held = FileLock(os.path.join(log_dir, ".lock"))
        held.acquire(timeout=0)
        with open(os.path.join(log_dir, ".owner"), "w") as f:
            f.write(f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%H:%M:%S')}")
    except Timeout:
        return in_use(log_dir)
    except OSError as e:  # a read-only mount, no permission, a full disk
        return f"--log_dir={log_dir} cannot be written ({e.strerror}): {fix}"
    HELD[log_dir] = held
    return None


def in_use(log_dir):
    """The line of a log_dir another run holds, naming that run (its .owner)."""
    try:
        with open(os.path.join(log_dir, ".owner")) as f:
            other = f.read().strip()
    except OSError:
        other = ""
    return (f"{log_dir} is in use by another run ({other or 'another process'}): wait for it to end or stop "
            "it, or choose another --log_dir")


# ------------------------------------------------------------------------------------------ metrics.jsonl

WRITE_FIX = ("make room there (or make it writable) and rerun the same command: it resumes from the newest "
             "checkpoint")


class RunLog:
    """The run's log: metrics.jsonl, which rank 0 appends to (a resumed run continues it), and the trackers
    (TensorBoard, W&B) that get the same records, opened by log_start and closed when the with-block that
    holds the log ends."""

    def __init__(self, path, rt):
        self.path, self.rt, self.trackers = path, rt, []

    def append(self, records):
        """Rank 0 appends the records. Returns the line to stop with if it cannot (a full disk, a log_dir gone
        read-only), else None; the other ranks return None."""
        if not runtime.is_rank0():
            return None
        try:
            with open(self.path, "a") as f:
                f.write("".join(json.dumps(record) + "\n" for record in records))
        except OSError as e:
            return f"could not append to {self.path} ({e.strerror}): {WRITE_FIX}"
        for tracker in self.trackers:
            for record in records:
                if "event" not in record:  # the start record is their config
                    tracker.write(record)
        return None

    def log(self, records):
        """append(), with rank 0's failure a UserError on every rank (one collective when distributed)."""
        agree(self.rt, self.append(records))

    def set_aside(self):
        """Rank 0 moves an earlier attempt's log (one that died before its first checkpoint, or an earlier
        evaluation's) to metrics.N.jsonl beside it: this run's log starts afresh, and that one is kept."""
        if not runtime.is_rank0() or not os.path.exists(self.path):
            return
        n = 1
        while os.path.exists(aside := os.path.join(os.path.dirname(self.path), f"metrics.{n}.jsonl")):
            n += 1
        os.replace(self.path, aside)
        runtime.print0(f"NOTE: no checkpoint to continue in {os.path.dirname(self.path) or '.'}: this run "
                       f"starts afresh; the earlier log is kept as {os.path.basename(aside)}")

    def drop_after(self, step):
        """A resumed run's log: rank 0 drops the records after `step` (those of an attempt that died before
        its next checkpoint, redone now), saying how many."""
        if runtime.is_rank0() and (dropped := truncate_log(self.path, step)):
            runtime.print0(f"NOTE: dropped {dropped} records after step {step} from {self.path} (written "
                           f"after the checkpoint this run resumes from: redone now)")

    def open_trackers(self, names, log_dir, start):
        """Rank 0 opens them; a tracker that cannot start (not installed, not logged in) stops every rank."""
        error = None
        if runtime.is_rank0():
            try:
                self.trackers = open_trackers(names, log_dir, start)
            except UserError as e:
                error = str(e)
        agree(self.rt, error)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for tracker in self.trackers:
            tracker.close()
        self.trackers = []


def metrics_path(log_dir):
    return os.path.join(log_dir, "metrics.jsonl")


def log_lines(path):
    """(line, its record) of each line of a metrics.jsonl, the record None where the line is not JSON (a
    half-written last line); nothing if there is no log yet."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        for line in f:
            try:
                yield line, json.loads(line)
            except json.JSONDecodeError:
                yield line, None


def truncate_log(path, step):
    """Drop the records after `step` from a metrics.jsonl (those of an attempt that died before its next
    checkpoint), and a half-written last line, so the log holds one record per step: the resumed run's."""
    keep, dropped = [], 0
    for line, record in log_lines(path):
        if record is None or record.get("step", 0) > step:
            dropped += 1
        else:
            keep.append(line if line.endswith("\n") else line + "\n")
    if dropped:
        with open(path + ".tmp", "w") as f:
            f.writelines(keep)
        os.replace(path + ".tmp", path)
    return dropped


def evaluated(metrics_path, step):
    """Whether metrics.jsonl holds the validation record of `step`."""
    return any(record is not None and record.get("step") == step and "val_loss" in record
               for _, record in log_lines(metrics_path))


def read_log(path):
    """The records of a train_gpt2.py metrics.jsonl, in order."""
    if not os.path.isfile(path):
        raise UserError(f"training log {path} does not exist (train_gpt2.py writes LOG_DIR/metrics.jsonl)")
    with open(path) as f:
        lines = f.read().split("\n")
    records = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            if i == len(lines) - 1:  # the line being written by a live run
                continue
            raise UserError(f"{path}:{i + 1}: not valid JSON; is this a train_gpt2.py "
                            "metrics.jsonl?") from None
    return records


# ------------------------------------------------------------------------------------------ the run's time

class Clock:
    """A run's training time so far (`elapsed`: seconds before this process, from its checkpoint) and the
    time to max_steps at the pace of the last `window` steps, evaluations and checkpoints included."""

    def __init__(self, elapsed, window):
        self.start = time.time() - elapsed
        self.laps = collections.deque(maxlen=window + 1)  # (step, time) at the end of the recent steps

    def lap(self, step):
        """At the end of a step, after its evaluation and checkpoint."""
        self.laps.append((step, time.time()))

    def elapsed(self):
        return time.time() - self.start

    def eta(self, step, max_steps):
        """Seconds to max_steps from `step` (just trained) at the pace between the recent laps (whole steps,
        evaluations included: over a window of eval_interval steps, one evaluation), or None before two."""
        if len(self.laps) < 2:
            return None
        (first, then), (last, now) = self.laps[0], self.laps[-1]
        return (now - then) / (last - first) * (max_steps - step)


def duration(seconds):
    """1h02m03s, 2m03s or 13s; ? for None."""
    if seconds is None:
        return "?"
    m, sec = divmod(int(round(seconds)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{sec:02d}s" if h else f"{m}m{sec:02d}s" if m else f"{sec}s"
