# Everything a fresh machine needs: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
VENV_PYTHON := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
EXTRAS := test,qat,litert,examples
PYTEST_ARGS ?=

export TF_CPP_MIN_LOG_LEVEL ?= 2

.PHONY: demo test test-keras3 test-tf-keras install bench plot clean

install: $(INSTALLED)

$(INSTALLED): setup.cfg pyproject.toml
	test -x $(VENV_PYTHON) || $(PYTHON) -m venv $(VENV)
	$(VENV_PYTHON) -m pip install --quiet --upgrade pip
	$(VENV_PYTHON) -m pip install --quiet -e ".[$(EXTRAS)]"
	touch $@

demo: $(INSTALLED)
	$(VENV_PYTHON) examples/demo.py --output-dir demo_output

# The whole suite, once per Keras flavour (the way tf.keras chooses: TF_USE_LEGACY_KERAS).
test: test-keras3 test-tf-keras

test-keras3: $(INSTALLED)
	TF_USE_LEGACY_KERAS=0 $(VENV_PYTHON) -m pytest $(PYTEST_ARGS)

test-tf-keras: $(INSTALLED)
	TF_USE_LEGACY_KERAS=1 $(VENV_PYTHON) -m pytest $(PYTEST_ARGS)

bench: $(INSTALLED)
	$(VENV_PYTHON) benchmarks/bench_layers.py

plot: $(INSTALLED)
	$(VENV_PYTHON) examples/plot_forms.py --output docs/gelu_forms.png

clean:
	rm -rf $(VENV) demo_output build *.egg-info .pytest_cache .hypothesis
