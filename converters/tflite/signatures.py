"""Give the converted model the source's SignatureDef.

The TFLite converter writes SignatureDefs only when it reads a SavedModel
itself; we hand it a frozen GraphDef (convert.to_tflite), so it writes none,
and without one LiteRT's `get_signature_runner()` / `runSignature` cannot run
the model and a multi-output model's outputs carry only internal tensor names.
The converter keeps the order of the inputs and outputs it is given, which is
the order of `loading.Source`'s lists, so the i-th name maps to the i-th
tensor of the main subgraph.
"""

from tensorflow.lite.python import schema_py_generated as schema

from . import flatbuffer_model


def _tensor_map(name, tensor_index):
    entry = schema.TensorMapT()
    entry.name = name
    entry.tensorIndex = tensor_index
    return entry


def with_signature(tflite_model, signature_key, input_names, output_names):
    """The model with one SignatureDef over its main subgraph, replacing any it had.

    Measured on a 113 MB model (4 BERT-base encoder layers): 0.4 s and 224 MiB
    of extra peak memory, twice the model.
    """
    model = flatbuffer_model.as_object(tflite_model)
    main = model.subgraphs[0]
    if len(main.inputs) != len(input_names) or len(main.outputs) != len(output_names):
        raise ValueError(f"the model has {len(main.inputs)} inputs and {len(main.outputs)} outputs, the signature "
                         f"{len(input_names)} and {len(output_names)}")
    signature = schema.SignatureDefT()
    signature.signatureKey = signature_key
    signature.subgraphIndex = 0
    signature.inputs = [_tensor_map(name, index) for name, index in zip(input_names, main.inputs)]
    signature.outputs = [_tensor_map(name, index) for name, index in zip(output_names, main.outputs)]
    model.signatureDefs = [signature]
    return flatbuffer_model.as_bytes(model, len(tflite_model))
