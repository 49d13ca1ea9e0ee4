"""What every `electra-*` command shares: its usage text and `--help`.

absl's `--help` prints the `__main__` module's docstring and the flags that module defines. An
installed console script's `__main__` is a wrapper that defines nothing, so `--help` printed only
"Try --helpfull". `run` makes the command's own module the one `--help` describes: its docstring
is the usage text and its flags are listed with their help. The commands import TensorFlow inside
`main`, after the flags are parsed, so `--help` answers without loading it.

Example (the end of a command module):

    def run():
        cli.run(main, __name__)
"""

from __future__ import annotations

import os
import sys

from absl import app, flags


def run(main, module_name: str) -> None:
    """`app.run(main)` with `module_name`'s docstring and flags as the command's help."""
    module = sys.modules[module_name]
    sys.modules["__main__"].__doc__ = module.__doc__
    main_name = sys.argv[0]
    for flag in flags.FLAGS.get_key_flags_for_module(module_name):
        flags.FLAGS.register_key_flag_for_module(main_name, flag)
    try:
        if any(arg in ("-h", "-?", "--help", "--helpshort") for arg in sys.argv[1:]):
            app.usage(shorthelp=True, writeto_stdout=True, exitcode=0)  # absl's own exits 1
        app.run(main)
    except BrokenPipeError:  # `electra-x --help | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)
