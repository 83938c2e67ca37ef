# Everything a fresh machine needs: `make demo` and `make test`.
# The interpreter the environments are made from: python3's version, in its build that runs Python fastest here
# (.ci/python: one with CPython linked into its executable, as a distribution builds it, before one calling into
# a shared libpython, as pyenv builds it by default; 6% of the suite's CPU).
PYTHON ?= $(shell python3 .ci/python || echo python3)
VENV ?= .venv
VENV_PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
EXTRAS := tensorflow,test,qat,litert,examples,tflm,vela,docs,jax
# Every leg shows its 15 slowest tests, so that where the time goes stays in view.
PYTEST_ARGS ?= --durations=15
# pytest, then the process ends once pytest has returned and every exit handler has run, without Python tearing
# down its heap object by object: a flavour leg's millions of TensorFlow and Keras objects took 6-7 s of CPU
# after the leg's summary, for nothing anyone reads.
PYTEST := -c 'import atexit, os, sys, pytest; code = int(pytest.main()); sys.stdout.flush(); sys.stderr.flush(); \
  atexit._run_exitfuncs(); os._exit(code)'

export TF_CPP_MIN_LOG_LEVEL ?= 2
# Each leg's kernels on one thread (TensorFlow's, oneDNN's and PyTorch's OpenMP): the two legs `make test` runs
# at once fill the two cores already, and a thread pool per core in each of them made the two legs 4% slower
# together. The benchmarks and the demo keep every thread.
ONE_THREAD := TF_NUM_INTRAOP_THREADS=1 OMP_NUM_THREADS=1

# The oldest supported TensorFlow, whose tf.lite.Interpreter still runs Flex
# (select-mode) models: the select-mode parity tests really run there.
TF218_VENV ?= .venv-tf218
TF218_PYTHON := $(TF218_VENV)/bin/python
TF218_INSTALLED := $(TF218_VENV)/.installed

# Keras 3 on JAX and on PyTorch, each in an environment without TensorFlow: the layers' own tests.
JAX_VENV ?= .venv-jax
TORCH_VENV ?= .venv-torch
BACKEND_TESTS := tests/test_backends.py tests/test_fine_tuning.py

.PHONY: demo test test-as-avx2 test-every-case test-keras3 test-tf-keras test-tf218 test-jax test-torch install install-tf218 install-jax install-torch install-chromium screenshot docs bench bench-int8 bench-precision recipes study plot clean

install: $(INSTALLED)

# uv installs what pip would (the same resolution from the same registry) in seconds rather than minutes:
# the install is a quarter of `make test`'s budget with pip. --native-tls: the system's certificates, as pip's.
# --compile-bytecode: the .pyc files pip writes at install and uv by default does not. Without them every process
# compiles what it imports, and where PYTHONDONTWRITEBYTECODE is set (this project's machines set it) or the
# process may not write (the sandbox's workers), it does so each time: importing the converter took 12-13 s
# where it takes 5, in every leg, zygote and fresh process of the suite.
UV_INSTALL = uv pip install --quiet --native-tls --compile-bytecode

# Each environment is made again when what it is made from changes: the Makefile's recipes among them.
$(INSTALLED): setup.cfg pyproject.toml Makefile
	test -x $(VENV_PYTHON) || $(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet uv
	$(VENV)/bin/$(UV_INSTALL) --python $(VENV_PYTHON) -e ".[$(EXTRAS)]"
	touch $@

# tensorflow-cpu provides the same `tensorflow` module; --no-deps keeps the installer from
# pulling the full tensorflow wheel in beside it for our `tensorflow` requirement.
install-tf218: $(TF218_INSTALLED)

$(TF218_INSTALLED): setup.cfg pyproject.toml Makefile
	test -x $(TF218_PYTHON) || $(PYTHON) -m venv $(TF218_VENV)
	$(TF218_PYTHON) -m pip install --quiet uv
	$(TF218_VENV)/bin/$(UV_INSTALL) --python $(TF218_PYTHON) "tensorflow-cpu==2.18.1" "numpy>=1.26,<2.1" "pytest>=7" \
	  "hypothesis>=6.80"
	$(TF218_VENV)/bin/$(UV_INSTALL) --python $(TF218_PYTHON) --no-deps -e .
	touch $@

install-jax: $(JAX_VENV)/.installed

$(JAX_VENV)/.installed: setup.cfg pyproject.toml Makefile
	test -x $(JAX_VENV)/bin/python || $(PYTHON) -m venv $(JAX_VENV)
	$(JAX_VENV)/bin/python -m pip install --quiet uv
	$(JAX_VENV)/bin/$(UV_INSTALL) --python $(JAX_VENV)/bin/python -e ".[jax]" "pytest>=7" "hypothesis>=6.80"
	touch $@

# pip, not uv, for torch: `pip install torch==2.13.0` takes the CPU build this machine keeps on disk (its pip
# configuration finds it), where a plain `torch` from the registry is a CUDA build of several GB.
install-torch: $(TORCH_VENV)/.installed

$(TORCH_VENV)/.installed: setup.cfg pyproject.toml Makefile
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -m pip install --quiet uv "torch==2.13.0"
	$(TORCH_VENV)/bin/$(UV_INSTALL) --python $(TORCH_VENV)/bin/python -e ".[torch]" "pytest>=7" "hypothesis>=6.80" \
	  ml_dtypes
	touch $@

# Debian's Chromium, for the suite's browser test of --explain's page (tests/test_explain.py): apt, as root, where
# it is not there yet; elsewhere the test says it is skipped.
install-chromium:
	@command -v chromium >/dev/null || { test "$$(id -u)" = 0 && command -v apt-get >/dev/null && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends chromium >/dev/null; } || \
	  echo "chromium not installed: the browser test of --explain's page will be skipped"

# The picture of --explain's page that docs/int8.md shows, taken by the browser test.
screenshot: $(INSTALLED) install-chromium
	KG_UPDATE_SCREENSHOT=1 TF_USE_LEGACY_KERAS=1 $(VENV_PYTHON) $(PYTEST) -q tests/test_explain.py -k chromium

demo: $(INSTALLED)
	$(VENV_PYTHON) examples/demo.py --output-dir demo_output

# The whole suite, once per Keras flavour (the way tf.keras chooses: TF_USE_LEGACY_KERAS),
# then once more on TensorFlow 2.18 with Keras 3. Each leg sets TensorFlow's
# oneDNN optimisations explicitly, so both settings are tested whatever this
# CPU's default (on for AVX-512, off for AVX2-only): they change fused kernels,
# and with them float results. The tf-keras leg runs with oneDNN on, because
# tf-keras's LayerNormalization is the pattern oneDNN fuses.
# Then Keras 3's backend-neutral tests on JAX and on PyTorch, each in an
# environment without TensorFlow.
# The legs and the installs are one make's work on two job slots, one per core: the legs' CPU time is what the
# budget is made of, and two slots kept busy leave no core idle. (Every leg at once took 22 minutes where two at
# a time took 17.5: six TensorFlow processes on two cores spent 20% more CPU time.) Make starts the legs in the
# order given, each when a slot is free and its environment installed: the longest first, so the short ones fill
# the end, and an environment installs in a free slot, the second slot taking the other environments while the
# first installs the main one (before 2026-12-05 every install ran first, a minute and a half with a core half
# idle). --keep-going: a leg that fails keeps no other from running; the output of each leg comes when it ends.
LEGS := test-keras3 test-tf-keras test-torch test-tf218 test-jax

test:
	$(MAKE) --jobs=2 --keep-going --output-sync=target $(LEGS)

test-keras3: $(INSTALLED)
	$(ONE_THREAD) TF_USE_LEGACY_KERAS=0 TF_ENABLE_ONEDNN_OPTS=0 $(VENV_PYTHON) $(PYTEST) $(PYTEST_ARGS)

test-tf-keras: $(INSTALLED) install-chromium  # the browser test of --explain's page runs here
	$(ONE_THREAD) TF_USE_LEGACY_KERAS=1 TF_ENABLE_ONEDNN_OPTS=1 $(VENV_PYTHON) $(PYTEST) $(PYTEST_ARGS)

# TensorFlow 2.18's XLA knows no --xla_cpu_max_isa (`make test-as-avx2`'s): it ends the process at its first XLA
# function ("Unknown flags in XLA_FLAGS"), so this leg runs without that flag, its XLA built for the CPU it is on.
test-tf218: $(TF218_INSTALLED)
	$(ONE_THREAD) TF_USE_LEGACY_KERAS=0 TF_ENABLE_ONEDNN_OPTS=1 \
	  XLA_FLAGS="$(filter-out --xla_cpu_max_isa=%,$(XLA_FLAGS))" $(TF218_PYTHON) $(PYTEST) $(PYTEST_ARGS)

test-jax: $(JAX_VENV)/.installed
	$(ONE_THREAD) KERAS_BACKEND=jax $(JAX_VENV)/bin/python $(PYTEST) $(PYTEST_ARGS) $(BACKEND_TESTS)

# PyTorch's FX graph cache keys a compiled CPU step without the vector instructions it was built for (2.13): read
# on the other CPU kind (this disk moves between AVX2 and AVX-512 machines, /tmp with it), a jit-compiled step
# computed NaN and 1e37 where GELU is 10. One inductor cache per kind.
CPU_KIND := $(shell grep -qw avx512f /proc/cpuinfo && echo avx512 || echo avx2)
INDUCTOR_CACHE := $(or $(TMPDIR),/tmp)/torchinductor-keras-gelu-$(or $(ATEN_CPU_CAPABILITY),$(CPU_KIND))

test-torch: $(TORCH_VENV)/.installed
	$(ONE_THREAD) TORCHINDUCTOR_CACHE_DIR=$(INDUCTOR_CACHE) KERAS_BACKEND=torch $(TORCH_VENV)/bin/python $(PYTEST) $(PYTEST_ARGS) $(BACKEND_TESTS)

# On an AVX-512 machine, the suite with the other CPU kind's kernels where a library lets a process choose them
# faithfully: XLA's built for AVX2 (JAX's, and TensorFlow 2.21's, which keras_gelu's kernels compile with; not
# TensorFlow 2.18's: see test-tf218), PyTorch's too (and its inductor cache the AVX2 one). Not XNNPACK's
# (LiteRT's), which picks by what the CPU has; nor oneDNN's: ONEDNN_MAX_CPU_ISA=AVX2 leaves TensorFlow handing
# bfloat16 ops to oneDNN by what the CPU has, and the mixed_bfloat16 tests abort (dnnl::error).
test-as-avx2:
	XLA_FLAGS=--xla_cpu_max_isa=AVX2 ATEN_CPU_CAPABILITY=avx2 $(MAKE) test

# Every case of every matrix that `make test` runs today's share of (conftest.todays_share, conftest.rotated), and
# every keras-hub family, in the two flavour legs: for a release, or a change to a mechanism a matrix covers (about
# an hour).
test-every-case:
	KG_EVERY_CASE=1 $(MAKE) --jobs=2 test-keras3 test-tf-keras

# The documentation site, from docs/ (docs/mkdocs.yml), into build/site/.
docs: $(INSTALLED)
	$(VENV)/bin/mkdocs build --strict -f docs/mkdocs.yml -d $(CURDIR)/build/site

bench: $(INSTALLED)
	$(VENV_PYTHON) benchmarks/bench_layers.py

bench-int8: $(INSTALLED)
	$(VENV_PYTHON) benchmarks/bench_int8.py

# Ours against the stock converter and AI Edge Quantizer, which the bench extra brings (make test installs none of it).
bench-precision: $(INSTALLED)
	$(VENV)/bin/$(UV_INSTALL) --python $(VENV_PYTHON) -e ".[bench]"
	$(VENV_PYTHON) benchmarks/bench_precision.py

# The int8 recipes, each with QAT on both engines: tfmot (tf-keras) and keras_gelu.qat (Keras 3).
RECIPES := qat_digits qat_cnn_digits qat_transformer
recipes: $(INSTALLED)
	for recipe in $(RECIPES); do \
	  TF_USE_LEGACY_KERAS=1 $(VENV_PYTHON) examples/$$recipe.py --force --output-dir $${recipe}_output/tf_keras && \
	  TF_USE_LEGACY_KERAS=0 $(VENV_PYTHON) examples/$$recipe.py --force --output-dir $${recipe}_output/keras3 || exit 1; \
	done
	TF_USE_LEGACY_KERAS=0 $(VENV_PYTHON) examples/qat_transformer.py --attention multi_head --force \
	  --output-dir qat_transformer_output/keras3_multi_head
	TF_USE_LEGACY_KERAS=0 $(VENV_PYTHON) examples/qat_real_models.py --force --output-dir qat_real_models_output

# The ReLU -> GELU study (swap_activations on trained models, 5 seeds, two tasks; ~5 minutes).
study: $(INSTALLED)
	$(VENV_PYTHON) examples/relu_to_gelu.py --plots-dir docs --force

plot: $(INSTALLED)
	$(VENV_PYTHON) examples/plot_forms.py --output docs/gelu_forms.png

clean:
	rm -rf $(VENV) $(TF218_VENV) $(JAX_VENV) $(TORCH_VENV) demo_output qat_digits_output qat_cnn_digits_output qat_transformer_output build *.egg-info .pytest_cache .hypothesis
