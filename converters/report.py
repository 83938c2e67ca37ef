"""The conversion report: a dataclass, its short text form and its JSON form."""

import dataclasses
import json

from keras_gelu import vocabulary

from . import safe_text

_NUMBER = (int, float)


class _Optional:
    """A schema's entry that may be absent or None."""

    def __init__(self, shape):
        self.shape = shape


class _Mapping:
    """A schema's {name: value} of any names."""

    def __init__(self, shape):
        self.shape = shape


_COUNTS = _Mapping(int)
_COMPARISON = {"output": str, "max_abs": _NUMBER, "passed": bool, "steps": _Optional(_NUMBER)}
_PARITY = {**_COMPARISON, "max_rel": _NUMBER, "cosine": _NUMBER}
# A tensor's row in an explanation (running/explain.py), which the page and the refusal's line read.
_TENSOR = {"name": str, "layer": str, "op": str, "position": int, "type": str, "scale": _Optional(_NUMBER),
           "max_abs": _NUMBER, "steps": _Optional(_NUMBER), "cosine": _NUMBER, "snr_db": _NUMBER, "lost_db": _NUMBER,
           "gelu": _Optional(str), "outlier": _Optional({"channel": int, "ratio": _NUMBER})}
# What the text form reads of each field that holds more than a value, as a schema: a dict is {key: shape}
# (other keys may be there too), a list [shape] of any length.
_SHAPES = {
    "gelus": [{"pattern": str, "alpha": _NUMBER, "became": str, "count": int}],
    "leftover_erf": _COUNTS, "ops": _COUNTS, "float_ops": _COUNTS, "islands_made_integer": _COUNTS,
    "kernel_grids": _COUNTS, "op_types": _Mapping(_COUNTS), "flex_ops": [str], "warnings": [str],
    "retyped_to_float32": [str],
    "fidelity": [_PARITY], "drift": [_PARITY], "stage_seconds": _Mapping(_NUMBER),
    "tolerance": {"rounding_envelope": _Optional({"fraction": _NUMBER, "trials": int,
                                                  "steps": _Mapping(_Optional(_NUMBER))})},
    "explanation": _Optional({"tensors": [_TENSOR], "gelus": [_TENSOR], "worst": _Optional(str),
                              "worst_outlier": _Optional(str),
                              "histogram": _Optional({"edges": [_NUMBER], "counts": [int]}), "samples": int,
                              "reference": str}),
    "budget": _Optional({"min_cosine": _NUMBER, "cosine": _NUMBER, "output": str, "passed": bool}),
    "ranges_repaired": _Optional({"widened": [str], "float_ops": [str], "narrowed": [str],
                                  "multiplied_by_zero": [str]}),
    "lifted": _Optional({"cosine_before": _NUMBER, "cosine": _NUMBER, "trials": int, "float_ops": [str],
                         "stopped": str,
                         "lifts": [{"tensor": str, "layer": str, "op": str, "lost_db": _NUMBER, "float_ops": [str],
                                    "layers": [str], "cosine_without": _Optional(_NUMBER)}]}),
    "target": _Optional({"name": str, "runtime": str, "lacks": str, "runtime_check": _Optional(str),
                         "fidelity": [_COMPARISON], "agreement": [_COMPARISON], "notes": [str],
                         "ops": _Optional({"on_target": _COUNTS, "cpu_fallback": _COUNTS})}),
}


# The lifts --mixed-precision's text names, the worst first (-v: every one)
_LIFTS_SHOWN = 8


# What only the side outside the sandbox states, whatever a worker's report says.
_SUPERVISORS = ("explained_in", "output")


def _numbers_within_float(value):
    """Whether every integer in a JSON value fits a float (a text form formats them as floats)."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > 2**63:
            return False
        if isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
    return True


def _conforms(value, shape):
    if isinstance(shape, _Optional):
        return value is None or _conforms(value, shape.shape)
    if isinstance(shape, _Mapping):
        return isinstance(value, dict) and all(_conforms(item, shape.shape) for item in value.values())
    if isinstance(shape, dict):
        return isinstance(value, dict) and all(
            _conforms(value.get(key), entry) if isinstance(entry, _Optional) else key in value and
            _conforms(value[key], entry) for key, entry in shape.items())
    if isinstance(shape, list):
        return isinstance(value, list) and all(_conforms(item, shape[0]) for item in value)
    if shape is int or shape is float or shape == _NUMBER:
        return isinstance(value, shape) and not isinstance(value, bool)
    return isinstance(value, shape)


def _completed(value, shape):
    """`value` (which `_conforms` to `shape`) with each optional key of a dict in it that it lacks as None, as a
    conversion writes it: the text form and the page read every key their shapes name."""
    if isinstance(shape, _Optional):
        return None if value is None else _completed(value, shape.shape)
    if isinstance(shape, _Mapping):
        return {key: _completed(item, shape.shape) for key, item in value.items()}
    if isinstance(shape, dict):
        return {**value, **{key: _completed(value.get(key), entry) for key, entry in shape.items()}}
    if isinstance(shape, list):
        return [_completed(item, shape[0]) for item in value]
    return value


def counted(counts):
    """{name: count} as "2 x GELU, 1 x TILE", sorted by name."""
    return ", ".join(f"{count} x {name}" for name, count in sorted(counts.items()))


def _ops(count):
    return f"{count} op" + ("" if count == 1 else "s")


def _repairs_lines(repairs):
    """The report's lines for the calibrated ranges repaired (quantizer.Repairs, as a dict)."""
    widened, kept, narrowed = repairs["widened"], repairs["float_ops"], repairs["narrowed"]
    lines = []
    if widened or kept:
        lines.append(f"  ranges the quantizer cannot take: {len(widened)} too narrow for a grid (0 throughout) "
                     f"widened to [-1, 1]; {_ops(len(kept))} kept float beside an unbounded one (an infinity, or "
                     "float32's largest value, that a later op discards)")
    if narrowed:
        lines.append(f"  softmax inputs: {len(narrowed)} range{'' if len(narrowed) == 1 else 's'} reaching only as "
                     "far below each row's largest value as the softmax tells apart (masked scores set them)")
    if repairs["multiplied_by_zero"]:
        count = len(repairs["multiplied_by_zero"])
        lines.append(f"  {count} range{'' if count == 1 else 's'} holding only the values an output reads (the others "
                     "only ever multiplied by an exact zero, as a LayerNormalization's factor for a row of zeros is)")
    return lines


@dataclasses.dataclass
class Report:
    input: str
    kind: str
    signature: str
    mode: str
    exact_as: str  # how builtin mode computes exact GELU (--form); None in other modes
    output: str = ""
    float16_weights: bool = False
    retyped_to_float32: list = dataclasses.field(default_factory=list)  # float types computed in float32
    trusted: bool = False  # --trust-model: the code and outside-world checks were skipped
    gelus: list = dataclasses.field(default_factory=list)  # [{"pattern", "alpha", "became", "count"}]
    leftover_erf: dict = dataclasses.field(default_factory=dict)
    ops: dict = dataclasses.field(default_factory=dict)
    int8: bool = False  # quantized: int8, or (a .tflite's) int16 activations
    step_type: str = "int8"  # what an output step is: "int8", or "int16" for a 16x8 .tflite
    quantization_aware: bool = False
    int8_ranges: str = ""  # where the int8 ranges came from
    ranges_repaired: dict = None  # calibrated ranges repaired before quantizing: quantizer.Repairs, as a dict
    op_types: dict = dataclasses.field(default_factory=dict)  # {op: {output type: count}}
    float_ops: dict = dataclasses.field(default_factory=dict)  # what stayed float in an int8 model
    islands_made_integer: dict = dataclasses.field(default_factory=dict)  # a .tflite's float ops, {op: count}
    # {op: count} of int8 outputs put on the finest grid their kernel takes (tflite/kernel_grids.py)
    kernel_grids: dict = dataclasses.field(default_factory=dict)
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
    target: dict = dataclasses.field(default_factory=dict)  # --target: profile, checks, verdict, figures
    seconds: float = 0.0
    stage_seconds: dict = dataclasses.field(default_factory=dict)  # load (and freeze), rewrite, convert, verify
    containment: str = ""  # what confined the process that read and ran the model (sandbox.worker)
    peak_bytes: int = 0  # that process's peak resident memory
    stage_peak_bytes: dict = dataclasses.field(default_factory=dict)  # {step: peak resident memory seen in it}
    # an int8 model judged against the float model: {"min_cosine", "cosine" (the worst output's), "output",
    # "passed"}; {} where no budget applies
    budget: dict = dataclasses.field(default_factory=dict)
    explanation: dict = None  # --explain, or a refusal for the budget: every tensor against the float model
    lifted: dict = None  # --mixed-precision: what was lifted to float and why (running/lifting.py's Lifting)
    explained_in: str = ""  # the folder --explain wrote its files in (set outside the sandbox)

    def _lifted_lines(self, verbose):
        if self.lifted is None:
            return []
        lifted = self.lifted
        lines = [f"  mixed precision: cosine {lifted['cosine_before']:.6f} in int8, {lifted['cosine']:.6f} with "
                 f"{_ops(len(lifted['float_ops']))} kept float ({len(lifted['lifts'])} lift(s) kept, "
                 f"{lifted['trials']} quantization(s) tried)"]
        shown = lifted["lifts"] if verbose else lifted["lifts"][:_LIFTS_SHOWN]
        lines.extend(f"    lifted {lift['layer']} ({lift['op']}, lost {lift['lost_db']:.1f} dB): "
                     f"{_ops(len(lift['float_ops']))} in float ({', '.join(lift['layers'])}), "
                     + ("not tried without" if lift["cosine_without"] is None else
                        f"cosine {lift['cosine_without']:.6f} without it") for lift in shown)
        if len(shown) < len(lifted["lifts"]):
            lines.append(f"    and {len(lifted['lifts']) - len(shown)} more, the less lossy (-v, or --report-json, "
                         "lists them)")
        if not lifted["stopped"] and any(lift["cosine_without"] is None for lift in lifted["lifts"]):
            lines.append("    (the search's limit came before every lift was tried without: some may not be needed)")
        return lines

    def note_flex_ops(self):
        """Name the Flex ops left in `ops`, with a warning: most runtimes cannot run them."""
        self.flex_ops = sorted(op for op in self.ops if op.startswith("Flex"))
        if self.flex_ops:
            self.warnings.append("the model uses Flex ops (" + ", ".join(self.flex_ops) + "): the runtime must "
                                 "link the Flex delegate (select TF ops), which most mobile and MCU runtimes do not")

    def to_dict(self):
        return json.loads(self.to_json())

    def to_json(self):
        return json.dumps(dataclasses.asdict(self), indent=2, default=str)

    @classmethod
    def from_dict(cls, data):
        """A report from its dict, as the sandbox's worker sends it: its own fields only, each of its type."""
        values = dict.fromkeys(("input", "kind", "signature", "mode", "exact_as"))
        for field in dataclasses.fields(cls):
            value = data.get(field.name)
            types = (float, int) if field.type is float else (field.type, type(None)) if field.type is str \
                else field.type
            if field.name in data and isinstance(value, types) and not (field.type is int and value is True):
                values[field.name] = value
        return cls(**values)

    @classmethod
    def from_untrusted(cls, data):
        """A report from a dict the process that ran the model gave: every field the text form reads checked
        against its schema (ValueError where one is not as an honest conversion gives it), every string in it
        made inert (safe_text), so no name, warning or figure can break a line of the report or act on a
        terminal."""
        if not isinstance(data, dict):
            raise ValueError("its report is not a record")
        data = dict(data)
        for name, shape in _SHAPES.items():
            if isinstance(shape, _Optional) and not data.get(name):
                data.pop(name, None)  # absent, None or empty: the field's default, as the readers expect it
            elif name in data:
                if not _conforms(data[name], shape):
                    raise ValueError(f"its report's {safe_text.inert(name)} is not as a conversion gives it")
                data[name] = _completed(data[name], shape)
        for name, values in (("mode", vocabulary.MODE_NAMES), ("exact_as", (*vocabulary.EXACT_AS, None)),
                             ("step_type", ("int8", "int16"))):
            if name in data and data[name] not in values:
                raise ValueError(f"its report's {name} is none the converter has")
        retyped = data.get("retyped_to_float32") or []
        if not set(retyped) <= set(vocabulary.RETYPED_TO_FLOAT32) or retyped != sorted(set(retyped)):
            raise ValueError("its report's retyped_to_float32 is not the sorted types the converter retypes")
        if not _numbers_within_float(data):
            raise ValueError("its report holds a number past any float")
        data = {name: value for name, value in data.items() if name not in _SUPERVISORS}
        return cls.from_dict(safe_text.inert_data(data, collapse_spaces=True))

    def _target_lines(self):
        if not self.target:
            return []
        target = self.target
        lines = [f"target {target['name']}: {target['runtime']} (lacks {target['lacks']})"]
        placed = target.get("ops", {})
        if placed:
            lines.append(f"  op table: {sum(placed['on_target'].values())} ops on the target"
                         + (f", CPU fallback: {counted(placed['cpu_fallback'])}" if placed["cpu_fallback"] else ""))
        lines.append(f"  runtime: {target['runtime_check'] or 'not run (verification switched off)'}")
        for kind, comparisons in (("fidelity", target["fidelity"]), ("agreement", target["agreement"])):
            for c in comparisons:
                steps = "" if c.get("steps") is None else f" ({c['steps']:.2f} {self.step_type} steps)"
                reference = ("the rewritten graph" if self.kind != ".tflite" else "the original .tflite"
                             if self.step_type != "int16" else "the original, its int16 GELUs in float32")
                against = reference if kind == "fidelity" else self.runtime
                lines.append(f"  {c['output']} on the target vs {against}: max abs {c['max_abs']:.3g}{steps} "
                             + ("ok" if c["passed"] else "FAIL"))
        lines.extend(f"  note: {note}" for note in target["notes"])
        return lines

    def to_text(self, verbose=False):
        lines = [f"{self.input} ({self.kind}, signature {self.signature}) -> {self.output or '(not written)'}",
                 f"mode: {self.mode}" + (f", exact GELU as: {self.exact_as}" if self.exact_as else "")
                 + (", float16 weights" if self.float16_weights else "")]
        if self.trusted:
            lines.append("model trusted (--trust-model): not checked for code or file-system ops")
        if self.containment:
            lines.append(self.containment)
        if self.retyped_to_float32:
            lines.append(f"{' and '.join(self.retyped_to_float32)} arithmetic: computed in float32")
        total = sum(entry["count"] for entry in self.gelus)
        lines.append(f"GELUs found: {total}")
        for entry in self.gelus:
            scale = "" if entry["alpha"] == 1.0 else f" (scaled, alpha={entry['alpha']:.6g})"
            lines.append(f"  {entry['count']} x {entry['pattern']}{scale} -> {entry['became']}")
        if self.leftover_erf:
            what = "kept"
            if vocabulary.conversion_mode(self.mode, self.int8).rewrites:
                what = "rewritten from LOGISTIC/MUL/ADD" if self.int8 else "rewritten as a builtin erf polynomial"
            # a .tflite's are Flex ops, whose GELU arithmetic (if any) stays as it is
            label = "Flex erf ops" if self.kind == ".tflite" else "bare erf outside a GELU"
            lines.append(f"{label}: {counted(self.leftover_erf)} ({what})")
        if self.int8:
            lines.append(f"{self.step_type}: {self.int8_ranges}")
            if self.ranges_repaired:
                lines += _repairs_lines(self.ranges_repaired)
            lines.append("ops: " + ", ".join(f"{name} {kind} {count}" for name, types in self.op_types.items()
                                             for kind, count in types.items()))
            if self.islands_made_integer:
                lines.append(f"float islands made integer: {counted(self.islands_made_integer)} "
                             "(exact integer spellings: a NEG as a MUL by -1, a comparison with a constant on "
                             "the grid as one of integers)")
            if self.kernel_grids:
                lines.append(f"outputs on the finest grid their kernel takes: {counted(self.kernel_grids)} "
                             "(calibrated finer than the kernel rescales to; rescaled to their grid after)")
            lines.append("integer throughout" if not self.float_ops else "still float: " + ", ".join(
                f"{name} {count}" for name, count in self.float_ops.items()))
        else:
            lines.append("ops: " + ", ".join(f"{name} {count}" for name, count in self.ops.items()))
        lines.append(f"size: {self.size_bytes:,} bytes")
        if self.verified:
            lines.append(f"parity on {self.inputs_used}, {self.runtime}:")
            for kind, comparisons in (("fidelity", self.fidelity), ("drift", self.drift)):
                for c in comparisons:
                    status = "ok" if c["passed"] else "FAIL"
                    steps = "" if c.get("steps") is None else f" ({c['steps']:.2f} {self.step_type} steps)"
                    lines.append(f"  {kind:8s} {c['output']}: max abs {c['max_abs']:.3g}{steps}, max rel "
                                 f"{c['max_rel']:.3g}, cosine {c['cosine']:.9f} {status}")
            if self.budget:
                lines.append(f"  budget   {self.budget['output']}: cosine {self.budget['cosine']:.9f} against the "
                             f"float model, --min-cosine {self.budget['min_cosine']:g} "
                             + ("ok" if self.budget["passed"] else "FAIL"))
            lines.extend(self._lifted_lines(verbose))
            envelope = self.tolerance.get("rounding_envelope")
            if envelope:
                lines.append(f"  rounding envelope (the rewritten graph with one step on {envelope['fraction']:.0%} "
                             f"of each activation's values, {envelope['trials']} draws): " + ", ".join(
                                 f"{name} {steps} steps" if steps is not None else f"{name} (float)"
                                 for name, steps in envelope["steps"].items()))
            if verbose:
                lines.append(f"  tolerance: {self.tolerance}")
        else:
            lines.append(f"not verified: {self.not_verified_reason}")
        lines.extend(self._target_lines())
        if self.explained_in:
            lines.append(f"explained: {self.explained_in}/index.html (every tensor against the float model; "
                         "model_explorer.json colours the graph in Model Explorer)")
        lines.extend(f"warning: {warning}" for warning in self.warnings)
        stages = ", ".join(f"{stage} {seconds:.1f}" for stage, seconds in self.stage_seconds.items())
        memory = f", peak memory {self.peak_bytes / 2**30:.2f} GiB" if verbose and self.peak_bytes else ""
        if memory and self.stage_peak_bytes:
            peaks = ", ".join(f"{stage} {peak / 2**30:.2f}" for stage, peak in self.stage_peak_bytes.items())
            memory += f" ({peaks})"
        lines.append(f"time: {self.seconds:.1f} s" + (f" ({stages})" if verbose and stages else "") + memory)
        return "\n".join(lines)
