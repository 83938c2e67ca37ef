"""Where the precision goes: every tensor of a .tflite against the float model, on the same samples.

The float model, tensor by tensor, is the original graph converted to float with its GELUs as written (native
mode: the GELU op for exact and tanh GELU, the sigmoid form as it is), run on LiteRT with every intermediate
kept (`experimental_preserve_all_tensors`). Its tensors carry the names the converter gives the graph's nodes,
as the converted model's do: a tensor is matched by the first node its name lists, with what a GELU rewrite
spliced in (`rewrite.REWRITE_SCOPE`) taken as the GELU's own output. Each matched tensor gets its largest
error, that error in steps of its own scale, the cosine and the signal-to-noise ratio of its values against
the float model's; and the decibels it lost against the tensors it was computed from, which puts the blame on
the op where the signal went, not on every op after it.

Everything here is data for the supervisor, which checks it and draws the page (`converters/explanation.py`).
"""

import collections
import math

import numpy as np

from ..explanation import rounding_db
from ..rewriting import rewrite
from . import multiplied_by_zero
from . import verify

# An exact tensor's signal-to-noise ratio, as reported: float32's own rounding is about 140 dB below its signal.
EXACT_DB = 140.0
# Ops that only move values from one type to another: a row of theirs is about the op that computed the values.
_VALUE_MOVING = ("QUANTIZE", "DEQUANTIZE")
# A channel whose values reach this many times the median channel's holds a per-tensor grid for itself: the
# others keep log2(ratio) bits fewer of int8's eight (16: half of them).
OUTLIER_RATIO = 16.0
# A tensor whose float values' RMS is this far below its inputs' (100 dB) holds what float32's rounding left of
# a cancellation, no signal: the mean of rows a LayerNormalization already centred (a LayerNormalization after
# another: CLIP's vision tower), about 1e-7 of them, which an int8 model computes as 0. Its error against the
# float model measures float's rounding, and it is blamed for no loss.
RESIDUE = 1e-5
# How many of the worst tensor's errors the page's histogram draws, and in how many bins.
HISTOGRAM_BINS = 40
_MAX_HISTOGRAM_VALUES = 1 << 16


def origin(name):
    """The graph node a tensor of the converter's comes from: the first its name lists, and for a node a GELU
    rewrite spliced in, the GELU it replaced."""
    first = name.split(";")[0]
    return first.split("/" + rewrite.REWRITE_SCOPE.strip("/"))[0]


_NOISE = ("StatefulPartitionedCall", "PartitionedCall", "inlined")


def layer_of(name):
    """The Keras layer (or TensorFlow scope) a tensor was computed in: its node's name scope, without the
    scopes tracing adds."""
    parts = [part for part in origin(name).split("/") if part not in _NOISE
             and not part.startswith("StatefulPartitionedCall")]
    return "/".join(parts[:-1]) or "/".join(parts)


class _Statistics:
    """Running sums of one tensor's values against the float model's, over every sample."""

    def __init__(self):
        self.reference_energy = self.value_energy = self.product = self.error_energy = 0.0
        self.count = 0
        self.max_abs, self.errors = 0.0, []
        self.channel_peaks = None  # each channel's (last axis) largest magnitude in the float model

    def add(self, value, reference, read=None):
        """Take in one sample's values of the tensor and the float model's (`read`: where an output reads them;
        the others were only ever multiplied by zero, on any range: `multiplied_by_zero`)."""
        read = np.ones(reference.shape, bool) if read is None else read
        if reference.ndim >= 2 and reference.shape[-1] >= 2:
            peaks = np.abs(np.nan_to_num(np.where(read, reference, 0).reshape(-1, reference.shape[-1]),
                                         posinf=0, neginf=0)).max(axis=0)
            self.channel_peaks = peaks if self.channel_peaks is None else np.maximum(self.channel_peaks, peaks)
        value, reference = value.astype(np.float64).ravel(), reference.astype(np.float64).ravel()
        kept = np.isfinite(value) & np.isfinite(reference) & read.ravel()
        value, reference = value[kept], reference[kept]
        error = value - reference
        self.reference_energy += float(reference @ reference)
        self.count += reference.size
        self.value_energy += float(value @ value)
        self.product += float(value @ reference)
        self.error_energy += float(error @ error)
        self.max_abs = max(self.max_abs, float(np.abs(error).max()) if error.size else 0.0)
        if sum(len(kept) for kept in self.errors) < _MAX_HISTOGRAM_VALUES:
            self.errors.append(error[:_MAX_HISTOGRAM_VALUES])

    def cosine(self):
        norms = math.sqrt(self.reference_energy * self.value_energy)
        return self.product / norms if norms > 0 else (1.0 if self.error_energy == 0 else 0.0)

    def rms(self):
        """The float model's values' root mean square."""
        return math.sqrt(self.reference_energy / self.count) if self.count else 0.0

    def snr_db(self):
        if self.error_energy == 0:
            return EXACT_DB
        if self.reference_energy == 0:
            return -EXACT_DB
        return min(EXACT_DB, 10.0 * math.log10(self.reference_energy / self.error_energy))

    def outlier(self):
        """{"channel", "ratio"} for the channel whose range is OUTLIER_RATIO times the median channel's, or None."""
        if self.channel_peaks is None:
            return None
        median = float(np.median(self.channel_peaks))
        if not median > 0:  # most channels hold nothing (a mask, padding): no range to crowd out
            return None
        channel = int(np.argmax(self.channel_peaks))
        ratio = float(self.channel_peaks[channel]) / median
        return {"channel": channel, "ratio": ratio} if ratio >= OUTLIER_RATIO else None

    def histogram(self):
        errors = np.concatenate(self.errors) if self.errors else np.zeros(0)
        counts, edges = np.histogram(errors, bins=HISTOGRAM_BINS)
        return {"edges": [float(edge) for edge in edges], "counts": [int(count) for count in counts]}


def _descriptions(computed, details):
    """{tensor: (layer, op)}: the layer a tensor's node scope names, else (a model output's op, named after the
    output) the scope of the op's weights; a QUANTIZE's or DEQUANTIZE's, the op's that computed its input."""
    producers = {index: (op_name, inputs) for index, op_name, _, inputs in computed}
    described = {}
    for index, op_name, _, inputs in computed:
        layer = layer_of(details[index]["name"])
        if "/" not in layer:
            weights = [source for source in inputs
                       if source not in producers and "/" in layer_of(details[source]["name"])]
            layer = layer_of(details[weights[0]]["name"]) if weights else layer
        moved = [source for source in inputs if source in described]
        if op_name in _VALUE_MOVING and moved:
            layer, producer = described[moved[0]]
            op_name = f"{producer}, then {op_name}"
        described[index] = (layer, op_name)
    return described


def _computed_tensors(interpreter):
    """[(tensor index, op name, position of its op, the op's input indices)], in the order the ops run."""
    computed = []
    for position, op in enumerate(interpreter._get_ops_details()):
        for output in op["outputs"]:
            computed.append((int(output), op["op_name"], position, [int(i) for i in op["inputs"] if i >= 0]))
    return computed


def _float_values(interpreter, index, detail):
    """A tensor's values as float (dequantized with its scale), or None for what holds no real values (int32
    indices, a bool mask)."""
    value = verify.output_value(detail, interpreter.get_tensor(index))
    return value.astype(np.float64) if value.dtype.kind == "f" else None


def _outputs_of_several(model, details, reference, reference_details):
    """{tensor: its counterpart} for the outputs of ops that write several: the float model's op of the same kind
    reading the same computed tensors, output for output (None where there is none). Their names do not match:
    the quantizer renames a SPLIT's outputs (GPT-2's fused query, key and value: split, split1, split2 in the
    float model, split2, split21, split22 in the int8 one, where matching by name compared the query with the
    value)."""
    def by_what_they_read(interpreter, tensor_details):
        """[((op kind, the origins of the tensors it reads that are not constants), its outputs)] of each op
        writing several."""
        ops = interpreter._get_ops_details()
        values = {output for op in ops for output in op["outputs"]}
        values.update(detail["index"] for detail in interpreter.get_input_details())
        return [((op["op_name"], tuple(origin(tensor_details[index]["name"]) for index in op["inputs"]
                                       if index in values)), [int(output) for output in op["outputs"]])
                for op in ops if len(op["outputs"]) > 1]

    ours = by_what_they_read(model, details)
    theirs = collections.defaultdict(list)
    for key, outputs in by_what_they_read(reference, reference_details):
        theirs[key].append(outputs)
    shared = collections.Counter(key for key, _ in ours)
    matched = {}
    for key, outputs in ours:  # an op whose key another op shares, in either model, has no counterpart
        counterpart = theirs[key][0] if shared[key] == 1 and len(theirs[key]) == 1 else []
        for position, index in enumerate(outputs):
            matched[index] = counterpart[position] if len(counterpart) == len(outputs) else None
    return matched


def _run(interpreter, signature, sample):
    runner = interpreter.get_signature_runner(signature)
    details = runner.get_input_details()
    runner(**{name: verify.input_value(details[name], array) for name, array in sample.items()})


def tensor_errors(tflite_model, float_model, signature, samples, findings=()):
    """The explanation of `tflite_model` against `float_model` (both .tflite bytes with `signature`) on
    `samples` ([{input name: array}]): {"tensors": [a row per computed tensor], "gelus": [a row per GELU
    found], "worst": the name of the tensor that lost the most, "histogram": its errors'}.

    `findings`: the rewrite's GELUs (rewrite.Finding), each named by its output in the graph."""
    model, reference = (verify.interpreter_keeping_every_tensor(tflite_model),
                        verify.interpreter_keeping_every_tensor(float_model))
    details = {detail["index"]: detail for detail in model.get_tensor_details()}
    reference_details = {detail["index"]: detail for detail in reference.get_tensor_details()}
    # the float model's tensor for each node, the last computed where several come from one (a GELU's ops), but
    # never what a GELU op reads: where the GELU ends the model, its output bears the model output's name, and
    # the last tensor of its own was the clamp of its input, which the int8 model's last tensor of the GELU's
    # (its LOGISTIC, before the MUL writing the output) was compared with
    reference_computed = _computed_tensors(reference)
    read_by_gelus = {source for _, op_name, _, inputs in reference_computed if op_name == "GELU" for source in inputs}
    by_origin = {origin(reference_details[index]["name"]): index for index, *_ in reference_computed
                 if index not in read_by_gelus}
    computed = _computed_tensors(model)
    last_of_origin = {origin(details[index]["name"]): index for index, *_ in computed}
    matched = {index: by_origin.get(origin(details[index]["name"])) for index, *_ in computed
               if last_of_origin[origin(details[index]["name"])] == index}
    matched.update(_outputs_of_several(model, details, reference, reference_details))
    statistics = {index: _Statistics() for index, counterpart in matched.items() if counterpart is not None}
    discarded = multiplied_by_zero.DiscardedValues(float_model)
    for sample in samples:
        _run(model, signature, sample)
        _run(reference, signature, sample)
        read = discarded.read_in(reference)
        for index, statistic in statistics.items():
            value = _float_values(model, index, details[index])
            expected = _float_values(reference, matched[index], reference_details[matched[index]])
            if value is None or expected is None or value.size != expected.size:
                statistics[index] = None
                continue
            statistic.add(value, expected, read.get(matched[index]))
    # a tensor the float model holds at zero throughout (a mask where nothing is masked) has no signal to lose
    statistics = {index: statistic for index, statistic in statistics.items()
                  if statistic is not None and statistic.reference_energy > 0}
    return _rows(computed, details, statistics, findings)


def _rows(computed, details, statistics, findings):
    """The rows, each tensor's lost decibels against the nearest tensors above it that were compared."""
    snr = {index: statistic.snr_db() for index, statistic in statistics.items()}
    # What each tensor is computed from, as good as: the worst of its inputs, each its own ratio where it was
    # compared, else what it was computed from; a model input or a constant is exact. In the order the ops
    # run, so that every input's level is known before it is read.
    # A residue (RESIDUE) passes its inputs' level and magnitude on, and the ops computing from it alone are
    # residues too (its product by a factor, a constant less that).
    upstream, level, magnitude, residues = {}, {}, {}, set()
    for index, _, _, inputs in computed:
        upstream[index] = min((snr.get(source, level.get(source, EXACT_DB)) for source in inputs), default=EXACT_DB)
        above = max((magnitude.get(source, 0.0) for source in inputs), default=0.0)
        own = statistics[index].rms() if index in statistics else above
        if 0 < own < RESIDUE * above:  # exact zeros are no residue: int8 values there are its own error
            residues.add(index)
        level[index] = upstream[index] if index in residues else snr.get(index, upstream[index])
        magnitude[index] = above if index in residues else own
    described = _descriptions(computed, details)

    gelus = {origin(finding.root.split(":")[0]): finding for finding in findings}
    rows = []
    for index, op_name, position, _ in computed:
        statistic = statistics.get(index)
        if statistic is None:
            continue
        name = details[index]["name"]
        scale, _ = details[index]["quantization"]
        dtype = np.dtype(details[index]["dtype"])
        finding = gelus.get(origin(name))
        layer, op_name = described[index]
        rows.append({
            "name": name, "layer": layer, "op": op_name, "position": position, "type": dtype.name,
            "scale": float(scale) if scale else None,
            "max_abs": statistic.max_abs, "steps": statistic.max_abs / scale if scale else None,
            "cosine": statistic.cosine(), "snr_db": snr[index],
            "lost_db": 0.0 if index in residues else max(
                0.0, min(upstream[index], rounding_db(8 * dtype.itemsize)) - snr[index]),
            "gelu": None if finding is None else f"{finding.pattern} -> {finding.became}",
            "outlier": statistic.outlier()})
    worst = max(rows, key=lambda row: (row["lost_db"], -row["snr_db"]), default=None)
    histogram = None
    if worst is not None:
        worst_index = next(index for index, *_ in computed if details[index]["name"] == worst["name"])
        histogram = statistics[worst_index].histogram()
    # the outlier channel nearest above the worst tensor: what a per-tensor grid gave its range to
    outliers = [row for row in rows if row["outlier"] and worst is not None and row["position"] <= worst["position"]]
    return {"tensors": rows, "worst": None if worst is None else worst["name"], "histogram": histogram,
            "worst_outlier": outliers[-1]["name"] if outliers else None,
            "gelus": [row for row in rows if row["gelu"] is not None]}


def explained(tflite_model, float_model, signature, samples, reference, report, findings=()):
    """tensor_errors' explanation with how many samples and what the reference is, or None with a warning in
    `report` where a runtime cannot run the models tensor by tensor."""
    try:
        explanation = tensor_errors(tflite_model, float_model, signature, samples, findings)
    except (RuntimeError, ValueError) as error:
        report.warnings.append("no tensor compared: LiteRT cannot run the models tensor by tensor "
                               f"({' '.join(str(error).split())[:200]})")
        return None
    explanation.update(samples=sum(len(next(iter(sample.values()))) for sample in samples), reference=reference)
    return explanation
