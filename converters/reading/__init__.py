"""Reading and checking models: a SavedModel, .keras or .h5 file checked whole (`trust`), then loaded and frozen
into a GraphDef (`loading`). Runs inside the sandbox: it is where a model's bytes are first parsed."""
