"""The one exception type for expected mistakes: a bad setting, a missing or damaged file, no network, a torch
too old for a setting. Its message is the whole line a user sees, naming what is wrong and the fix; only the
entry points (train_gpt2.py, sample.py, hellaswag.py, fineweb.py, checkpoint.py, plot.py, bench.py) print it
and exit 1. Anything else is a bug and keeps its traceback. No torch here: fineweb.py and dataloader.py raise
it too.
"""
import argparse
import ast
import math
import os
import sys


def say(line, file=None):
    """Print one line in one write (default stdout), flushed: torchrun's processes share one terminal or
    pipe, and print's two writes when output is unbuffered (PYTHONUNBUFFERED=1, python -u: the text, then
    its newline) let another process's line land inside this one. A pipe keeps a write whole up to 4 KiB."""
    file = file or sys.stdout
    file.write(f"{line}\n")
    file.flush()


def plural(n, one, many=None):
    """'1 val eval', '2 val evals'; '1 process', '2 processes' with many."""
    return f"{n} {one if n == 1 else many or one + 's'}"


class UserError(Exception):
    """An expected mistake; str(e) is the one line to print."""
    rank = None  # set where the ranks agreed who failed (runtime.together): this rank says it, naming itself


class RankError(UserError):
    """An expected mistake that one rank may meet alone (its GPU ran out of memory): that rank says it, with
    its rank, whatever its LOCAL_RANK."""


class PeerFailed(UserError):
    """Another rank failed where the ranks agree on failures (runtime.together): that rank says why; this one
    stops at the same point and says nothing."""


def main_guard(main, exit_process=None):
    """Run an entry point's main() and end the process with its exit status (None counts as 0). A UserError
    is an expected mistake: its line goes to stderr and the status is 1. Under torchrun a mistake every rank
    meets is said by each node's first (LOCAL_RANK 0); one that a rank met alone (a RankError, or one the
    ranks agreed on: its rank is set) by that rank, naming it when it is not rank 0; a PeerFailed by no one
    (the failing rank says why). Ctrl-C outside a training loop (which checkpoints and stops on its
    own) is one line and status 130. exit_process(status, wait): how a process
    that may hold a process group ends (runtime.exit_process; after a UserError without waiting for the
    others); without it, sys.exit."""
    wait = True
    try:
        status = main()
    except UserError as e:
        if isinstance(e, PeerFailed):
            pass
        elif e.rank is not None or isinstance(e, RankError):  # met by this rank alone
            rank = e.rank if e.rank is not None else int(os.environ.get("RANK", 0))
            say(f"error{f' (rank {rank})' if rank else ''}: {e}", sys.stderr)
        elif os.environ.get("LOCAL_RANK", "0") == "0":
            say(f"error: {e}", sys.stderr)
        status, wait = 1, False
    except KeyboardInterrupt:  # Ctrl-C before the loop catches it (start-up): a stop, not a bug
        if os.environ.get("LOCAL_RANK", "0") == "0":
            say("stopped by Ctrl-C", sys.stderr)
        status, wait = 130, False
    if exit_process is not None:
        exit_process(status or 0, wait=wait)
    sys.exit(status or 0)


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose mistakes (an unknown option, a value of the wrong type) are a UserError: one
    line, as every other expected mistake, not usage text and exit status 2."""

    def error(self, message):
        raise UserError(f"{message} (python {self.prog} --help lists the options)")


class Help(argparse.RawDescriptionHelpFormatter):
    """--help: the module's docstring as written, then each option with its default, where it has one (not
    None, "" or a switch's False) and its help does not say it already."""

    def _get_help_string(self, action):
        text = action.help  # argparse shows no line for an option without help
        if not text or action.default is None or action.default is False \
                or action.default in ("", argparse.SUPPRESS) or "default" in text:
            return text
        return f"{text} (default: %(default)s)"


def command_line(doc):
    """The command-line parser of an entry point, its --help opening with the module's docstring `doc`."""
    return Parser(description=doc, formatter_class=Help)


def block_help(script, block, ranges):
    """train_gpt2.py's --help: its docstring, then each setting with its default (block), the comments beside
    or above it in its settings block (so it cannot drift from it) and its valid range, if in ranges."""
    with open(script, encoding="utf-8") as f:
        source = f.read()
    lines, above = [], []
    for line in source.split("# settings:", 1)[1].split("\n# ---", 1)[0].splitlines()[1:]:
        code, _, comment = line.partition("  # ") if not line.startswith("#") else ("", "", line[2:])
        if not code:
            above.append(comment)
            continue
        name = code.split(" = ")[0]
        valid = f" ({valid_range(*ranges[name])})" if name in ranges else ""
        lines.append(f"  --{name}={block[name]!r}".ljust(34) + " ".join(above + [comment]).strip() + valid)
        above = []
    name = os.path.basename(script)
    return (f"{ast.get_docstring(ast.parse(source)).strip()}\n\nSettings (--name=value or --name value; the "
            f"defaults are the settings block at the top of {name}):\n" + "\n".join(lines))


def first_line(e):
    """The first line of an exception's message (its type if it has none): the reason a UserError quotes
    from the library error underneath."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


def find_cause(e, match):
    """The first exception in e's chain that match(exception) accepts: e itself, or what it was raised from
    or while handling (not a context hidden by `from None`); None if there is none. Library errors arrive
    wrapped: an out-of-memory inside compiled code, the OSError inside torch's "unexpected pos"."""
    for _ in range(16):
        if e is None or match(e):
            return e
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return None


def check_range(option, value, low=None, high=None, above=None):
    """A UserError naming the option and its valid range unless low <= value <= high and value > above (each
    bound optional) and value is a finite number: a negative learning rate, nan, an empty batch."""
    if value is None:  # not given: the entry point's default
        return
    if (math.isfinite(value) and (low is None or value >= low) and (high is None or value <= high)
            and (above is None or value > above)):
        return
    raise UserError(f"{option}={value} must be {valid_range(low, high, above)}")


def valid_range(low=None, high=None, above=None):
    """check_range's bounds in words: 'at least 1', 'between 0 and 1', 'above 0'."""
    return (f"between {low} and {high}" if low is not None and high is not None else f"at least {low}"
            if low is not None else f"above {above}" if above is not None else f"at most {high}")
