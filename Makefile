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
	$(FTVM) run --exec 'uname -srm; head -n1 /etc/os-release; \
	  echo "sha256 of /etc/hostname: $$(sha256sum /etc/hostname)"; \
	  awk "BEGIN { printf \"pi ~ %.6f\n\", atan2(0, -1) }"; \
	  redis-server --daemonize yes --save "" >/dev/null && sleep 1 && \
	  redis-cli set greeting "hello from ftvm" >/dev/null && redis-cli get greeting'

test: image
	$(CARGO) test --release --workspace

bench: image
	bench/vs-qemu

clean:
	$(CARGO) clean
