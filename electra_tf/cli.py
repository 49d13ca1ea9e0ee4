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
        spec = getattr(module, "__spec__", None)  # under `python -m` the module is __main__
        app.run(_one_line_errors(main, command_name(spec.name if spec else module_name)))
    except BrokenPipeError:  # `electra-x --help | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def command_name(module_name: str) -> str:
    """The command's installed name (`electra-finetune` for electra_tf.tools.finetune), also when
    it runs as `python -m`."""
    from importlib import metadata

    try:
        for entry in metadata.entry_points(group="console_scripts"):
            if entry.value.split(":")[0] == module_name:
                return entry.name
    except Exception:  # pylint: disable=broad-except  (broken metadata: fall back to argv)
        pass
    return os.path.basename(sys.argv[0]) or "electra"


def _one_line_errors(main, name: str):
    """`main`, with the accidents of real use as one line and exit code 1 instead of a
    traceback: a folder another run is writing, a full disk (`files.disk_full_message`). What
    was finished is kept by the writers themselves (`electra_tf.files`)."""
    from electra_tf import files

    def wrapped(argv):
        try:
            return main(argv)
        except files.FolderInUseError as e:
            raise SystemExit(f"{name}: error: {e}") from None
        except Exception as e:  # pylint: disable=broad-except
            message = files.disk_full_message(e)
            if message is None:
                raise
            raise SystemExit(f"{name}: error: {message}") from None

    return wrapped
