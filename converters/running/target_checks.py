"""A model against its --target's profile (targets.py): static shapes before conversion, every op and output
type of the .tflite before anything is written, then the runs on the target's own runtime (runtimes.py), and
the report's section that tells of them."""

import collections
import copy
import dataclasses

import numpy as np
from tensorflow.core.framework import graph_pb2

from .. import errors
from .. import report as reporting
from ..rewriting import graph
from ..targets import GUARD_OPS
from ..tflite import operators
from . import runtimes


def _shown(shape):
    return "unknown" if shape is None else "[" + ", ".join("?" if size is None else str(size) for size in shape) + "]"


def with_static_shapes(source, target=None, input_shapes=None):
    """(source with static input shapes, the inputs parity makes arrays for, whether the batch was fixed at 1).

    For a runtime that plans its memory before it runs: a dynamic batch axis
    becomes 1 (TFLite then folds the shape arithmetic a dynamic batch needs,
    SHAPE/PACK/TILE, which such runtimes often lack) and parity runs sample by
    sample (`per_sample`). `input_shapes` ({input name: shape}, --input-shape)
    fixes the other dimensions; one left unknown is refused, since only the
    user knows its size.
    """
    input_shapes = dict(input_shapes or {})
    unknown = sorted(set(input_shapes) - {info.name for info in source.inputs})
    if unknown:
        raise errors.BadInputs(f"--input-shape names no input of the signature: {', '.join(unknown)}; its inputs: "
                               + ", ".join(f"{info.name} {_shown(info.shape)}" for info in source.inputs))
    who = f"--target {target.name}: {target.runtime}" if target is not None else "--input-shape: the conversion"
    fixed_graph = graph_pb2.GraphDef()
    fixed_graph.CopyFrom(source.graph_def)
    nodes = graph.nodes_by_name(fixed_graph)
    inputs, parity_inputs, batch_fixed = [], [], False
    for info in source.inputs:
        shape = list(info.shape) if info.shape is not None else None
        given = input_shapes.get(info.name)
        if given is not None:
            if shape is not None and (len(given) != len(shape) or any(
                    size is not None and size != want for size, want in zip(shape, given))):
                raise errors.BadInputs(f"--input-shape {info.name}={','.join(map(str, given))} does not fit the "
                                       f"signature's shape {_shown(info.shape)}")
            shape = list(given)
        elif shape and shape[0] is None:
            shape[0] = 1
        if shape is None or None in shape:
            dims = "1," + ",".join("N" if size is None else str(size) for size in (shape or [None])[1:])
            raise errors.DoesNotFitTarget(
                f"{who} needs static shapes, and input {info.name!r} has shape {_shown(shape)}; give its size "
                f"with --input-shape {info.name}={dims} (N: the size it will run at)")
        placeholder = nodes[graph.split_tensor_name(info.tensor)[0]]
        placeholder.attr["shape"].shape.ClearField("dim")
        placeholder.attr["shape"].shape.unknown_rank = False
        for size in shape:
            placeholder.attr["shape"].shape.dim.add(size=size)
        inputs.append(dataclasses.replace(info, shape=tuple(shape)))
        batch_dynamic = info.shape is not None and len(info.shape) > 0 and info.shape[0] is None and shape[0] == 1
        batch_fixed = batch_fixed or batch_dynamic
        parity_inputs.append(dataclasses.replace(info, shape=(None, *shape[1:]) if batch_dynamic else tuple(shape)))
    return dataclasses.replace(source, graph_def=fixed_graph, inputs=inputs), parity_inputs, batch_fixed


def one_by_one(arrays):
    """[{name: array of one sample}] of a batch {name: array}, in order, each a copy of the batch's own kind (seeded
    random inputs stay so, and the refusal of a model that fails on them still says what to pass instead)."""
    count = len(next(iter(arrays.values())))
    samples = []
    for index in range(count):
        sample = copy.copy(arrays)
        sample.update((name, array[index:index + 1]) for name, array in arrays.items())
        samples.append(sample)
    return samples


def per_sample(run, arrays):
    """run({name: array}) -> {name: output} for a model whose batch is fixed at 1: each sample, stacked."""
    results = [run(sample) for sample in one_by_one(arrays)]
    return {name: np.concatenate([result[name] for result in results]) for name in results[0]}


def check(tflite_model, target, allow_cpu_fallback, cause=""):
    """{"on_target": {op: count}, "cpu_fallback": {op: count}}, or DoesNotFitTarget naming what does not run
    (and `cause`, where the caller knows where such ops come from)."""
    on_target, fallback, missing, wrong_type, unsupported = (collections.Counter() for _ in range(5))
    for operator in operators.operators(tflite_model):
        if target.has(operator.name):
            on_target[operator.name] += 1
            if target.output_types is not None and operator.output_type not in target.output_types:
                wrong_type[f"{operator.name} ({operator.output_type})"] += 1
            elif operator.output_type not in target.op_output_types.get(operator.name, {operator.output_type}):
                unsupported[f"{operator.name} ({operator.output_type})"] += 1
            elif operator.input_type not in target.op_input_types.get(operator.name, {operator.input_type}):
                unsupported[f"{operator.name} ({operator.input_type} in)"] += 1
        elif allow_cpu_fallback and target.fallback is not None and operator.name in target.fallback:
            fallback[operator.name] += 1
        else:
            missing[operator.name] += 1
    missing += unsupported  # an op it has, on a type its kernel refuses
    if missing:
        hint = ""
        if target.fallback is not None and not allow_cpu_fallback and set(missing) <= target.fallback:
            hint = " (--allow-cpu-fallback runs them on the CPU beside it)"
        raise errors.DoesNotFitTarget(f"--target {target.name}: {target.runtime} lacks "
                                      f"{reporting.counted(missing)}{hint}{cause}; nothing written")
    if wrong_type:
        kinds = "/".join(sorted(target.output_types - {"int32", "bool"}))
        raise errors.DoesNotFitTarget(f"--target {target.name}: {target.runtime} computes {kinds} only, and "
                                      f"{reporting.counted(wrong_type)} would not; nothing written")
    return {"on_target": dict(sorted(on_target.items())), "cpu_fallback": dict(sorted(fallback.items()))}


def section(target, options):
    """The report's account of the --target: the profile used and what it implied."""
    section = {"name": target.name, "runtime": target.runtime, "mode": options.mode, "exact_as": options.exact_as,
               "int8": options.int8, "int8_io": options.int8_io, "static_shapes": target.static_shapes,
               "lacks": target.lacks, "notes": list(target.notes), "runtime_check": None, "figures": {},
               "fidelity": [], "agreement": []}
    if not target.keeps_non_finite_guards and not options.int8:
        section["notes"].append(f"the runtime lacks some of {', '.join(sorted(GUARD_OPS))}, so the inf/NaN "
                                "guards are left out: GELU(+-inf) may be NaN there; every finite input is as before")
    return section


_INSTALL_HINTS = {"tflm": "pip install 'keras-gelu[tflm]'", "vela": "pip install 'keras-gelu[vela]'"}


def run_on_target(tflite_model, target, options, report, arrays, batch_fixed):
    """Check the model on the target's own runtime where it is installed; its outputs where it ran them.

    `arrays` are the parity inputs in input order: one batch, or, where the batch was fixed at 1, a sample each.
    """
    samples = [arrays]
    if batch_fixed:
        samples = [[array[index:index + 1] for array in arrays] for index in range(len(arrays[0]))]
    section = report.target
    if target.verifier is None:
        section["runtime_check"] = "checked against the op table, not run"
        return None
    if target.verifier == "litert":
        section["runtime_check"] = f"ran in {report.runtime} (the parity check above)"
        return None
    check = {"tflm": lambda: runtimes.run_tflm(tflite_model, samples),
             "vela": lambda: runtimes.run_vela(tflite_model, target.vela_config),
             "gpu-analyzer": lambda: runtimes.analyze_for_gpu(tflite_model)}[target.verifier]()
    if check is None:
        section["runtime_check"] = (f"checked against the op table, not run: {_INSTALL_HINTS[target.verifier]} "
                                    f"to run it in {target.verifier}")
        return None
    section["runtime_check"] = f"{check.verdict} ({check.tool})"
    section["figures"] = check.figures
    if check.figures.get("cpu_operators") and not options.allow_cpu_fallback:
        reasons = "; ".join(f"{operator} x{count}: {reason or 'no reason given'}"
                            for operator, (count, reason) in check.figures.get("cpu_operator_reasons", {}).items())
        raise errors.TargetRejected(f"--target {target.name}: Vela places {check.figures['cpu_operators']} "
                                    f"operator(s) on the CPU, not the NPU{f' ({reasons})' if reasons else ''}; "
                                    "--allow-cpu-fallback accepts that; nothing written")
    return check.outputs
