"""The shell commands of README.md's ```sh blocks, for the tests that hold the README to the code."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def sh_commands(path: Path = README) -> list[str]:
    """Every command line of the file's ```sh blocks: continuation lines joined, comments dropped."""
    commands, block, in_sh = [], [], False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            in_sh = line.strip() == "```sh" and not in_sh
            continue
        if in_sh:
            block.append(line)
    joined = "\n".join(block).replace("\\\n", " ")
    for line in joined.splitlines():
        line = line.split(" # ")[0].strip() if not line.lstrip().startswith("#") else ""
        if line:
            commands.append(re.sub(r"\s+", " ", line))
    return commands


def program_and_flags(command: str) -> tuple[str, list[str]]:
    """("electra-pretrain" or "electra_tf.tools.replicate" or the first word, [flag names as written])."""
    words = shlex.split(command)
    while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value prefixes
        words = words[1:]
    if len(words) > 2 and re.search(r"python(3(\.\d+)?)?$", words[0]) and words[1] == "-m":
        program, rest = words[2], words[3:]
    else:
        program, rest = words[0], words[1:]
    names = [re.match(r"--([A-Za-z_0-9]+)", w).group(1) for w in rest if re.match(r"--[A-Za-z_]", w)]
    return program, names
