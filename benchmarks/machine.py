"""Where a benchmark ran: the header line every benchmark prints first.

The same code differs in speed, in int8 speed-up and even in float results
between CPU kinds (AVX2 only, where TensorFlow leaves oneDNN off, and AVX-512
with VNNI, where it is on by default), so every table says which one it is.
"""

import os
import platform

_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
# TensorFlow turns oneDNN on by default on x86 CPUs with these (tensorflow/core/util/util.cc).
_ONEDNN_BY_DEFAULT = ("avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def _cpuinfo():
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            text = cpuinfo.read()
    except OSError:
        return platform.processor() or platform.machine(), set()
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    fields = {key.strip(): value.strip() for key, value in fields.items()}
    return fields.get("model name", platform.machine()), set(fields.get("flags", "").split())


def cpu_kind():
    """'AVX-512 + VNNI' or 'AVX2' (or what else the flags say): the kind the README's tables are sorted by."""
    _, flags = _cpuinfo()
    if "avx512f" in flags:
        return "AVX-512 + VNNI" if "avx512_vnni" in flags else "AVX-512"
    return "AVX2" if "avx2" in flags else platform.machine()


def onednn_on():
    """Whether TensorFlow runs with oneDNN here: TF_ENABLE_ONEDNN_OPTS if set, else TensorFlow's default."""
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if setting is not None:
        return setting.strip().lower() in ("1", "true")
    _, flags = _cpuinfo()
    return any(flag in flags for flag in _ONEDNN_BY_DEFAULT)


def header(threads=None):
    """One line: CPU model, kind, flags, threads and oneDNN, e.g. for a table's caption."""
    model, flags = _cpuinfo()
    present = " ".join(flag for flag in _FLAGS if flag in flags) or "none of " + "/".join(_FLAGS)
    threads = f"{threads} thread{'s' if threads != 1 else ''} of {os.cpu_count()} CPUs" if threads else \
        f"{os.cpu_count()} CPUs"
    return (f"CPU: {model} ({cpu_kind()}; flags {present}); {threads}; "
            f"oneDNN {'on' if onednn_on() else 'off'}")
