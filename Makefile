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

# cargo's tests, then the FT integration tests (harness/tests), two at a
# time; either failing fails make. A test that hangs fails within its
# limit, naming itself (cargo says which test runs long; pytest-timeout
# prints the stacks), instead of using up CI's time: cargo's tests take
# ~16 min (the README's examples ~6 of them) and ~8 more when their images
# are not built yet (the README's `py` image is built every run: its
# packages configured in the guest, ~6 min; services.rs's web image once
# per recipe, ~10 min), the longest FT test ~7 min, on a loaded 2-core host.
test: image
	$(CARGO) test --release --workspace --no-run
	timeout --kill-after=30s 35m $(CARGO) test --release --workspace
	FTVM=$(abspath $(FTVM)) harness/run pytest -n 2 --timeout 1200 harness/tests

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
