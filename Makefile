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
	@echo '== ftvm: booting the Debian riscv64 guest and running a showcase inside it =='
	$(FTVM) run --exec 'uname -srm; echo "hostname: $$(cat /etc/hostname), $$(nproc) cpu(s), $$(free -m | awk "/Mem/ {print \$$2}") MiB"; \
	  echo "sha256 of /etc/hostname: $$(sha256sum /etc/hostname)"; \
	  awk "BEGIN { s = 0; for (i = 1; i <= 1000; i++) s += 1/i; printf \"sum of 1/i, i = 1..1000: %.12f\n\", s }"; \
	  redis-server --daemonize yes --save "" >/dev/null && sleep 1 && \
	  redis-cli set greeting "hello from ftvm" >/dev/null && echo "redis says: $$(redis-cli get greeting)"'

test: image
	$(CARGO) test --release --workspace

bench: image
	bench/vs-qemu
	bench/redis
	bench/dirty-tracking
	bench/record-replay
	bench/record-overhead

clean:
	$(CARGO) clean
