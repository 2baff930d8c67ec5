"""One training step's path through the project: the functions of its files that a run calls from main() to
its second batch (a whole first step where a step takes one micro-batch), with their lines (a function's
span, its comprehensions, nested functions and docstring included), by file.

    python dev/step_path.py                  # the quick start: python train_gpt2.py on a CPU, no shards
    python dev/step_path.py --recipe=gpt2    # the run issue #80 counted (1,504 lines at 029eb9d by this tool)
    python dev/step_path.py --n_layer=2 -v   # any train_gpt2.py flags; -v lists each function

It runs in a temporary log_dir, shows the run's NOTEs (-v: all it prints), and stops at the second batch
(nothing is trained further).
"""
import contextlib
import io
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


class Second(Exception):
    """Raised at the second batch: the path is complete."""


def step_path(argv):
    """{(file, first line, function): lines} of the project's functions a train_gpt2.py run with argv calls
    from main() to its second batch."""
    import dataloader
    import train_gpt2
    seen, batches, next_batch = {}, [0], dataloader.DataLoaderLite.next_batch

    def profile(frame, event, arg):
        code = frame.f_code
        if event == "call" and code.co_filename.startswith(ROOT + os.sep) and "<" not in code.co_name:
            key = (os.path.relpath(code.co_filename, ROOT), code.co_firstlineno, code.co_name)
            if key not in seen and "/tests/" not in code.co_filename and "/dev/" not in code.co_filename:
                seen[key] = max(line for *_, line in code.co_lines() if line) - code.co_firstlineno + 1

    def counted(self):
        batches[0] += 1
        if batches[0] == 2:
            sys.setprofile(None)
            raise Second
        return next_batch(self)
    dataloader.DataLoaderLite.next_batch = counted
    with tempfile.TemporaryDirectory() as tmp:
        sys.setprofile(profile)
        try:
            train_gpt2.main(list(argv) + [f"--log_dir={tmp}/log"])
        except Second:
            pass
        finally:
            sys.setprofile(None)
            dataloader.DataLoaderLite.next_batch = next_batch
    # a function defined inside another is part of it, as its comprehensions are: counted once, in its span
    # (a def that is its function's last statement ends that span there: both are counted)
    return {key: lines for key, lines in seen.items()
            if not any(f == key[0] and first < key[1] and key[1] + lines <= first + n
                       for (f, first, _), n in seen.items())}


def main():
    if {"-h", "--help"} & set(sys.argv):
        print(__doc__)
        return
    verbose = "-v" in sys.argv
    with contextlib.redirect_stdout(io.StringIO()) as said:
        seen = step_path([a for a in sys.argv[1:] if a != "-v"])
    # the run's NOTEs (the presets it took, and so what was counted); -v: all it printed
    printed = said.getvalue().splitlines(True)
    print("".join(line for line in printed if verbose or line.startswith("NOTE")), end="")
    files = {}
    for (path, _, _), lines in seen.items():
        files[path] = files.get(path, 0) + lines
    print(f"main() to the second batch: {len(seen)} functions in {len(files)} files, {sum(seen.values()):,} "
          "lines")
    for path, lines in sorted(files.items(), key=lambda item: -item[1]):
        print(f"  {path:28} {lines:4}")
    for (path, line, name), lines in sorted(seen.items()) if verbose else []:
        print(f"  {path}:{line} {name} {lines}")


if __name__ == "__main__":
    from gptlib.errors import main_guard
    main_guard(main)
