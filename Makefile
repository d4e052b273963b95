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

# The tests' compilation, then the images they boot (the default one and
# the web image) built side by side (ftsite.prebuild: each build configures
# its packages in a guest of one hart, so two builds fill the 2 cores;
# minutes each from a clean machine; beside the compiler too, the three
# finished no sooner in a clean rehearsal), then cargo's tests, then the FT integration tests
# (harness/tests), two at a time; either failing fails make. A test that
# hangs fails within its limit, naming itself (cargo says which test runs
# long; pytest-timeout prints the stacks), instead of using up CI's time:
# cargo's tests take ~18 min (the README's examples ~5 of them, with their
# `py` image, built every run: its packages configured in the guest), the
# FT tests ~18 min, the longest ~7 min, on a loaded 2-core host.
test: build
	$(CARGO) test --release --workspace --no-run
	FTVM=$(abspath $(FTVM)) harness/run ftsite.prebuild
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
