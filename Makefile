# ftvm: the two commands a user needs are `make demo` and `make test`.
# Both install what is missing (as root, from Debian's packages), build,
# and fetch the guest image into the cache (outside the repository).

CARGO ?= cargo
FTVM := target/release/ftvm
# The harness (harness/ftsite: the two-host site, the FT tests, the
# benches, the demo) runs on Debian's python3, which has pytest once
# scripts/install-deps.sh has run (a python3 earlier on PATH may not).
# harness/run, bench/* and scripts/ft-demo take it from the environment.
PYTHON ?= /usr/bin/python3
export PYTHON

.PHONY: all deps build image demo test bench clean

all: build

deps:
	@bash scripts/install-deps.sh

build: deps
	$(CARGO) build --release --workspace

image: build
	$(FTVM) image build

demo: image
	@scripts/ft-demo --ftvm $(FTVM)

# The images the tests boot (the default one and the web image) are built
# together, beside the tests' compilation: each build configures its
# packages in a guest of one hart, so the two builds and the compiler share
# the 2 cores instead of waiting on one another (ftsite.prebuild; from a
# clean machine the images take some 15 minutes of a core each). Then
# cargo's tests, then the FT integration tests (harness/tests), two at a
# time; either failing fails make. A test that hangs fails within its
# limit, naming itself (cargo says which test runs long; pytest-timeout
# prints the stacks), instead of using up CI's time: cargo's tests take
# ~16 min (the README's examples ~5 of them, with their `py` image, built
# every run: its packages configured in the guest), the longest FT test
# ~7 min, on a loaded 2-core host.
test: build
	FTVM=$(abspath $(FTVM)) harness/run ftsite.prebuild & images=$$!; \
	$(CARGO) test --release --workspace --no-run; compiled=$$?; \
	wait $$images && [ $$compiled -eq 0 ]
	timeout --kill-after=30s 35m $(CARGO) test --release --workspace
	FTVM=$(abspath $(FTVM)) harness/run pytest -n 2 --timeout 1200 --durations=15 harness/tests

bench: image
	bench/vs-qemu
	bench/cpu-core
	bench/redis
	bench/dirty-tracking
	bench/record-replay
	bench/record-overhead
	bench/failover
	bench/ft-overhead
	bench/ft-network
	bench/lag-control
	bench/epoch-table
	bench/checkpoint
	bench/failover --mode checkpoint

clean:
	$(CARGO) clean
