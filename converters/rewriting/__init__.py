"""The graph rewrite: GraphDef surgery (`graph`), the GELU patterns and their matching (`patterns`, `rewrite`),
the int8 passes (`int8`) and TensorFlow ops spelled in TFLite builtins (`tf_ops_as_builtins`). Runs inside the
sandbox, on a model already read."""
