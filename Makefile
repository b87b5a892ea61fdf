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

# Two workers: most tests wait on servers, clocks and scripted timelines, so two share two cores
# (23 min in one process on a 2-core AVX2 EPYC, 13 in two); JOBS=1 for one process.
JOBS ?= 2
test: setup
	$(PYTHON) -m pytest -q -n $(JOBS)
