"""What a StableHLO module (an XlaCallModule op's) can do outside the process, read without running it.

StableHLO's own operations compute on tensors; what reaches out is a call out of the module: a custom call
runs native code by its name, and a module that passes tokens calls back into the host (JAX's callbacks,
`jax.debug.print`). The one custom call a JAX export always writes only checks shapes (`shape_assertion`).
TensorFlow functions a module calls back (`function_list`, jax2tf's call_tf) are in the SavedModel's library,
which the check reads function by function like any other.
"""

from ... import errors
from .. import stablehlo


def refusal(attributes):
    """What the XlaCallModule op with `attributes` (its AttrValue map) can do outside the process, or None."""
    if attributes["has_token_input_output"].b if "has_token_input_output" in attributes else False:
        return "passes tokens to host callbacks (code of the exporting process, which the model does not carry)"
    try:
        module = stablehlo.read(attributes["module"].s if "module" in attributes else b"")
    except errors.ConverterFailed as error:
        return f"holds a StableHLO module the check cannot open ({error.message})"
    for operation in module.operations():
        if operation.name == "stablehlo.custom_call":
            target = operation.attributes.get("call_target_name")
            if target not in stablehlo.CHECKS_ONLY:
                return f"holds a StableHLO custom call {target!r}, which runs native code by its name"
    return None
