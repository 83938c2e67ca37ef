"""--mixed-precision: an int8 model's ops lifted to float, the worst first, until it holds --min-cosine.

The signal goes where an op computes from values its int8 grid no longer resolves (the small channels of a
tensor whose per-tensor range an outlier channel holds) or rounds its own result away. The explanation
(explain.py) names that op: its result lost the most decibels against what it was computed from. Lifting it
keeps that op in float together with the ops whose results it reads, so that it reads them at full precision:
kept in float alone, it would read the same int8 values, dequantized. A control-flow op (an IF, a WHILE) takes
the ops of the subgraphs it runs with it, which the explanation cannot name: it sees the main graph's tensors
alone. Each lift is one quantization of the
calibrated model (`tflite/quantizer.py`), judged on the budget's samples; a lift that does not close a
`MIN_GAIN` share of what separates the worst output's cosine from 1 is undone, so that only what must be is
lifted.
"""

import dataclasses
import time

from . import explain

# The least share of the cosine's distance from 1 a lift must close to be kept: below it, a lift buys noise
# (another rounding of the same samples) and not precision, and would only cost the model its integer ops.
MIN_GAIN = 0.01
# The most lifts tried, each a quantization and a run of the samples: the search ends on any model.
MAX_TRIALS = 24
# Why a quantization-aware model has no op lifted: its int8 model computes its FakeQuant graph (within the few
# steps its parity check allows), which is what its budget judges it against, and an op lifted to float would
# compute what that graph does not. Where it misses the budget, the layers to keep float are chosen in
# training (keras_gelu.qat.quantize_model's keep_float), where the other layers learn around them.
QUANTIZATION_AWARE = "quantization-aware"
# A tensor that lost less than this against its inputs is not where the signal went (rounding to int8 costs
# every tensor something; an exact one loses nothing).
MIN_LOST_DB = 0.5


@dataclasses.dataclass
class Lifting:
    """What --mixed-precision did: the worst output's cosine before and after, the lifts kept, the trials."""
    cosine_before: float
    cosine: float
    # [{"tensor", "layer", "op", "lost_db", "float_ops": [names], "layers": theirs, "cosine"}], in the order kept
    lifts: list
    trials: int
    # why the search ended short of the budget: "", "no lift left helps", "trials", "time", QUANTIZATION_AWARE
    stopped: str = ""

    @property
    def float_ops(self):
        return sorted({name for lift in self.lifts for name in lift["float_ops"]})

    def as_dict(self):
        return {"cosine_before": self.cosine_before, "cosine": self.cosine, "lifts": self.lifts,
                "trials": self.trials, "float_ops": self.float_ops, "stopped": self.stopped}


def _computing(name, ops):
    """The ops computing what the graph node behind tensor `name` computes: one, or the several a GELU rewrite
    made."""
    node = explain.origin(name)
    return [op for op in ops if explain.origin(op.name) == node]


def float_ops_for(row, ops):
    """The names of the ops kept in float to lift an explanation's row: the ops computing its tensor, the ops of
    the subgraphs they run, and those computing what they read from outside them; empty where the row names no
    op of `ops`."""
    group = _computing(row["name"], ops)
    names = {op.name for op in group} | {name for op in group for name in op.called}
    written = {tensor for op in group for tensor in op.outputs}
    producers = {tensor: op for op in ops for tensor in op.outputs}
    for op in group:
        for tensor in op.inputs:
            if tensor not in written and tensor in producers:
                names.update(producer.name for producer in _computing(producers[tensor].name, ops))
    return names


def _candidates(explanation, tried):
    """The explanation's rows that lost at least MIN_LOST_DB, the worst first, not tried before."""
    return sorted((row for row in explanation["tensors"] if row["lost_db"] >= MIN_LOST_DB
                   and explain.origin(row["name"]) not in tried),
                  key=lambda row: (-row["lost_db"], row["snr_db"]))


def lifted(model, ops, budget, quantize, judge, explain_model, deadline=None):
    """(the model, a `Lifting`): `model` (what `quantize(set())` makes: the int8 model, as `judge` and
    `explain_model` read it) with ops lifted to float, the worst first, until `judge` (the worst output's cosine
    against the float model) reaches `budget`, or no lift left helps, or MAX_TRIALS were tried, or
    `time.monotonic()` passes `deadline` (None: none).

    ops: the calibrated model's (quantizer.ops); quantize(float op names) -> a model, or None where that
    choice cannot be had (the quantizer or a target refuses it); explain_model(model) -> its explanation, or
    None.
    """
    cosine = before = judge(model)
    float_ops, lifts, tried, trials = set(), [], set(), 0
    explanation, stopped = None, ""
    while cosine < budget:
        if trials >= MAX_TRIALS or (deadline is not None and time.monotonic() > deadline):
            stopped = "trials" if trials >= MAX_TRIALS else "time"
            break
        if explanation is None:
            explanation = explain_model(model)
            if explanation is None:
                stopped = "no lift left helps"
                break
        rows = _candidates(explanation, tried)
        if not rows:
            stopped = "no lift left helps"
            break
        row = rows[0]
        tried.add(explain.origin(row["name"]))
        wanted = float_ops_for(row, ops) - float_ops
        if not wanted:
            continue
        trials += 1
        trial = quantize(float_ops | wanted)
        trial_cosine = judge(trial) if trial is not None else None
        if trial_cosine is None or trial_cosine - cosine < MIN_GAIN * (1.0 - cosine):
            continue
        model, cosine, explanation = trial, trial_cosine, None
        float_ops |= wanted
        lifts.append({"tensor": row["name"], "layer": row["layer"], "op": row["op"], "lost_db": row["lost_db"],
                      "float_ops": sorted(wanted), "layers": sorted({explain.layer_of(name) for name in wanted}),
                      "cosine": cosine})
    return model, Lifting(before, cosine, lifts, trials, stopped)
