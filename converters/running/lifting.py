"""--mixed-precision: an int8 model's ops lifted to float, the worst first, until it holds --min-cosine.

The signal goes where an op computes from values its int8 grid no longer resolves (the small channels of a
tensor whose per-tensor range an outlier channel holds) or rounds its own result away. The explanation
(explain.py) names that op: its result lost the most decibels against what it was computed from. Lifting it
keeps that op in float together with the ops whose results it reads, so that it reads them at full precision:
kept in float alone, it would read the same int8 values, dequantized. A control-flow op (an IF, a WHILE) takes
the ops of the subgraphs it runs with it, which the explanation cannot name: it sees the main graph's tensors
alone.

Each trial is one quantization of the calibrated model (`tflite/quantizer.py`), judged on the budget's samples.
Where one op lost the signal, lifting it alone holds the budget. Where every block of a deep model loses a little
(ViT-B/16 at real width: 75 ops lost half a decibel or more, none of which alone moved the cosine by a tenth of
what separated it from the budget), lifting them one at a time never gets there: the search lifts the worst 1,
2, 4... ops together until the budget holds, halves its way back to the fewest of the worst that still hold it,
then undoes each lift, the least lossy first, that the budget holds without. So it takes about 2·log2(n) trials
to the budget, and each lift kept is one the budget needs. The ranking goes down to ops that lost nothing, so
that the search ends short of the budget only where every op lifted at once is short of it too.
"""

import dataclasses
import time

from . import explain

# The most trials, each a quantization and a run of the samples: the search ends on any model.
MAX_TRIALS = 40
# Why a quantization-aware model has no op lifted: its int8 model computes its FakeQuant graph (within the few
# steps its parity check allows), which is what its budget judges it against, and an op lifted to float would
# compute what that graph does not. Where it misses the budget, the layers to keep float are chosen in
# training (keras_gelu.qat.quantize_model's keep_float), where the other layers learn around them.
QUANTIZATION_AWARE = "quantization-aware"


@dataclasses.dataclass
class Lifting:
    """What --mixed-precision did: the worst output's cosine before and after, the lifts kept, the trials."""
    cosine_before: float
    cosine: float
    # [{"tensor", "layer", "op", "lost_db", "float_ops": [names], "layers": theirs, "cosine_without"}], the worst
    # first; cosine_without: the worst output's cosine with that lift undone (None: not tried, at the search's
    # limit, or the quantizer refused it)
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


def _ranked(explanation):
    """The explanation's rows, the most decibels lost against what they were computed from first (where the signal
    went), down to those that lost nothing (an exact op; rounding to int8 costs every other something)."""
    return sorted(explanation["tensors"], key=lambda row: (-row["lost_db"], row["snr_db"]))


class _Trials:
    """The calibrated model quantized with sets of ops in float, each set quantized and judged once."""

    def __init__(self, quantize, judge, deadline):
        self._quantize, self._judge, self._deadline = quantize, judge, deadline
        self.made = {}  # frozenset of float op names -> (model, the worst output's cosine), or (None, None)
        self.count = 0

    def why_not(self):
        """Why no further trial may run ("trials", "time"), or "" (a set judged before is not tried again)."""
        if self.count >= MAX_TRIALS:
            return "trials"
        return "time" if self._deadline is not None and time.monotonic() > self._deadline else ""

    def cosine(self, float_ops):
        """The worst output's cosine with `float_ops` lifted, or None where that choice cannot be had (the
        quantizer or a target refuses it)."""
        float_ops = frozenset(float_ops)
        if float_ops not in self.made:
            self.count += 1
            model = self._quantize(float_ops)
            self.made[float_ops] = (model, None if model is None else self._judge(model))
        return self.made[float_ops][1]

    def holds(self, float_ops, budget):
        cosine = self.cosine(float_ops)
        return cosine is not None and cosine >= budget

    def cosine_tried(self, float_ops):
        """The cosine judged with `float_ops` lifted; -inf where that set was not tried or could not be had."""
        made = self.made.get(frozenset(float_ops))
        return -float("inf") if made is None or made[1] is None else made[1]


def lifted(model, ops, budget, quantize, judge, explain_model, deadline=None):
    """(the model, a `Lifting`): `model` (what `quantize(set())` makes: the int8 model, as `judge` and
    `explain_model` read it) with the ops that lost the most lifted to float until `judge` (the worst output's
    cosine against the float model) reaches `budget` (see the module's docstring), or lifting every op the
    explanation names does not, or MAX_TRIALS were tried, or `time.monotonic()` passes `deadline` (None: none).
    Short of the budget, the closest model tried.

    ops: the calibrated model's (quantizer.ops); quantize(float op names) -> a model, or None where that
    choice cannot be had; explain_model(model) -> its explanation, or None.
    """
    trials = _Trials(quantize, judge, deadline)
    before = judge(model)
    trials.made[frozenset()] = (model, before)
    if before >= budget:
        return model, Lifting(before, before, [], 0)
    stopped = trials.why_not()
    explanation = None if stopped else explain_model(model)
    ranked = [] if explanation is None else [(row, float_ops_for(row, ops)) for row in _ranked(explanation)]
    rows, groups = [row for row, group in ranked if group], [group for _, group in ranked if group]

    def lifting(indices):
        return frozenset().union(*(groups[index] for index in indices))

    order = list(range(len(rows)))  # the ranking, less the rows no set of float ops can have (_widened)

    def prefix(count):
        return lifting(order[:count])

    without = {}
    if stopped or not rows:
        kept, stopped = [], stopped or "no lift left helps"
    else:
        failing, holding, stopped = _widened(order, prefix, trials, budget)
        if holding is None:  # the closest model tried, and the rows it lifted
            kept = order[:max(range(failing + 1), key=lambda count: trials.cosine_tried(prefix(count)))]
        else:
            holding = _narrowed(failing, holding, prefix, trials, budget)
            kept = _trimmed(order[:holding], lifting, trials, budget)
            for index in kept:  # what each lift kept is worth, beside the others kept (mostly judged above)
                others = lifting(other for other in kept if other != index)
                if others in trials.made or not trials.why_not():
                    without[index] = trials.cosine(others)
    chosen, cosine = trials.made[lifting(kept)]
    # the layer the explanation matched each op's node to (a model's output is named Identity, not its layer)
    layers = {} if explanation is None else {explain.origin(row["name"]): row["layer"]
                                             for row in explanation["tensors"]}
    lifts, lifted_before = [], set()
    for index in kept:
        row, wanted = rows[index], groups[index] - lifted_before
        lifted_before |= wanted
        lifts.append({"tensor": row["name"], "layer": row["layer"], "op": row["op"], "lost_db": row["lost_db"],
                      "float_ops": sorted(wanted),
                      "layers": sorted({layers.get(explain.origin(name), explain.layer_of(name)) for name in wanted}),
                      "cosine_without": without.get(index)})
    return chosen, Lifting(before, cosine, lifts, trials.count, "" if cosine >= budget else stopped)


def _widened(order, prefix, trials, budget):
    """The worst 1, 2, 4... rows of `order` lifted together (`prefix(count)`: their float ops) until the budget
    holds: (the largest count tried that missed it (0: none), the count that holds it or None, why it stopped).
    A row the quantizer or the target cannot have in float with the rows before it is found by halving and taken
    out of `order`, so that it keeps no larger set from being tried."""
    failing, count = 0, 1
    while True:
        cosine = trials.cosine(prefix(count))
        while cosine is None:
            had, refused = failing, count  # prefix(had) was had, prefix(refused) was not
            while refused - had > 1:
                middle = (had + refused) // 2
                if prefix(middle) not in trials.made and trials.why_not():
                    return failing, None, trials.why_not()
                cosine = trials.cosine(prefix(middle))
                if cosine is None:
                    refused = middle
                elif cosine >= budget:
                    return failing, middle, ""
                else:
                    had = failing = middle
            del order[had]  # the row prefix(had + 1) adds
            if had == len(order) or trials.why_not():
                return failing, None, trials.why_not() or "no lift left helps"
            count = min(count, len(order))
            cosine = trials.cosine(prefix(count))
        if cosine >= budget:
            return failing, count, ""
        if count == len(order):
            return count, None, "no lift left helps"
        failing, count = count, min(2 * count, len(order))
        if trials.why_not():
            return failing, None, trials.why_not()


def _narrowed(failing, holding, prefix, trials, budget):
    """The fewest of the worst rows that hold the budget, between a count that misses it and one that holds it,
    halving the difference while trials may run."""
    while holding - failing > 1:
        middle = (failing + holding) // 2
        if prefix(middle) not in trials.made and trials.why_not():
            break
        failing, holding = (failing, middle) if trials.holds(prefix(middle), budget) else (middle, holding)
    return holding


def _trimmed(kept, lifting, trials, budget):
    """`kept` (row indices, the worst first) without each lift the budget holds without, the least lossy tried
    first, while trials may run."""
    for index in reversed(kept[:]):
        others = [other for other in kept if other != index]
        if lifting(others) not in trials.made and trials.why_not():
            break
        if trials.holds(lifting(others), budget):
            kept = others
    return kept
