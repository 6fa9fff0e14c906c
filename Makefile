# corral's developer commands. Each bootstraps .venv on first use, so a fresh clone needs
# only Python >= 3.11 and make.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-dev
# `make serve` runs from its own venv with only what serving and the demo repository need
# (the server, gRPC and demo extras), not the dev extra's Ray, mypy, tritonclient...
SERVE_VENV  := .venv-serve
SERVE_STAMP := $(SERVE_VENV)/.installed-serve

# The coverage floor only rises: raise it when coverage rises. Without cargo the suite runs
# once, on the Python edge: the data plane's grouped path (infer_group and what only the
# native edge's groups reach) is not run, so that run has a floor of its own (96.46 measured
# on a fresh clone without cargo, 2026-12-06).
COVERAGE_FLOOR := 96.92
COVERAGE_FLOOR_WITHOUT_EDGE := 96.40

# `make serve` builds this demo repository of 1,000 tiny models once, then serves it.
DEMO_REPOSITORY := demo-models

.PHONY: help venv tools edge edge-check lint typecheck test test-min test-pythons test-ft soak serve demo bench bench-quick bench-create \
	bench-footprint bench-scenarios bench-http bench-edge bench-ray bench-real bench-cold triton-peer perf-analyzer proto clean

help:
	@echo "make serve            serve $(DEMO_REPOSITORY)/ (1,000 tiny models) on :8000 (HTTP) and :8001 (gRPC)"
	@echo "make demo             build 1,000 tiny models and compare corral with onnxruntime's defaults"
	@echo "make test             lint, type-check and run the test suite with coverage"
	@echo "make soak             the long stress variants (not part of make test)"
	@echo "make test-min         the core, server and gRPC tests on the lowest versions pyproject allows"
	@echo "make test-pythons     the core, server and contract tests on every CPython pyproject claims"
	@echo "make test-ft          the core and contract tests on a free-threaded CPython (3.14t/3.13t), if found"
	@echo "make bench-create     serialized vs parallel session construction, side by side"
	@echo "make bench-footprint  threads, RSS and load time for 100 / 1,000 / 10,000 models"
	@echo "make bench-scenarios  requests/s: shared and per-thread sessions vs corral, 1 to 32 callers"
	@echo "make bench-http       requests/s, p50/p99: corral serve vs a raw ASGI and a FastAPI handler (needs wrk)"
	@echo "make bench-edge       corral serve's HTTP edge: direct route, ASGI only, plain uvicorn (BEFORE=checkout too)"
	@echo "make bench            corral vs FastAPI, MLServer, Triton, Ray Serve on 1,000 models -> docs/benchmarks.md"
	@echo "make bench-quick      the same on 50 models, corral and FastAPI only, in under a minute"
	@echo "make bench-real       real models from PyPI wheels: corral vs FastAPI, MLServer, the ceiling"
	@echo "make bench-cold       a never-loaded model's first answer against its load alone + a warm answer"
	@echo "make bench-ray        corral serve vs corral ray-serve (2 replicas) on 1,000 models, a hot model on 3 replicas -> docs/scale-out.md"
	@echo "make perf-analyzer    Triton's perf_analyzer in a venv of its own (the tests make it too)"
	@echo "make triton-peer      build NVIDIA Triton + its C++ onnxruntime backend, the peer of bench-http and"
	@echo "                      bench-real (MIRROR=folder of the fetched git mirrors; see benchmarks/README.md)"

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

$(SERVE_VENV)/bin/python:
	$(PYTHON) -m venv $(SERVE_VENV)
	$(SERVE_VENV)/bin/python -m pip install --quiet --upgrade pip

$(SERVE_STAMP): pyproject.toml | $(SERVE_VENV)/bin/python
	$(SERVE_VENV)/bin/python -m pip install --quiet -e '.[server,grpc,demo]'
	touch $(SERVE_STAMP)

# The native edge (edge/: Rust, PyO3, built by maturin from crates.io), installed into a venv
# when cargo is present; without it corral serves and tests with the Python edge, and says so.
# The stamp follows the crate's sources, so an edit rebuilds it (cargo builds incrementally).
EDGE_SOURCES := $(wildcard edge/Cargo.toml edge/Cargo.lock edge/build.rs edge/pyproject.toml \
	edge/corral_edge.pyi edge/src/*.rs edge/proto/*.proto)
define install_edge
	@if command -v cargo >/dev/null 2>&1; then \
		echo "building the native edge (edge/, Rust; about 1.5 minutes the first time)"; \
		$(1)/bin/python -m pip install --quiet ./edge && touch $(2); \
	else \
		echo "cargo not found: the native edge (edge/) is not built; corral serves with the Python edge"; \
	fi
endef

$(VENV)/.installed-edge: $(STAMP) $(EDGE_SOURCES)
	$(call install_edge,$(VENV),$@)

$(SERVE_VENV)/.installed-edge: $(SERVE_STAMP) $(EDGE_SOURCES)
	$(call install_edge,$(SERVE_VENV),$@)

edge: $(VENV)/.installed-edge

# The crate's own checks, when cargo is present: format, clippy, its unit and socket tests.
edge-check:
	@if command -v cargo >/dev/null 2>&1; then \
		cd edge && cargo fmt --check && cargo clippy --quiet --all-targets -- -D warnings \
			&& cargo test --quiet; \
	else \
		echo "cargo not found: the native edge's own checks are not run"; \
	fi

# The load generator of the HTTP benchmarks and their smoke test: Debian's wrk, installed
# when missing (CI runs as root on Debian); libb64, which tritonclient's perf_analyzer
# needs to start (tests/server/test_perf_analyzer.py); and the headless browser of the status
# page's tests (tests/server/observe/test_status_page.py), driven by Playwright from the dev extra.
tools:
	@command -v wrk >/dev/null 2>&1 || { \
		echo "installing wrk (Debian package wrk)"; \
		apt-get install -y -qq wrk >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null && apt-get install -y -qq wrk >/dev/null; } || \
		echo "could not install wrk: the benchmark smoke test will be skipped"; }
	@dpkg -s libb64-0d >/dev/null 2>&1 || { \
		echo "installing libb64 (Debian package libb64-0d)"; \
		apt-get install -y -qq libb64-0d >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null && apt-get install -y -qq libb64-0d >/dev/null; } || \
		echo "could not install libb64-0d: the perf_analyzer test will be skipped"; }
	@command -v chromium >/dev/null 2>&1 || { \
		echo "installing chromium (Debian package chromium)"; \
		apt-get install -y -qq chromium >/dev/null 2>&1 || \
		{ apt-get update -qq >/dev/null && apt-get install -y -qq chromium >/dev/null; } || \
		echo "could not install chromium: the status page's browser tests will be skipped"; }

lint: $(STAMP)
	$(BIN)/ruff check corral tests benchmarks
	$(BIN)/ruff format --check corral tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy --strict corral

# The suite serves with the native edge when it is built (--edge auto), and runs the tests of
# the edges' shared behaviour again on the Python edge (CORRAL_EDGE=python), so both edges
# pass them; without cargo, once, on the Python edge, saying the native edge was not tested.
# Coverage adds both runs up (each edge's code is measured where it serves); without the
# native edge, its Python side (server/native/, which needs it) is left out of the floor. The runs are
# spread over the cores by pytest-xdist (PYTEST_WORKERS), a test file to a worker; the tests
# that measure time against the machine's capacity (marked serial) run alone after them.
# Files are handed out in collection order, the longest first (tests/scheduling.py), not by
# their count of tests; each pass prints its 25 slowest tests, to keep that list current.
EDGE_TESTS := tests/server tests/reliability/test_connections.py \
	tests/reliability/test_grpc_connections.py tests/reliability/test_body_edges.py \
	tests/reliability/test_bodies.py tests/reliability/test_security.py
PYTEST_WORKERS ?= auto
PYTEST := $(BIN)/python -m pytest -m "not soak and not serial" -n $(PYTEST_WORKERS) --dist loadfile \
	--no-loadscope-reorder --durations=25

test: lint typecheck tools edge edge-check
	$(PYTEST) --cov=corral --cov-report=
	$(BIN)/python -m pytest -m "serial and not soak" -q --cov=corral --cov-append --cov-report=
	@if $(BIN)/python -c "import corral_edge" 2>/dev/null; then \
		echo "the suite ran on the native edge; now the edge tests on the Python edge"; \
		CORRAL_EDGE=python $(PYTEST) -q --cov=corral --cov-append --cov-report= $(EDGE_TESTS) && \
		$(BIN)/python -m pytest -q edge/tests && \
		$(BIN)/python -m coverage report --fail-under=$(COVERAGE_FLOOR); \
	else \
		echo "corral_edge is not installed: the native edge was not tested (install cargo)"; \
		$(BIN)/python -m coverage report --fail-under=$(COVERAGE_FLOOR_WITHOUT_EDGE) \
			--omit='*/corral/server/native/*'; \
	fi

soak: $(STAMP)
	$(BIN)/python -m pytest -m soak

# The dependency floors, proved: a fresh venv with every floor of pyproject.toml pinned
# (constraints/minimum.txt) and the test tools at their newest, running the tests of the core,
# model.toml / config.pbtxt, and both servers. Not part of `make test`; about 3 minutes to
# install and 2 to run.
MIN_VENV := .venv-min
MIN_TESTS := tests/core/models/test_config.py tests/core/compute/test_session.py tests/core/compute/test_session_options.py \
	tests/core/compute/test_runtime.py tests/core/models/test_pbtxt.py tests/core/host/test_host.py tests/server/http/test_server_http.py \
	tests/server/grpc/test_server_grpc.py tests/server/grpc/test_grpc_health.py tests/server/test_serve_flags.py \
	tests/server/test_triton_compat.py tests/server/connections/test_uvicorn_adapter.py tests/server/http/test_routes.py \
	tests/protocol/test_proto_runtime.py
# Not a floor: --trace-exporter needs the otel extra (whose floor, 1.25, needs protobuf < 5:
# not installable next to the grpc extra's floor).
MIN_DESELECT := \
	--deselect "tests/server/test_serve_flags.py::test_a_flag_and_its_variable_set_the_same_setting[trace_exporter]"

test-min:
	rm -rf $(MIN_VENV)
	$(PYTHON) -m venv $(MIN_VENV)
	$(MIN_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(MIN_VENV)/bin/python -m pip install --quiet -c constraints/minimum.txt \
		-e '.[server,grpc,demo]' pytest pytest-timeout hypothesis httpx 'tritonclient[http,grpc]' \
		grpcio-health-checking grpcio-reflection
	$(MIN_VENV)/bin/python -m pip list 2>/dev/null | grep -Ei '^(onnxruntime|numpy|protobuf|grpcio|uvicorn|orjson|prometheus|pydantic|onnx )'
	$(MIN_VENV)/bin/python -m pytest -m "not soak" -q $(MIN_TESTS) $(MIN_DESELECT)

# Every CPython the classifiers of pyproject.toml claim, found as python3.X on the PATH or under
# pyenv, each in its .venv-py3.X with the dev extra: the core, model.toml / config.pbtxt, both
# servers, the CLI (--version's GIL) and the rows of docs/thread-safety.md's contract that
# concern them. Left out: Ray (its own cluster, minutes per test), the benchmarks' smoke tests,
# the browser, perf_analyzer, packaging, deploy and docs checks (none depends on the version
# of Python running them). Fails when a claimed version is missing or fails. Not part of
# `make test` (CI has one Python); about 10 minutes per version on 2 busy cores.
CONTRACT_TESTS := tests/core/compute/test_concurrency.py tests/core/compute/test_exit.py tests/test_api.py \
	tests/core/compute/test_scheduler.py tests/core/host/test_loader.py tests/core/compute/test_inline_lane.py tests/core/host/test_table.py \
	tests/core/compute/test_arrival_order.py tests/core/base/test_interpreter.py
PYTHONS_TESTS := $(MIN_TESTS) $(CONTRACT_TESTS) tests/server/test_gc_freeze.py tests/cli/test_cli.py \
	tests/protocol/test_dataplane.py tests/server/connections/test_direct_infer.py tests/protocol/test_shared_memory.py \
	tests/server/test_body_budget.py tests/server/observe/test_metrics.py

# VERSIONS=3.14 tries versions not claimed yet instead.
test-pythons:
	$(PYTHON) scripts/test_pythons.py claimed $(if $(VERSIONS),--versions $(VERSIONS)) $(PYTHONS_TESTS)

# A free-threaded CPython (python3.14t, else python3.13t, on the PATH or under pyenv), in
# .venv-py3.Xt with the core's dependencies only (orjson and grpcio have no free-threaded
# wheels: docs/thread-safety.md), and the core's and the contract's tests. Fails if importing
# corral and its dependencies re-enables the GIL, and fails, saying that nothing was tested,
# when no such interpreter is found: a test target that ran nothing must not read as a pass.
# The files below import neither the server nor a client (test_pbtxt.py and test_inline_lane.py
# do, in some tests).
FT_TESTS := tests/core/models/test_config.py tests/core/compute/test_session.py tests/core/compute/test_runtime.py tests/core/host/test_host.py \
	tests/core/compute/test_concurrency.py tests/core/compute/test_exit.py tests/test_api.py tests/core/compute/test_scheduler.py \
	tests/core/host/test_loader.py tests/core/host/test_table.py tests/core/compute/test_arrival_order.py tests/core/base/test_interpreter.py

test-ft:
	$(PYTHON) scripts/test_pythons.py free-threaded $(FT_TESTS)

demo: $(STAMP)
	$(BIN)/corral demo

# The footprint benchmark's models, laid out as a Triton repository.
$(DEMO_REPOSITORY): | $(SERVE_STAMP)
	$(SERVE_VENV)/bin/python benchmarks/footprint.py repository $(DEMO_REPOSITORY).partial --count 1000
	mv $(DEMO_REPOSITORY).partial $(DEMO_REPOSITORY)

serve: $(SERVE_STAMP) $(SERVE_VENV)/.installed-edge | $(DEMO_REPOSITORY)
	$(SERVE_VENV)/bin/corral serve $(DEMO_REPOSITORY)

# Regenerate corral/protocol/proto and corral/_proto from their .proto (the generated files are
# committed) with the grpcio-tools of constraints/proto.txt, in a venv of its own: that old
# generator keeps the grpc extra's protobuf floor low (pyproject.toml), and pins protobuf < 7.
PROTO_VENV := .venv-proto
$(PROTO_VENV)/.installed: constraints/proto.txt
	rm -rf $(PROTO_VENV)
	$(PYTHON) -m venv $(PROTO_VENV)
	$(PROTO_VENV)/bin/python -m pip install --quiet -r constraints/proto.txt
	touch $@

proto: $(PROTO_VENV)/.installed
	$(PROTO_VENV)/bin/python scripts/gen_proto.py

# The benchmarks are scripts in benchmarks/, not part of the wheel: `--help` on each.
bench-create: $(STAMP)
	$(BIN)/python benchmarks/create.py

bench-footprint: $(STAMP)
	$(BIN)/python benchmarks/footprint.py

bench-scenarios: $(STAMP)
	$(BIN)/python benchmarks/scenarios.py

bench-http: $(STAMP) tools
	$(BIN)/python benchmarks/http_bench.py

# BEFORE=DIR adds corral serve from another checkout (a git worktree of an earlier commit).
bench-edge: $(STAMP) tools
	$(BIN)/python benchmarks/edge_ab.py $(if $(BEFORE),--before $(BEFORE)) --binary

# Each peer installs into its own venv under ~/.cache/corral-bench (CORRAL_BENCH_CACHE).
bench: $(STAMP) tools
	$(BIN)/python benchmarks/bench_peers.py --json benchmarks/results/peers-full.json
	$(BIN)/python benchmarks/footprint.py --counts 100,1000,10000 --json benchmarks/results/density.json
	$(BIN)/python benchmarks/render_peers.py benchmarks/results/peers-full.json \
		--density benchmarks/results/density.json --out docs

bench-quick: $(STAMP) tools
	$(BIN)/python benchmarks/bench_peers.py --quick --peers corral,fastapi \
		--json benchmarks/results/peers-quick.json
	$(BIN)/python benchmarks/render_peers.py benchmarks/results/peers-quick.json \
		--out benchmarks/results/quick

# The models come from four wheels (magika, rapidocr-onnxruntime, silero-vad, nudenet),
# downloaded by name into ~/.cache/corral-bench/real-models (CORRAL_BENCH_CACHE).
# The heavy models answer 15-30 requests/s here: at 32 and 64 connections a closed-loop run
# needs tens of seconds before its first answers are back, hence their longer runs.
bench-real: $(STAMP) tools
	$(BIN)/python benchmarks/real_models.py --models magika,silero-vad,ocr-cls --mlserver \
		--mixed --rounds 2 --json benchmarks/results/real-light.json
	$(BIN)/python benchmarks/real_models.py --models ocr-rec,nudenet --mlserver \
		--rounds 2 --duration 30 --json benchmarks/results/real-heavy.json
	# Issue 31's starvation case: one session (instance_group { count: 1 }) for 16 callers.
	$(BIN)/python benchmarks/real_models.py --models magika --instance-count 1 \
		--targets corral-pbtxt --connections 16 --rounds 3 --duration 5 \
		--json benchmarks/results/real-one-instance.json
	$(BIN)/python benchmarks/real_models.py render benchmarks/results/real-light.json \
		benchmarks/results/real-heavy.json benchmarks/results/real-one-instance.json --out docs

# Issue 49's cold starts, per model kind: the demo's tiny models, one with external data and
# the real models of bench-real (from the same cache). Figures in docs/host.md, "Cold starts".
bench-cold: $(STAMP)
	$(BIN)/python benchmarks/cold_start.py --json benchmarks/results/cold-start.json

# NVIDIA Triton (tritonserver 2.51 from nvidia-pytriton, with Triton's C++ onnxruntime backend
# r24.10 compiled here) for bench-http and bench-real, which measure it beside corral when it is
# built and say so when it is not. Built into $CORRAL_TRITON_HOME (default
# ~/.cache/corral-bench/triton-ort) from git mirrors of the backend's sources fetched by hand:
# MIRROR names their folder (scripts/build_triton_peer.sh says which). Not part of make test.
triton-peer:
	MIRROR=$(MIRROR) bash scripts/build_triton_peer.sh

# Triton's perf_analyzer in a venv of its own under ~/.cache/corral-bench (CORRAL_BENCH_CACHE):
# PyPI's perf-analyzer where glibc >= 2.38, else tritonclient 2.41's binary. The tests and
# bench-http's --grpc-client perf_analyzer make it on first use too; never in .venv.
perf-analyzer: $(STAMP) tools
	$(BIN)/python benchmarks/perf_analyzer.py

# corral alone and on Ray Serve side by side, with Ray Serve's own multiplexing for reference.
bench-ray: $(STAMP) tools
	$(BIN)/python benchmarks/bench_peers.py --peers corral,corral-ray,ray-serve \
		--concurrency 1,16,64 --json benchmarks/results/ray.json
	$(BIN)/python benchmarks/render_ray.py benchmarks/results/ray.json docs/scale-out.md
	$(BIN)/python benchmarks/ray_hot.py --models 1000 --replicas 3 --seconds 20 \
		--json benchmarks/results/ray_hot.json

clean:
	rm -rf $(VENV) $(SERVE_VENV) $(MIN_VENV) .venv-py3.* .pytest_cache .mypy_cache .ruff_cache .coverage htmlcov \
		$(DEMO_REPOSITORY) $(DEMO_REPOSITORY).partial
