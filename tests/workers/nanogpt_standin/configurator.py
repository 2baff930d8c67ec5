# Read by train.py with exec, from the folder it runs in (as nanoGPT's is): a config file's settings, then
# --name=value flags, each overriding a setting train.py defines.
import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if not arg.startswith("--"):
        exec(open(arg).read())
        continue
    name, value = arg[2:].split("=", 1)
    assert name in globals(), f"unknown setting {name}"
    try:
        value = literal_eval(value)
    except (SyntaxError, ValueError):
        pass  # a string
    assert type(value) is type(globals()[name]), f"--{name}={value}: not a {type(globals()[name]).__name__}"
    globals()[name] = value
