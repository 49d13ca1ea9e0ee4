"""The CPU this process runs on, and TensorFlow's oneDNN kernels switched on where TensorFlow
leaves them off although they are its fast path (no TensorFlow import here).

TensorFlow's x86 wheels compile their own (Eigen) kernels for AVX only, and get their fast
kernels for matmuls, layer norms and softmaxes from oneDNN, which picks AVX2, AVX-512 or AMX code
at run time. Since TF 2.9, oneDNN is on by default on Linux only for CPUs with AVX512_VNNI,
AVX512_BF16, AVX_VNNI or AMX (`DefaultOneDnnPolicy`, tensorflow/core/util/port.cc). On an
AVX2-only CPU (Zen 2/3 servers, or a virtual machine that hides AVX-512) every matmul of the
step therefore ran on the AVX-only Eigen kernels: that, not the instruction set, is why the
pretraining step was 0.63x PyTorch's there. `enable_onednn` (run when `electra_tf` is
imported) sets TF_ENABLE_ONEDNN_OPTS=1 for such CPUs, before TensorFlow reads it; a value the
user set is left alone (`TF_ENABLE_ONEDNN_OPTS=0` turns the kernels off again).
Measured in docs/benchmarks.md ("Fast on every CPU kind").
"""

from __future__ import annotations

import os
import platform
import sys

# The vector and matrix instruction sets that decide which kernels run, in /proc/cpuinfo's names.
FEATURES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni",
            "amx_tile", "amx_bf16")
# TensorFlow turns oneDNN on by itself when the CPU has any of these (port.cc, Linux).
TF_ONEDNN_DEFAULT_ON = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8",
                        "amx_bf16")
ONEDNN_VARIABLE = "TF_ENABLE_ONEDNN_OPTS"
# oneDNN's own variables capping the instruction set its kernels use (the newer name first).
ISA_LIMITS = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")

# What `enable_onednn` did in this process: None (nothing), or why it set the variable.
onednn_set_because: str | None = None


def cpu_flags() -> tuple[str, set]:
    """(the CPU's model name, its /proc/cpuinfo flags); (platform's name, set()) elsewhere."""
    model, found = platform.processor() or "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name":
                    model = value.strip()
                elif key.strip() == "flags" and not found:
                    found = set(value.split())
    except OSError:
        pass
    return model, found


def vector_extensions() -> str:
    """The instruction sets of `FEATURES` this CPU has, e.g. "avx2 fma avx512f avx512_vnni", or
    "-" (none, or not Linux)."""
    _, found = cpu_flags()
    return " ".join(name for name in FEATURES if name in found) or "-"


def cpu_description() -> str:
    """The CPU model, its cores, which of `FEATURES` it has and lacks, and whether TensorFlow's
    oneDNN kernels are on (and who set them)."""
    model, found = cpu_flags()
    if not found:
        return model
    have = [name for name in FEATURES if name in found]
    lacks = [name for name in FEATURES if name not in found]
    return (f"{model}, {os.cpu_count()} cores; has {' '.join(have) or '-'}; "
            f"lacks {' '.join(lacks) or '-'}; {onednn_description()}")


def onednn_description(environ=None) -> str:
    """"oneDNN on" / "oneDNN off", with who decided (TensorFlow's default, the user's
    TF_ENABLE_ONEDNN_OPTS, or electra_tf for an AVX2-only CPU), and the instruction set its
    kernels are limited to when ONEDNN_MAX_CPU_ISA says (as when an AVX2-only CPU is emulated:
    /proc/cpuinfo then still lists AVX-512)."""
    environ = os.environ if environ is None else environ
    value = environ.get(ONEDNN_VARIABLE)
    limit = next((f", its kernels limited to {environ[name]} by {name}" for name in ISA_LIMITS
                  if environ.get(name)), "")
    if onednn_set_because:
        return f"oneDNN on ({ONEDNN_VARIABLE}=1 set by electra_tf: {onednn_set_because}){limit}"
    if value is not None:
        on = value.strip().lower() in ("1", "true")
        return f"oneDNN {'on' if on else 'off'} ({ONEDNN_VARIABLE}={value}){limit if on else ''}"
    _, found = cpu_flags()
    if any(name in found for name in TF_ONEDNN_DEFAULT_ON):
        return f"oneDNN on (TensorFlow's default for this CPU){limit}"
    hint = (f"; {ONEDNN_VARIABLE}=1, or importing electra_tf before TensorFlow, turns on its "
            "AVX2 kernels" if {"avx2", "fma"} <= found else "")
    return f"oneDNN off (TensorFlow's default for this CPU{hint})"


def enable_onednn(environ=None, modules=None) -> str | None:
    """Sets TF_ENABLE_ONEDNN_OPTS=1 in `environ` (os.environ) on an x86 Linux CPU with AVX2 and
    FMA for which TensorFlow would leave oneDNN off, unless the variable is set or TensorFlow is
    already among `modules` (sys.modules: it reads the variable once, when imported). Returns
    why it set it, or None."""
    global onednn_set_because
    environ = os.environ if environ is None else environ
    modules = sys.modules if modules is None else modules
    if ONEDNN_VARIABLE in environ or "tensorflow" in modules:
        return None
    _, found = cpu_flags()
    if not {"avx2", "fma"} <= found or any(name in found for name in TF_ONEDNN_DEFAULT_ON):
        return None
    environ[ONEDNN_VARIABLE] = "1"
    onednn_set_because = ("TensorFlow leaves it off on CPUs without AVX512_VNNI/AVX_VNNI/AMX, "
                          "where its own kernels use AVX only")
    return onednn_set_because
