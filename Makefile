# The two commands of the README. Both install what they need on a fresh Debian machine.
#   make serve   fetch the default models, build, and serve them on :8000
#   make test    fetch the default models, build, and run every test (incl. the contract suite
#                and the GPU check's dry run on the kernels' CPU emulator)

CARGO ?= cargo
# Clean optimised builds gain nothing from incremental artefacts, which take gigabytes.
export CARGO_INCREMENTAL ?= 0
ARGS ?=

.PHONY: serve test deps models nvrtc sdk torch llamacpp build lint fmt bench-gate

deps:
	@scripts/install-deps.sh

models:
	@scripts/fetch-models.sh

# NVRTC for the test that compiles every CUDA kernel for sm_90 (no GPU needed).
nvrtc:
	@scripts/fetch-nvrtc.sh >/dev/null

# The OpenAI Python SDK, for the test of what it assembles from the server's streams.
sdk:
	@scripts/fetch-sdk.sh >/dev/null

# torch and transformers at the GPU machine's versions, for the GPU check's dry run.
torch:
	@scripts/fetch-torch.sh >/dev/null

# llama.cpp's requantisations of the default model and its outputs on them, for the engine's
# parity test against llama.cpp (builds llama-quantize the first time: about 10 min).
llamacpp: models
	@scripts/make-llamacpp-quants.sh >/dev/null

build: deps
	$(CARGO) build --release -p gateway

serve: deps models
	$(CARGO) run --release -p gateway -- serve $(ARGS)

# The test build turns on the engine's failure switches (`fault-inject`) for the fault tests;
# the same feature set for the binary and the tests, so neither rebuilds the other's gateway.
TEST_FEATURES = --features gateway/fault-inject

# The GPU check's dry run takes its binaries from the test build, so it is given its features.
test: deps models nvrtc sdk torch llamacpp
	$(CARGO) build -p gateway $(TEST_FEATURES)
	$(CARGO) test --workspace --no-fail-fast $(TEST_FEATURES)
	scripts/gpu-check.sh --dry-run $(TEST_FEATURES)

lint: deps
	$(CARGO) fmt --all -- --check
	python3 scripts/import_cycles.py engine >/dev/null  # the engine's module graph has no cycle
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) clippy -p kernels -p engine --all-targets -- -D warnings  # without the cuda feature

fmt:
	$(CARGO) fmt --all
