"""How a benchmark row's process is set up for the CPU it stands for: an AVX2-only CPU
emulated on one with AVX-512, and oneDNN set per framework as it would be there. No flags are
defined here, so tests and other benchmarks import it without clashing with a binary's flags."""

import os

# An AVX2-only CPU, emulated on one with AVX-512: no library emits AVX-512 code.
AVX2_ENV = {"ONEDNN_MAX_CPU_ISA": "AVX2", "XLA_FLAGS": "--xla_cpu_max_isa=AVX2",
            "ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}


def row_environment(row: str, emulate_avx2: bool) -> dict:
    """The environment of a row's process. TensorFlow's oneDNN switch (TF_ENABLE_ONEDNN_OPTS)
    is set for every TensorFlow row, unless the user set it: electra_tf's rows get what
    `electra_tf.cpu` decides for the CPU (emulated: an AVX2-only one, so on), Model Garden's
    what TensorFlow decides by itself (its child imports `electra_tf.config`, which would
    otherwise apply our rule to it)."""
    from electra_tf import cpu

    env = dict(os.environ)
    if emulate_avx2:
        env.update(AVX2_ENV)
    if cpu.ONEDNN_VARIABLE in os.environ or row == "torch":
        return env
    _, found = cpu.cpu_flags()
    tf_default = not emulate_avx2 and any(name in found for name in cpu.TF_ONEDNN_DEFAULT_ON)
    ours = tf_default or (emulate_avx2 or {"avx2", "fma"} <= found)
    env[cpu.ONEDNN_VARIABLE] = "1" if (tf_default if row == "model_garden" else ours) else "0"
    return env


def header_lines(rows, emulate_avx2: bool) -> list[str]:
    """A benchmark report's lines on the CPU: its model, extensions and oneDNN state, the
    emulation's variables when AVX2 is emulated, and each TensorFlow row's oneDNN switch."""
    from electra_tf.cpu import ONEDNN_VARIABLE, cpu_description

    lines = [f"CPU: {cpu_description()}"]
    if emulate_avx2:
        lines.append("EMULATED AVX2-only CPU: " + " ".join(f"{k}={v}" for k, v in AVX2_ENV.items()))
    lines.append("oneDNN per row: " + ", ".join(
        f"{row} {row_environment(row, emulate_avx2).get(ONEDNN_VARIABLE, '-')}"
        for row in rows if row != "torch"))
    return lines
