"""The conversion report: a dataclass, its short text form and its JSON form."""

import collections
import dataclasses
import json

from tensorflow.lite.python import schema_py_generated as schema
from tensorflow.lite.tools import flatbuffer_utils

_BUILTIN_NAMES = {
    value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")
}


def op_histogram(tflite_model):
    """{op name: count} over all subgraphs; custom ops (Flex*) by their custom code."""
    model = flatbuffer_utils.convert_bytearray_to_object(bytearray(tflite_model))
    counts = collections.Counter()
    for subgraph in model.subgraphs:
        for operator in subgraph.operators:
            code = model.operatorCodes[operator.opcodeIndex]
            builtin = max(code.builtinCode, code.deprecatedBuiltinCode)
            if builtin == schema.BuiltinOperator.CUSTOM:
                custom = code.customCode
                counts[custom.decode() if isinstance(custom, bytes) else str(custom)] += 1
            else:
                counts[_BUILTIN_NAMES.get(builtin, f"BUILTIN_{builtin}")] += 1
    return dict(sorted(counts.items()))


@dataclasses.dataclass
class Report:
    input: str
    kind: str
    signature: str
    mode: str
    form: str
    output: str = ""
    float16_weights: bool = False
    promoted_to_float32: bool = False
    gelus: list = dataclasses.field(default_factory=list)  # [{"spelling", "alpha", "became", "count"}]
    leftover_erf: dict = dataclasses.field(default_factory=dict)
    ops: dict = dataclasses.field(default_factory=dict)
    flex_ops: list = dataclasses.field(default_factory=list)
    size_bytes: int = 0
    verified: bool = False
    not_verified_reason: str = ""
    runtime: str = ""
    inputs_used: str = ""
    fidelity: list = dataclasses.field(default_factory=list)
    drift: list = dataclasses.field(default_factory=list)
    tolerance: dict = dataclasses.field(default_factory=dict)
    warnings: list = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, default=str)

    def to_text(self, verbose=False):
        lines = [f"{self.input} ({self.kind}, signature {self.signature}) -> {self.output or '(not written)'}",
                 f"mode: {self.mode}" + (f", form: {self.form}" if self.mode == "builtin" else "")
                 + (", float16 weights" if self.float16_weights else "")]
        if self.promoted_to_float32:
            lines.append("half-precision compute graph: recomputed in float32")
        total = sum(entry["count"] for entry in self.gelus)
        lines.append(f"GELUs found: {total}")
        for entry in self.gelus:
            scale = "" if entry["alpha"] == 1.0 else f" (scaled, alpha={entry['alpha']:.6g})"
            lines.append(f"  {entry['count']} x {entry['spelling']}{scale} -> {entry['became']}")
        if self.leftover_erf:
            what = "kept" if self.mode == "select" else "rewritten as a builtin erf polynomial"
            lines.append("bare erf outside a GELU: " + ", ".join(
                f"{count} x {op}" for op, count in sorted(self.leftover_erf.items())) + f" ({what})")
        lines.append("ops: " + ", ".join(f"{name} {count}" for name, count in self.ops.items()))
        lines.append(f"size: {self.size_bytes:,} bytes")
        if self.verified:
            lines.append(f"parity on {self.inputs_used}, {self.runtime}:")
            for kind, comparisons in (("fidelity", self.fidelity), ("drift", self.drift)):
                for c in comparisons:
                    status = "ok" if c["passed"] else "FAIL"
                    lines.append(f"  {kind:8s} {c['output']}: max abs {c['max_abs']:.3g}, max rel "
                                 f"{c['max_rel']:.3g}, cosine {c['cosine']:.9f} {status}")
            if verbose:
                lines.append(f"  tolerance: {self.tolerance}")
        else:
            lines.append(f"not verified: {self.not_verified_reason}")
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        lines.append(f"time: {self.seconds:.1f} s")
        return "\n".join(lines)
