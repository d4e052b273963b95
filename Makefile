# ftvm: the two commands a user needs are `make demo` and `make test`.
# Both install what is missing (as root, from Debian's packages), build,
# and fetch the guest image into the cache (outside the repository).

CARGO ?= cargo
FTVM := target/release/ftvm

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

test: image
	$(CARGO) test --release --workspace

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
