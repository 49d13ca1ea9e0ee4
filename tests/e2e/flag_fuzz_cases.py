"""The cases of `test_flag_fuzz.py`: every command's own flags, found by importing the command,
mutated a few at a time from a fixed seed, and run as a subprocess against real tiny files.

A case runs in a folder of its own holding two parts:
- `user/`, what the user already has: the inputs the base invocation reads (corpus, vocab,
  shards, an Electric checkpoint, its export, a task CSV) and two sentinels (`sentinel.txt`,
  `sentinel_dir/keep.txt`) that links and misplaced paths point at. Nothing under it may change:
  every file's bytes, mode and mtime, every link's target and the set of names are compared
  before and after the run.
- `out/`, the output folder: the command's working directory and HOME, where the base
  invocation writes and where the planted links and the read-only folder live.

A flag's mutations come from its kind (absl's parser: int, float, enum, bool, string, list) and,
for strings, from its role: a path the command reads ("in"), a path it writes ("out"), or plain
text. Values the parser refuses take one path (`electra_tf.cli`), so each command gets one such
case; the cases that matter are the values the command itself must judge. Path roles are named
in `PATH_FLAGS` where the name does not say it; a string flag added later is classified by its
name (`path_role`), so it is fuzzed too.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import random
import re
import stat
import struct
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# command -> module under electra_tf.tools: the console scripts, and generate_models_config, cheap
# to fuzz, when it is not one (the demo, replication and ranking study, run with `python -m`,
# train for minutes when a case happens to be valid). The tables below are keyed by module.
COMMANDS = dict(re.findall(r'"(electra-[a-z-]+)=electra_tf\.tools\.(\w+):run"',
                           (ROOT / "setup.py").read_text()))
if "generate_models_config" not in COMMANDS.values():
    COMMANDS["generate_models_config"] = "generate_models_config"

# What is fed to the tools: (role, kind). role "in" is read, "out" is written; kind "file",
# "dir", or "any" (a checkpoint prefix or folder, a config name or file, a shard glob).
PATH_FLAGS = {
    "build_vocab": {"input": ("in", "file"), "output": ("out", "file")},
    "build_pretraining_data": {"input": ("in", "file"), "vocab_file": ("in", "file"),
                               "output_dir": ("out", "dir")},
    "pretrain": {"config": ("in", "any"), "data": ("in", "any"), "model_dir": ("out", "dir"),
                 "vocab_file": ("in", "file"), "init_checkpoint": ("in", "any"),
                 "init_generator": ("in", "any")},
    "finetune": {"train_file": ("in", "file"), "eval_file": ("in", "file"), "data_dir": ("in", "dir"),
                 "tfds_data_dir": ("in", "dir"), "init_checkpoint": ("in", "any"),
                 "config": ("in", "any"), "vocab_file": ("in", "file"), "model_dir": ("out", "dir")},
    "convert": {"input": ("in", "any"), "output": ("out", "dir"), "config": ("in", "any")},
    "score": {"checkpoint": ("in", "any"), "input": ("in", "file"), "output": ("out", "file"),
              "vocab_file": ("in", "file")},
    "export": {"checkpoint": ("in", "any"), "export_base": ("out", "dir")},
    "serve": {"model_base_path": ("in", "dir"), "model_config_file": ("in", "file"),
              "batching_parameters_file": ("in", "file"), "monitoring_config_file": ("in", "file")},
    "pretrain_smoke": {"workdir": ("out", "dir")},
    "generate_models_config": {"output": ("out", "file")},
}
# Strings that are not paths although their names could say so.
NOT_PATHS = {("client", "server"), ("serve", "host"), ("finetune", "tpu"), ("pretrain", "tpu")}
# Values never tried, whatever the draw: a host that would expose a server to the network.
NEVER = {("serve", "host"): {"", "0.0.0.0", "::"}}


def path_role(module: str, name: str) -> tuple[str, str] | None:
    """(role, kind) of a string flag that holds a path, None for plain text."""
    if (module, name) in NOT_PATHS:
        return None
    if name in PATH_FLAGS.get(module, {}):
        return PATH_FLAGS[module][name]
    kind = "dir" if re.search(r"dir|base|folder", name) else "file" if "file" in name else "any"
    if re.search(r"^output|^export|model_dir|workdir", name):
        return "out", kind
    if re.search(r"dir|file|path|input|checkpoint|base", name):
        return "in", kind
    return None


# --- discovery ----------------------------------------------------------------------------------
_DISCOVER = """
import json, sys
from absl import flags
import electra_tf.tools.{module} as m
out = []
for f in flags.FLAGS.get_flags_for_module(m):
    parser = type(f.parser).__name__
    kind = ("bool" if f.boolean else "enum" if hasattr(f.parser, "enum_values")
            else "int" if "Integer" in parser else "float" if "Float" in parser
            else "list" if "List" in parser else "string")
    default = f.default if isinstance(f.default, (str, int, float, bool, list)) else None
    out.append(dict(name=f.name, kind=kind, default=default,
                    enum=list(getattr(f.parser, "enum_values", None) or [])))
print(json.dumps(out))
"""


def discover_flags(module: str) -> list[dict]:
    """The flags `electra_tf.tools.MODULE` defines itself: name, kind, default, enum values. In a
    process of its own, as two commands may define the same flag name."""
    proc = subprocess.run([sys.executable, "-c", _DISCOVER.format(module=module)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"listing the flags of {module}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the base invocations -----------------------------------------------------------------------
def base_flags(module: str, user: Path, out: Path, server: str) -> dict[str, object]:
    """A realistic, short run of the command of `module` on the files in `user`, writing under
    `out`: one step, tiny sizes, so that a mutation that turns out valid costs seconds. A list is
    a flag given once per value. `server` is host:port of a running electra-serve."""
    electric = str(user / "electric" / "discriminator")
    vocab = str(user / "vocab.txt")
    every = {
        "build_vocab": dict(input=[str(user / "corpus.txt")], output=str(out / "vocab.txt"),
                            vocab_size=120, max_lines=60),
        "build_pretraining_data": dict(input=[str(user / "corpus.txt")], vocab_file=vocab,
                                       output_dir=str(out / "shards"), max_seq_length=32,
                                       num_shards=1, num_processes=1),
        "pretrain": dict(config="electra_tiny", data=str(user / "shards" / "pretrain_data.tfrecord-*"),
                         vocab_file=vocab, model_dir=str(out / "run"), max_seq_length=32,
                         train_batch_size=2, num_train_steps=1, num_warmup_steps=0, steps_per_loop=1,
                         save_checkpoints_steps=1, summary_steps=1, seed=0),
        "finetune": dict(task="classification", train_file=str(user / "train.csv"),
                         eval_file=str(user / "dev.csv"), config="electra_tiny", vocab_file=vocab,
                         model_dir=str(out / "ft"), num_train_epochs=1, train_batch_size=4,
                         eval_batch_size=4, max_seq_length=16, log_every_steps=1),
        "convert": dict(input=electric, output=str(out / "converted")),
        "score": dict(checkpoint=electric, input=str(user / "sentences.txt"),
                      output=str(out / "scores.tsv"), batch_size=2),
        "export": dict(checkpoint=electric, export_base=str(out / "export"), model_name="electric",
                       max_seq_length=16),
        # No load retries: TF Serving's 5 a minute apart hold the start of a server whose
        # mutated flags fail the load (e.g. --saved_model_tags) for 5 minutes, as TF Serving's.
        "serve": dict(model_base_path=str(user / "export" / "electric"), rest_api_port=0, port=0,
                      host="127.0.0.1", file_system_poll_wait_seconds=0, max_num_load_retries=0),
        "client": dict(server=server, model_name="electric", signature_name="score",
                       text=["the film was good"]),
        "pretrain_smoke": dict(workdir=str(out / "smoke"), num_documents=8, vocab_size=150, steps=1,
                               batch_size=2, max_seq_length=16, log_every=1),
        "generate_models_config": dict(model=[f"electric:{user / 'export' / 'electric'}"],
                                       output=str(out / "models.config")),
    }
    return dict(every[module])


def argv(flags: dict[str, object]) -> list[str]:
    """--name=value for every flag (each value of a list), in insertion order; a value of None
    drops the flag."""
    out = []
    for name, value in flags.items():
        for v in value if isinstance(value, list) else [value]:
            if v is not None:
                out.append(f"--{name}={v}")
    return out


# --- mutations ----------------------------------------------------------------------------------
# Values the flag parser itself refuses: one code path (`cli`), so a few cases per command.
UNPARSABLE = {"int": ["abc", "1.5", "", "0x"], "float": ["abc", "", "1,5"],
              "bool": ["maybe", "2", ""], "enum": ["bogus", ""], "list": [], "string": []}
# Values the command must judge: ranges, odd texts, paths (tokens `materialise` turns into paths).
INTS = ["0", "-1", "99999999999999999999"]
FLOATS = ["nan", "inf", "-inf", "-1", "0", "1e400"]
TEXTS = ["", "bogus", "../../escape", "x" * 300, "a\nb", "-", " "]
LISTS = ["", ",", "bogus", "a,a", "x" * 300]
LEGEND = ("@missing: a path that does not exist; @link_file / @link_dir: a link, in the output "
          "folder, to the user's file / folder; @dangling: a link to a free name in the user's folder; "
          "@loop: a link to itself; @file_for_dir / @dir_for_file: the user's own file / folder; "
          "@empty_file: an empty file; @readonly: a folder nothing can be created in (chmod 555, "
          "chattr +i); @nowhere: a folder under /sys; @same: the path another flag of the command "
          "reads; @too_long: a 300-character name")
PATHS_IN = ["@missing", "@link_file", "@link_dir", "@dangling", "@loop", "@file_for_dir",
            "@dir_for_file", "@empty_file", "", "@same"]
PATHS_OUT = ["@link_file", "@link_dir", "@dangling", "@file_for_dir", "@dir_for_file",
             "@readonly", "@nowhere", "", "@same", "@too_long"]


def judged_values(module: str, flag: dict) -> list[str]:
    """The values a flag is fuzzed with past the parser: its kind's ranges or paths, the enum
    values it does not default to (a TPU strategy on a CPU, a checkpoint format that is not the
    input's), the other setting of a bool."""
    kind, name = flag["kind"], flag["name"]
    if kind == "bool":
        values = ["false" if flag["default"] else "true"]
    elif kind == "int":
        values = list(INTS)
    elif kind == "float":
        values = list(FLOATS)
    elif kind == "enum":
        values = [v for v in flag["enum"] if v != flag["default"]] or ["bogus"]
    elif kind == "list":
        values = list(LISTS)
    else:
        role = path_role(module, name)
        values = list(TEXTS) if role is None else list(PATHS_OUT if role[0] == "out" else PATHS_IN)
        # An output is given the user's file where it writes a folder, or the user's folder where
        # it writes a file. The user's file where it writes a file (or folder for a folder) is no
        # mismatch, and whether to replace it is the command's rerun rule: not tried.
        if role is not None and role[0] == "out":
            no_mismatch = {"file": "@file_for_dir", "dir": "@dir_for_file"}.get(role[1])
            values = [v for v in values if v != no_mismatch]
    return [v for v in values if v not in NEVER.get((module, name), ())]


@dataclasses.dataclass
class Case:
    command: str  # as the user types it
    module: str  # electra_tf.tools.MODULE
    changes: dict[str, str]  # flag -> value (a path token or a literal)
    extra: list[str] = dataclasses.field(default_factory=list)  # arguments added as they are

    def label(self) -> str:
        shown = [f"--{k}={v!r}" if len(str(v)) < 60 else f"--{k}='{str(v)[:12]}...'({len(v)} chars)"
                 for k, v in self.changes.items()]
        return " ".join(shown + self.extra)


def cases_for(command: str, module: str, flags: list[dict], seed: int, budget: int) -> list[Case]:
    """`budget` cases that between them give every flag a judged value (two or three flags a
    case when there are more flags than cases), then one flag the parser refuses, an unknown
    flag, and a stray argument. Drawn from a generator of this command's own (`seed` and the
    module's name), so a flag added to one command leaves the others' cases as they were."""
    rng = random.Random(f"{seed}:{module}")
    order = list(flags)
    rng.shuffle(order)
    groups = [order[i::budget] for i in range(min(budget, len(order)))]
    cases = [Case(command, module, {f["name"]: rng.choice(judged_values(module, f)) for f in group})
             for group in groups]
    parsed = [f for f in flags if UNPARSABLE[f["kind"]]]
    if parsed:
        f = rng.choice(parsed)
        cases.append(Case(command, module, {f["name"]: rng.choice(UNPARSABLE[f["kind"]])}))
    cases.append(Case(command, module, {}, ["--no_such_flag=1"]))
    cases.append(Case(command, module, {}, ["stray_argument"]))
    return cases


# --- a case's folders ---------------------------------------------------------------------------
def materialise(token: str, case: Case, name: str, base: dict, user: Path, out: Path) -> str:
    """The path a token stands for, planting what it needs in `out`."""
    if not token.startswith("@"):
        return token
    slot = out / f"fuzz_{name}"
    if token == "@missing":
        return str(out / "missing" / "nothing_here")
    if token == "@link_file":
        slot.symlink_to(user / "sentinel.txt")
    elif token == "@link_dir":
        slot.symlink_to(user / "sentinel_dir", target_is_directory=True)
    elif token == "@dangling":  # following it would create a file in user/
        slot.symlink_to(user / "created_through_a_link")
    elif token == "@loop":
        slot.symlink_to(slot.name)
    elif token == "@file_for_dir":
        return str(user / "sentinel.txt")
    elif token == "@dir_for_file":
        return str(user / "sentinel_dir")
    elif token == "@empty_file":
        slot.write_bytes(b"")
    elif token == "@readonly":  # the folder itself where a folder is written, else a name in it
        slot.mkdir()
        slot.chmod(0o555)
        set_immutable(slot, True)  # root ignores the mode, not this flag
        return str(slot) if (path_role(case.module, name) or ("", ""))[1] == "dir" else str(slot / "output")
    elif token == "@nowhere":  # a place no one can create a folder in, root included
        return "/sys/electra-flag-fuzz/output"
    elif token == "@too_long":
        return str(out / ("x" * 300))
    elif token == "@same":  # the path another flag reads: output = input, vocab = corpus, ...
        first = lambda value: value[0] if isinstance(value, list) else value
        kind = (path_role(case.module, name) or ("", ""))[1]
        inputs = [k for k, v in base.items() if k != name and str(first(v)).startswith("/")
                  and (path_role(case.module, k) or ("",))[0] == "in"]
        if not inputs:
            return str(user / "sentinel.txt")
        # One of the same kind first: a file written over the file read.
        return first(base[min(inputs, key=lambda k: (path_role(case.module, k)[1] != kind, k))])
    return str(slot)


_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def set_immutable(folder: Path, on: bool) -> bool:
    """Sets or clears the Linux immutable attribute (`chattr +i`) of `folder`: nothing can be
    created in it, by root either. Needs CAP_LINUX_IMMUTABLE and a file system that has it (ext4,
    xfs, btrfs); False where it cannot (then a non-root user still meets the folder's mode)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return False
    try:
        flags = struct.unpack("l", fcntl.ioctl(fd, _FS_IOC_GETFLAGS, struct.pack("l", 0)))[0]
        flags = flags | _FS_IMMUTABLE_FL if on else flags & ~_FS_IMMUTABLE_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, struct.pack("l", flags))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def release(folder: Path) -> None:
    """Makes every folder under `folder` writable again (the read-only ones planted), so that
    it can be removed."""
    for path in [folder, *folder.rglob("*")]:
        if path.is_dir() and not path.is_symlink():
            set_immutable(path, False)
            path.chmod(0o755)


def command_line(case: Case, user: Path, out: Path, server: str) -> list[str]:
    """The full argv of `case` (python -m electra_tf.tools.MODULE ...)."""
    base = base_flags(case.module, user, out, server)
    flags = dict(base)
    for name, token in case.changes.items():
        value = materialise(token, case, name, base, user, out)
        flags[name] = [value] if isinstance(base.get(name), list) else value
    return [sys.executable, "-m", f"electra_tf.tools.{case.module}",
            *argv(flags), *case.extra]


def snapshot(folder: Path) -> dict[str, tuple]:
    """relative path -> what it is: (file, sha256, mode, mtime_ns), (link, target) or (dir, mode)."""
    out = {}
    for root, dirs, names in os.walk(folder):
        for name in dirs + names:
            path = os.path.join(root, name)
            st = os.lstat(path)
            rel = os.path.relpath(path, folder)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path))
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode))
            else:
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
                out[rel] = ("file", digest, stat.S_IMODE(st.st_mode), st.st_mtime_ns)
    return out


def changes(before: dict, after: dict) -> list[str]:
    """What differs between two snapshots, one phrase per path."""
    out = []
    for rel in sorted(set(before) | set(after)):
        if rel not in after:
            out.append(f"removed {rel}")
        elif rel not in before:
            out.append(f"created {rel}")
        elif before[rel] != after[rel]:
            out.append(f"changed {rel}")
    return out


# absl / TensorFlow log lines, Python warnings (and the source line they quote), which are not the
# command's complaint.
_LOG_LINE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|(INFO|WARNING|ERROR|DEBUG):|WARNING: All log messages|"
                       r"To enable the following instructions)")
_WARNING_LINE = re.compile(r"^\S.*:\d+: \w*Warning: ")


def complaint(stderr: str) -> list[str]:
    """stderr's lines that are not log lines or warnings."""
    out, after_warning = [], False
    for line in stderr.splitlines():
        quoted = after_warning and line.startswith(" ")
        after_warning = bool(_WARNING_LINE.match(line))
        if line.strip() and not quoted and not after_warning and not _LOG_LINE.match(line):
            out.append(line)
    return out
