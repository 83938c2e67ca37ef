"""Read-only buffers with the same bytes shared, as the stock converter's last step does, at a fraction of its cost.

The stock converter ends every conversion with `deduplicate_readonly_buffers`: it unpacks the whole model
into Python objects twice, hashes every weight, and packs it all again whether or not any buffer repeats
(measured on ViT-B/16, 343 MB: 2.1 s of a 10.5 s conversion). Here the model is read as views of its bytes,
only weights whose size and first and last bytes another weight shares are compared whole, and
the model is written again only where a buffer is shared.
"""

import collections
import hashlib

import numpy as np

from . import flatbuffer_model

# Weights that differ almost always differ at their ends already: only those alike there are compared whole.
_SAMPLE_BYTES = 4096


def _read_only_buffers(model):
    """The buffers of constant operands: tensors an operator reads that no operator writes, that are not a
    subgraph's inputs or outputs and not variables (the stock converter's rule)."""
    buffers = set()
    for subgraph in model.subgraphs or ():
        read, written = set(), set()
        for operator in subgraph.operators or ():
            mutating = operator.mutatingVariableInputs
            for position, index in enumerate(operator.inputs if operator.inputs is not None else ()):
                if index < 0 or (mutating is not None and position < len(mutating) and mutating[position]):
                    continue
                if not subgraph.tensors[index].isVariable:
                    read.add(index)
            written.update(operator.outputs if operator.outputs is not None else ())
            written.update(operator.intermediates if operator.intermediates is not None else ())
        edges = {*(subgraph.inputs if subgraph.inputs is not None else ()),
                 *(subgraph.outputs if subgraph.outputs is not None else ())}
        buffers.update(subgraph.tensors[index].buffer for index in read - written - edges)
    return {index for index in buffers
            if 0 <= index < len(model.buffers) and model.buffers[index].data is not None
            and len(model.buffers[index].data)}


def deduplicated(tflite_model):
    """The .tflite with each read-only buffer that repeats another's bytes replaced by that one (the first
    by index), or `tflite_model` itself where none repeats."""
    model = flatbuffer_model.as_object(tflite_model)
    by_size = collections.defaultdict(list)
    for index in sorted(_read_only_buffers(model)):
        by_size[len(model.buffers[index].data)].append(index)
    shared = {}
    for indices in by_size.values():
        candidates = collections.defaultdict(list)  # {a digest of the first and last bytes: [indices]}
        for index in indices if len(indices) > 1 else ():
            data = model.buffers[index].data
            candidates[hashlib.md5(bytes(data[:_SAMPLE_BYTES]) + bytes(data[-_SAMPLE_BYTES:])).digest()].append(index)
        for group in candidates.values():
            for position, index in enumerate(group):
                kept = next((earlier for earlier in group[:position] if earlier not in shared
                             and np.array_equal(model.buffers[earlier].data, model.buffers[index].data)), None)
                if kept is not None:
                    shared[index] = kept
    if not shared:
        return tflite_model
    for subgraph in model.subgraphs:
        for operator in subgraph.operators or ():
            for index in operator.inputs if operator.inputs is not None else ():
                if index >= 0 and subgraph.tensors[index].buffer in shared:
                    subgraph.tensors[index].buffer = shared[subgraph.tensors[index].buffer]
    for index in shared:
        model.buffers[index].data = None
    return flatbuffer_model.as_bytes(model, len(tflite_model))
