PYTHON ?= python3
# On machines that keep a CPU build of torch on disk, take it: the default wheel pulls in
# gigabytes of CUDA libraries that CI never uses. Elsewhere pip picks torch as usual.
CPU_TORCH := $(firstword $(wildcard /opt/wheels/torch-*+cpu-*.whl))

.PHONY: setup demo test
# The test extra includes the engine extra (torch, triton where it has wheels, ...): the tests
# cover the engine, and need nothing installed by hand.
setup:
	$(PYTHON) -m pip install -q $(CPU_TORCH) -e '.[test]'

demo: setup
	$(PYTHON) -m tensorfold_bench run long-prompt --model cpu --share 1,0.5

test: setup
	$(PYTHON) -m pytest -q
