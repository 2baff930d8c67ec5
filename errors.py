"""The one exception type for expected mistakes: a bad setting, a missing or damaged file, no network, a torch
too old for a setting. Its message is the whole line a user sees, naming what is wrong and the fix; only the
entry points (train_gpt2.py, sample.py, hellaswag.py, fineweb.py, plot.py, bench.py) print it and exit 1.
Anything else is a bug and keeps its traceback. No torch here: fineweb.py and dataloader.py raise it too.
"""
import sys


class UserError(Exception):
    """An expected mistake; str(e) is the one line to print."""


def main_guard(main):
    """Run an entry point's main(): a UserError ends the process with its line on stderr and exit status 1."""
    try:
        main()
    except UserError as e:
        sys.exit(f"error: {e}")


def first_line(e):
    """The first line of an exception's message (its type if it has none): the reason a UserError quotes
    from the library error underneath."""
    return (str(e).strip().splitlines() or [type(e).__name__])[0]
