# tierkv: the two commands a newcomer needs.
#   make run   - install what is missing, build, start a cluster
#   make test  - install what is missing, build, run every suite (+ sanitizers)
BUILD ?= build
SAN_BUILD ?= build-san
TSAN_BUILD ?= build-tsan
# The runtime's multi-threaded tests, run under ThreadSanitizer by make test.
TSAN_TARGETS = tests/unit/transport/transport_inproc_test \
    tests/unit/transport/transport_tcp_test tests/unit/store/store_contract_test \
    tests/unit/node/node_test tests/unit/node/node_client_test \
    tests/unit/gateway/gateway_test tests/unit/kv/kv_test
MESON_FLAGS ?= --werror

.PHONY: all deps build build-san build-tsan run sim test test-fast chaos clean

all: build

deps:
	@bash scripts/deps.sh

$(BUILD)/build.ninja:
	meson setup $(BUILD) $(MESON_FLAGS)

$(SAN_BUILD)/build.ninja:
	meson setup $(SAN_BUILD) $(MESON_FLAGS) -Db_sanitize=address,undefined \
	    -Db_lundef=false -Dbuildtype=debug

build: deps $(BUILD)/build.ninja
	ninja -C $(BUILD)

build-san: deps $(SAN_BUILD)/build.ninja
	ninja -C $(SAN_BUILD)

$(TSAN_BUILD)/build.ninja:
	meson setup $(TSAN_BUILD) $(MESON_FLAGS) -Db_sanitize=thread -Db_lundef=false \
	    -Dbuildtype=debugoptimized

build-tsan: deps $(TSAN_BUILD)/build.ninja
	ninja -C $(TSAN_BUILD) $(TSAN_TARGETS)

# Three tierkvd processes on 127.0.0.1 (fs store under ./data/); Ctrl-C stops
# them. `make sim` shows the simulated cluster's trace instead.
run: build
	@bash scripts/run-cluster.sh $(BUILD)

sim: build
	./$(BUILD)/tests/sim/raft-sim --demo

test: build build-san build-tsan
	@bash scripts/test.sh $(BUILD) $(SAN_BUILD) $(TSAN_BUILD)

# Only the normal build, for quick iteration.
test-fast: build
	meson test -C $(BUILD) --print-errorlogs

# The longer fault matrix (about 35 minutes): every fault, 60 s, two seeds.
chaos: build
	python3 tests/chaos/matrix --binary $(BUILD)/cmd/tierkvd/tierkvd \
	    --faultfs $(BUILD)/tests/chaos/libtkfaultfs.so --seconds 60 --seeds 1,2

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD)
