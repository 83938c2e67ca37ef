"""A model against its --target's profile (targets.py): static shapes before conversion, then every op and
output type of the .tflite, before anything is written."""

import collections
import dataclasses

import numpy as np

from tensorflow.core.framework import graph_pb2

from . import errors
from . import graph
from . import report as reporting


def with_static_batch(source, target):
    """(the source with a dynamic batch axis fixed to 1, whether one was): for a runtime that plans its memory
    before it runs. Parity then runs sample by sample (`per_sample`).

    TFLite then folds the shape arithmetic a dynamic batch needs (SHAPE, PACK, TILE), which such runtimes
    often lack. Any other unknown dimension is refused: only the user knows its size.
    """
    fixed_graph = graph_pb2.GraphDef()
    fixed_graph.CopyFrom(source.graph_def)
    nodes = graph.nodes_by_name(fixed_graph)
    inputs, fixed = [], False
    for info in source.inputs:
        shape = list(info.shape) if info.shape is not None else None
        if shape and shape[0] is None:
            shape[0], fixed = 1, True
        if shape is None or None in shape:
            shown = "unknown" if shape is None else str(["?" if size is None else size for size in shape])
            raise errors.DoesNotFitTarget(
                f"--target {target.name}: {target.runtime} needs static shapes, and input {info.name!r} has shape "
                f"{shown} beyond the batch axis; export the model with those dimensions fixed")
        placeholder = nodes[graph.split_tensor_name(info.tensor)[0]]
        for dimension, size in zip(placeholder.attr["shape"].shape.dim, shape):
            dimension.size = size
        inputs.append(dataclasses.replace(info, shape=tuple(shape)))
    return dataclasses.replace(source, graph_def=fixed_graph, inputs=inputs), fixed


def per_sample(run, arrays):
    """run({name: array}) -> {name: output} for a model whose batch is fixed at 1: each sample, stacked."""
    count = len(next(iter(arrays.values())))
    results = [run({name: array[index:index + 1] for name, array in arrays.items()}) for index in range(count)]
    return {name: np.concatenate([result[name] for result in results]) for name in results[0]}


def check(tflite_model, target, allow_cpu_fallback):
    """{"on_target": {op: count}, "cpu_fallback": {op: count}}, or DoesNotFitTarget naming what does not run."""
    on_target, fallback, missing, wrong_type = (collections.Counter() for _ in range(4))
    for operator in reporting.operators(tflite_model):
        if target.ops is None or operator.name in target.ops:
            on_target[operator.name] += 1
            if target.output_types is not None and operator.output_type not in target.output_types:
                wrong_type[f"{operator.name} ({operator.output_type})"] += 1
        elif allow_cpu_fallback and target.fallback is not None and operator.name in target.fallback:
            fallback[operator.name] += 1
        else:
            missing[operator.name] += 1
    if missing:
        hint = ""
        if target.fallback is not None and not allow_cpu_fallback and set(missing) <= target.fallback:
            hint = " (--allow-cpu-fallback runs them on the CPU beside it)"
        raise errors.DoesNotFitTarget(f"--target {target.name}: {target.runtime} lacks "
                                      f"{reporting.counted(missing)}{hint}; nothing written")
    if wrong_type:
        kinds = "/".join(sorted(target.output_types - {"int32", "bool"}))
        raise errors.DoesNotFitTarget(f"--target {target.name}: {target.runtime} computes {kinds} only, and "
                                      f"{reporting.counted(wrong_type)} would not; nothing written")
    return {"on_target": dict(sorted(on_target.items())), "cpu_fallback": dict(sorted(fallback.items()))}
