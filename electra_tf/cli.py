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

import errno
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
        name = command_name(spec.name if spec else module_name)
        app.run(_one_line_errors(main, name), flags_parser=lambda argv: _parse_flags(argv, name))
    except BrokenPipeError:  # `electra-x --help | head`: the reader left; nothing to report
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(1)


def _parse_flags(argv, name: str):
    """absl's parsing, with a bad flag as one line (absl adds a second, a hint about --helpfull)."""
    try:
        return flags.FLAGS(argv)
    except flags.Error as e:
        raise SystemExit(f"{name}: error: " + "; ".join(str(e).splitlines())) from None


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
    """`main`, with the accidents of real use as one line on stderr instead of a traceback: a
    folder another run is writing, a full disk (`files.disk_full_message`), a folder that is a
    link, a path that cannot be written (read-only disk, no permission, a file where a folder
    belongs) and Ctrl-C (exit 130, as a shell reports SIGINT). What was finished is kept by the
    writers themselves (`electra_tf.files`). ELECTRA_TF_TRACEBACK=1 shows the traceback instead,
    for a bug report."""
    from electra_tf import files

    def wrapped(argv):
        if os.environ.get("ELECTRA_TF_TRACEBACK") == "1":
            return main(argv)
        try:
            return main(argv)
        except (files.FolderInUseError, files.LinkedFolderError) as e:
            raise SystemExit(f"{name}: error: {e}") from None
        except app.UsageError as e:  # absl would print the whole usage text before the error
            raise SystemExit(f"{name}: error: {e} (see {name} --help)") from None
        except KeyboardInterrupt:
            print(f"{name}: interrupted (SIGINT); what was finished is kept", file=sys.stderr)
            raise SystemExit(130) from None
        except Exception as e:  # pylint: disable=broad-except
            message = files.disk_full_message(e) or path_error_message(e)
            if message is None:
                raise
            raise SystemExit(f"{name}: error: {message}") from None

    return wrapped


_PATH_ERRNOS = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.ENOENT,
                errno.ELOOP, errno.ENAMETOOLONG}


def path_error_message(error: BaseException) -> str | None:
    """One line for a path the command cannot read or write (read-only disk, permission, a file
    where a folder belongs, a missing parent), naming the path; None for any other error."""
    if isinstance(error, OSError) and error.errno in _PATH_ERRNOS and error.filename:
        where = error.filename if error.filename2 is None else f"{error.filename} -> {error.filename2}"
        return f"{error.strerror}: {where}"
    tf = sys.modules.get("tensorflow")  # only when the command already loaded it
    if tf is not None and isinstance(error, (tf.errors.PermissionDeniedError,
                                                          tf.errors.FailedPreconditionError)):
        text = str(getattr(error, "message", None) or error).strip().splitlines()[0]
        if any(word in text for word in ("Read-only file system", "Permission denied", "Not a directory",
                                         "Is a directory")):
            return text
    return None
