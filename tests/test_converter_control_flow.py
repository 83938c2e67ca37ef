"""GELUs inside tf.cond branches and tf.while_loop bodies: found, rewritten and converted in every mode.

The TFLite converter turns If/While into IF/WHILE ops whose branches and
bodies are subgraphs of their own, so every op promise here is checked over
all subgraphs (report.op_histogram counts every subgraph).
"""

import math

import pytest
import tensorflow as tf

import conversions
from keras_gelu import converters
from keras_gelu.converters.tflite import operators

pytestmark = pytest.mark.legs("tf_keras", "tf218")  # TensorFlow graphs, any flavour: the leg that balances the cores



def exact_gelu(x):
    return 0.5 * x * (1.0 + tf.math.erf(x / math.sqrt(2.0)))


def tanh_gelu(x):
    return 0.5 * x * (1.0 + tf.math.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x * x * x)))


def branches(h):
    """Exact GELU in one branch, the tanh form in the other."""
    return tf.cond(tf.reduce_sum(h) > 0.0, lambda: exact_gelu(h), lambda: tanh_gelu(h))


def loop(h):
    """Three rounds of an exact GELU and a scale."""
    _, result = tf.while_loop(lambda i, v: i < 3, lambda i, v: (i + 1, exact_gelu(v) * 1.5), (tf.constant(0), h))
    return result


def branch_with_nested_function(h):
    """A GELU in a tf.function of its own, called from a cond branch."""
    nested = tf.function(exact_gelu)
    return tf.cond(tf.reduce_max(h) > 100.0, lambda: h, lambda: nested(h))


MODELS = {"cond": (branches, 2, "IF"), "while": (loop, 1, "WHILE"),
          "cond_nested": (branch_with_nested_function, 1, "IF")}


class Block(tf.Module):
    def __init__(self, body):
        super().__init__()
        self.w = tf.Variable(tf.random.stateless_normal([16, 16], seed=[3, 4]) * 0.5)
        self.body = body

    @tf.function(input_signature=[tf.TensorSpec([None, 16], tf.float32, name="x")])
    def __call__(self, x):
        return {"y": self.body(tf.matmul(x, self.w))}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("control_flow")
    paths = {}
    for name, (body, _, _) in MODELS.items():
        block = Block(body)
        paths[name] = str(root / name)
        tf.saved_model.save(block, paths[name], signatures={"serving_default": block.__call__})
    return paths


@pytest.mark.parametrize("mode, exact_as", conversions.REWRITING, ids=conversions.ids(conversions.REWRITING))
@pytest.mark.parametrize("name", sorted(MODELS))
def test_gelus_in_control_flow(saved, name, mode, exact_as):
    _, gelus, control_op = MODELS[name]
    tflite_model, report = converters.convert(saved[name], mode=mode, exact_as=exact_as)
    assert sum(g["count"] for g in report.gelus) == gelus, report.gelus
    ops = operators.op_histogram(tflite_model)
    assert ops.get(control_op) == 1, ops
    assert not any(op.startswith("Flex") for op in ops), ops
    if mode == "builtin":
        assert "GELU" not in ops, ops
    else:
        assert ops.get("GELU") == gelus, ops
    assert report.verified and all(c["passed"] for c in report.fidelity), report.fidelity
    # The function is kept (native, erf form, tanh sources) or approximated
    # (sigmoid form: 2e-2 per activation, tanh form: 4.7e-4), compounded by
    # the loop's three rounds of x1.5 and a 16-wide matmul.
    exact_kept = conversions.keeps_exact_gelu(mode, exact_as)
    bound = 1e-4 if exact_kept else {"sigmoid": 0.5, "tanh": 2e-2}[exact_as]
    assert max(c["max_abs"] for c in report.drift) <= bound


def test_select_mode_keeps_control_flow_and_converts(saved):
    tflite_model, report = converters.convert(saved["cond"], mode="select")
    assert operators.op_histogram(tflite_model).get("IF") == 1
    assert {g["became"] for g in report.gelus} == {"unchanged"}


# --- found by the graph fuzzer (test_converter_fuzz.py), pinned ------------------------------------------

CAPTURED_HALF, CAPTURED_SQRT_HALF = tf.constant(0.5), tf.constant(0.70710677)  # eager: captured, not inlined


def exact_gelu_of_captured_constants(h):
    return CAPTURED_HALF * h * (1.0 + tf.math.erf(h * CAPTURED_SQRT_HALF))


def _saved_block(tmp_path, body, name="block"):
    block = Block(body)
    path = str(tmp_path / name)
    tf.saved_model.save(block, path, signatures={"serving_default": block.__call__})
    return path


@pytest.mark.parametrize("placement", ["cond", "while"])
def test_a_gelu_whose_constants_are_captured_is_found_in_branches_and_loop_bodies(tmp_path, placement):
    """tf.cond and tf.while_loop pass captured tensors as arguments: the constants reached the branch or body as
    arguments, so the GELU was not found (native mode computed it without the GELU op)."""
    if placement == "cond":
        def body(h):
            return tf.cond(tf.reduce_sum(h) > 0.0, lambda: exact_gelu_of_captured_constants(h), lambda: h)
    else:
        def body(h):
            return tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, exact_gelu_of_captured_constants(v)),
                                 (tf.constant(0), h))[1]
    path = _saved_block(tmp_path, body)
    for mode in ("native", "builtin"):
        _, report = converters.convert(path, mode=mode)
        assert sum(g["count"] for g in report.gelus) == 1, report.gelus
        assert report.ops.get("GELU", 0) == (mode == "native"), report.ops
        assert report.verified and all(c["passed"] for c in report.fidelity)


def test_a_cond_inside_a_branch_that_captures_a_constant_loads(tmp_path):
    """The freezer renames the functions of a cond nested in a branch (..._frozen_...); reading the outer branch
    looked them up where only the originals were known (here: when the inner cond captures a constant)."""
    captured_slope = tf.constant(1.702)

    def body(h):
        inner = lambda: tf.cond(tf.reduce_max(h) > 1.0, lambda: exact_gelu(h),  # noqa: E731
                                lambda: h * tf.math.sigmoid(captured_slope * h))
        return tf.cond(tf.reduce_mean(h) > 0.0, inner, lambda: h)

    _, report = converters.convert(_saved_block(tmp_path, body), mode="native")
    assert report.ops.get("GELU") == 1 and report.ops.get("IF") == 2 and report.verified


def test_post_training_int8_of_a_loop_that_captures_a_computed_tensor_converts(tmp_path):
    """TFLite's calibrator crashed the process (tensorflow#75140) on a WHILE whose body hands a loop variable
    on unchanged, as every captured tensor is; the body now recomputes it as max(v, v)."""
    def body(h):
        scale = tf.reduce_mean(h, axis=-1, keepdims=True)
        return tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, exact_gelu(v + scale) * 0.5),
                             (tf.constant(0), h))[1]

    _, report = converters.convert(_saved_block(tmp_path, body), int8=True, calibration="random:4")
    assert report.ops.get("WHILE") == 1 and report.ops.get("MAXIMUM", 0) >= 1 and report.verified


def test_post_training_int8_of_a_map_over_computed_tensors_converts(tmp_path):
    """tf.map_fn (keras.ops.map: D-FINE's per-image top-k gather) hands its elements to the loop as TensorLists,
    variants its body hands on unchanged: max(v, v) of one failed the converter's import ("Value for attr 'T' of
    variant is not in the list of allowed values"). Left as they are, the converter lowers them to tensors."""
    def body(h):
        _, indices = tf.math.top_k(tf.reduce_max(h, axis=-1, keepdims=True) * h, 3)
        return tf.map_fn(lambda pair: tf.gather(pair[0], pair[1]), (exact_gelu(h), indices),
                         fn_output_signature=tf.float32)

    _, report = converters.convert(_saved_block(tmp_path, body), int8=True, calibration="random:4")
    assert report.ops.get("WHILE") == 1 and report.verified, report.ops


def _window_mask(shift):
    """Hugging Face Swin's attention mask: built from constants through a cond, zeros where windows are not shifted."""
    return tf.cond(tf.constant(shift) > 0, lambda: tf.fill([16], -100.0), lambda: tf.zeros([16]))


def _masked_in_a_loop(h):
    return tf.while_loop(lambda i, v: i < 2, lambda i, v: (i + 1, exact_gelu(v + _window_mask(0))),
                         (tf.constant(0), h))[1]


MASKED = {"unshifted": lambda h: exact_gelu(h + _window_mask(0)),
          "shifted": lambda h: exact_gelu(h + _window_mask(3)), "in a loop body": _masked_in_a_loop}


@pytest.mark.parametrize("placement", MASKED)
def test_post_training_int8_of_an_addition_a_cond_computes_from_constants_converts(tmp_path, placement):
    """The int8 passes evaluate what an addition adds where constants alone compute it (a zero bias is dropped):
    a cond's branches were left out of the graph evaluated, and Swin's --int8 ended in an internal error. In a
    loop body, whose graph does not hold the branches of a cond nested in it, the addition is left as it is."""
    _, report = converters.convert(_saved_block(tmp_path, MASKED[placement]), int8=True, calibration="random:4")
    assert report.verified and "IF" not in report.ops, report.ops  # the mask folded: computed once, from constants


def test_an_exact_and_a_tanh_gelu_of_one_tensor_both_become_the_gelu_op(tmp_path):
    """tf.nn.gelu's two spellings share their first product, 0.5 x; the converter merged the two products and
    then fused only the tanh one, failing on an Erfc. The tanh replacement is now spelled x (0.5 (1 + tanh))."""
    path = _saved_block(tmp_path, lambda h: tf.nn.gelu(h, approximate=False) + tf.nn.gelu(h, approximate=True))
    _, report = converters.convert(path, mode="native")
    assert report.ops.get("GELU") == 2 and report.verified
