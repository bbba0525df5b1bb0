# Two entry points for a fresh Debian machine: `make run` and `make test`.
# Both create .venv themselves; `make test` also installs the system packages the tests need.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
GATEWAY_STAMP := $(VENV)/.gateway
SYSTEM_PACKAGES := mosquitto mosquitto-clients strace systemd iproute2 nftables openjdk-17-jre-headless prometheus dosfstools mtools fdisk e2fsprogs \
	rauc squashfs-tools openssl u-boot-tools
PYTEST_ARGS ?=

.PHONY: run test test-busy test-spark test-cluster check test-slow venv system-deps bench clean image-tree test-image image-system-deps image test-image-slow

# What an install depends on in the two pyproject.toml files: [build-system], [project] and
# [tool.setuptools]. An edit elsewhere in them (the mypy file list, ruff's rules, pytest's markers) does
# not reinstall the venv: that cost every `make check` after such an edit a minute or two of pip.
INSTALL_INPUTS = $(PYTHON) -c 'import json, sys, tomllib; print(json.dumps([(lambda t: [t.get("build-system"), t.get("project"), t.get("tool", {}).get("setuptools")])(tomllib.load(open(f, "rb"))) for f in sys.argv[1:]], sort_keys=True))' pyproject.toml pipeline/pyproject.toml

# Everything the tests need: the gateway with its extras and the pipeline (its own distribution,
# pipeline/pyproject.toml), both editable.
$(STAMP): pyproject.toml pipeline/pyproject.toml
	@if [ -f $(VENV)/.install-inputs ] && $(INSTALL_INPUTS) | cmp -s - $(VENV)/.install-inputs; then \
	  touch $(STAMP); \
	else \
	  set -e; \
	  $(PYTHON) -m venv $(VENV); \
	  $(BIN)/pip install --quiet --upgrade pip; \
	  $(BIN)/pip install --quiet -e '.[test,firmware,bench]' -e ./pipeline; \
	  $(INSTALL_INPUTS) > $(VENV)/.install-inputs; \
	  touch $(STAMP) $(GATEWAY_STAMP); \
	fi

# `make run`: the gateway alone (no Spark, pyarrow, pandas or matplotlib), unless the full venv is there.
$(GATEWAY_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e .
	touch $(GATEWAY_STAMP)

venv: $(STAMP)

run: $(GATEWAY_STAMP)
	$(BIN)/appliance run

system-deps:
	@missing=""; for p in $(SYSTEM_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing system packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

# The default suite in one parallel run (pytest-xdist): every test not marked for a target of its own
# (`slow`, `image`, `cluster`, `spark`; tests/test_make_targets.py holds each test to one target). It is
# bound by waiting (shaped links, processes starting, keep-alives), not by the cores, so it runs three
# workers per core: with the Spark tests out, four workers on 2 cores used about one core (3:48 and 4:22),
# six 2:53 and 3:47 for the same CPU, and `make test-busy` passed with six (bench/RESULTS-suite.md, session
# 16; where another job holds a core, six were slower). The hil layer runs on two of them, one test at a
# time on each (the rig's own tests; the scenarios, whose bounds are latencies of one scenario at a time on
# the bench they share), started first beside the other layers: `worker_group` and `send_order` in
# conftest.py. With six workers the hil-rig group is the run's tail.
WORKERS ?= $(shell echo $$(( $$(nproc) * 3 )))
# The tests keep their bytecode (and pytest its rewritten test modules) in __pycache__ even where the
# environment says PYTHONDONTWRITEBYTECODE: without it every worker compiled the suite at collection
# (7 s of CPU each instead of 3) and every `appliance run` the tests start compiled the gateway again.
KEEP_BYTECODE := PYTHONDONTWRITEBYTECODE=
# The tests' files (SQLite stores, landing zones, Spark outputs: about 200 MB a run) go to tmpfs where the
# machine has one: every commit the broker, the state store and forwarding make is an fsync, and an fsync
# on this disk costs milliseconds (5.8 ms at load 15) against microseconds on tmpfs, so on disk the
# workers spent much of the suite waiting for the disk rather than testing. What the tests prove does not
# change: they kill processes (kill -9 keeps the page cache either way), not the power; power cuts are the
# image tests' (a whole container or VM), which keep the disk (their roots take gigabytes). A tmpfs with less than 2 GB free is not used. Override with TEST_TMPDIR=...
TEST_TMPDIR ?= $(shell d=/dev/shm/tests-$$(id -u); mkdir -p $$d 2>/dev/null && [ -w $$d ] && [ $$(df --output=avail -k $$d | tail -1) -gt 2000000 ] && echo $$d || echo $${TMPDIR:-/tmp})
ON_TMPFS = TMPDIR=$(TEST_TMPDIR)
test: system-deps $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(KEEP_BYTECODE) $(ON_TMPFS) SPARK_LOCAL_IP=127.0.0.1 $(BIN)/pytest -n $(WORKERS) --dist loadgroup -m "not slow and not image and not cluster and not spark" $(PYTEST_ARGS)

# The same suite beside a CPU hog, one busy process per core, as a shared CI host can be (load ~2x the
# cores above the suite's own): real-time bounds in the suite must hold there too. Slower; not in CI.
test-busy: system-deps $(STAMP)
	$(BIN)/python -m testing.cpu_hog --seconds 1800 & hog=$$!; \
	$(KEEP_BYTECODE) $(ON_TMPFS) SPARK_LOCAL_IP=127.0.0.1 $(BIN)/pytest -n $(WORKERS) --dist loadgroup -m "not slow and not image and not cluster and not spark" $(PYTEST_ARGS); \
	rc=$$?; kill $$hog; exit $$rc

# The Spark tests (marker `spark`, given at collection to every test that takes the `spark` fixture, so a new
# one lands here by itself): the pipeline's jobs on a local Spark session (tests/pipeline/conftest.py), one
# JVM per pytest process, CPU-bound: 130-170 CPU-s, about 40 % of what `make test` cost with them in it.
# Their own step in CI (.ci/run). Two processes, a module to each (`--dist loadfile`; the `spark` worker
# group is for `make test-slow`'s run): 124 and 141 s against 153 and 159 s in one process, alternating
# under load, for 5-30 CPU-s more (a second JVM's start and warm-up, the sample's batch run twice;
# bench/RESULTS-suite.md, session 16). Where the host has one core to give (another job's load), the second
# process buys nothing: 176 s, 185 CPU-s beside a valgrind. The `slow` ones run in `make test-slow`, the cluster test in
# `make test-cluster`.
SPARK_WORKERS ?= 2
test-spark: system-deps $(STAMP)
	$(KEEP_BYTECODE) $(ON_TMPFS) SPARK_LOCAL_IP=127.0.0.1 $(BIN)/pytest -n $(SPARK_WORKERS) --dist loadfile -m "spark and not slow and not cluster" tests/pipeline $(PYTEST_ARGS)

# The batch job submitted to a Spark standalone cluster (tests/pipeline/test_cluster.py, marker `cluster`):
# six JVMs (master, two workers, driver, two executors), about 50 CPU-s, an eighth of `make test`'s CPU
# on a suite that is CPU-bound on 2 cores. It is its own step in CI (.ci/run, after `make test`), so every
# landing still proves the cluster path, and `make test` stays under 4 min on a quiet machine.
test-cluster: system-deps $(STAMP)
	$(KEEP_BYTECODE) $(ON_TMPFS) SPARK_LOCAL_IP=127.0.0.1 $(BIN)/pytest -n 0 -p no:randomly -m cluster tests/pipeline/test_cluster.py $(PYTEST_ARGS)

# The inner loop: the unit layer (no sockets, no processes), in seconds. Only the unit modules are named, so
# the workers do not import the Spark, firmware and HIL modules just to deselect them.
UNIT_MODULES = $(shell $(BIN)/python -c 'import conftest; print(*sorted(conftest.UNIT_MODULES))' 2>/dev/null)
check: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(KEEP_BYTECODE) $(ON_TMPFS) $(BIN)/pytest -n auto -m unit --hypothesis-profile=check $(UNIT_MODULES) $(PYTEST_ARGS)

# What `make test` leaves out: the long property campaigns and stress repetitions.
test-slow: system-deps $(STAMP)
	$(KEEP_BYTECODE) $(ON_TMPFS) SPARK_LOCAL_IP=127.0.0.1 $(BIN)/pytest -n $(WORKERS) --dist loadgroup -m "slow and not image" $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/broker.py

# The gateway wheel and the staged root filesystem the pi-gen stage copies (images/gateway/README.md).
IMAGE_TREE ?= build/image-tree
WHEEL_DIR ?= build/wheels
image-tree: $(STAMP)
	rm -rf $(WHEEL_DIR) build/lib
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir $(WHEEL_DIR) .
	$(BIN)/python images/gateway/build_tree.py --host-venv --wheel $(WHEEL_DIR)/appliance-*.whl --out $(IMAGE_TREE)

clean:
	rm -rf $(VENV) var .pytest_cache

# The gateway's root built from Debian packages as the image is (a Debian base cached under build/image-root/base
# by its package list, the gateway layered on a copy of it and cached by the wheel's digest), booted under systemd-nspawn and checked: tests/images/test_nspawn_boot.py.
# Needs root. Not part of `make test` (tests marked `image`).
IMAGE_SYSTEM_PACKAGES := mmdebstrap systemd-container eatmydata util-linux
image-system-deps:
	@$(MAKE) --no-print-directory system-deps SYSTEM_PACKAGES="$(IMAGE_SYSTEM_PACKAGES)"

test-image: image-system-deps $(STAMP)
	$(KEEP_BYTECODE) $(BIN)/pytest -n 0 -p no:randomly -s -m image tests/images/test_nspawn_boot.py $(PYTEST_ARGS)

# The flashable arm64 A/B image for Raspberry Pi 4/5 (images/gateway/build_image.py): dist/gateway-<version>-arm64.img.zst,
# .sha256, .manifest and the same root as a signed RAUC bundle (.raucb). Needs root; about 20 min of CPU (an hour of wall time) under qemu-user emulation the first
# time for the Debian base, which is cached apart from the gateway's layer (minutes) like the native one.
IMAGE_BUILD_PACKAGES := mmdebstrap arch-test eatmydata qemu-user-static binfmt-support dosfstools mtools e2fsprogs fdisk zstd \
	u-boot-tools rauc squashfs-tools openssl
IMAGE_WHEELS ?= build/image-wheels
image: $(STAMP)
	@$(MAKE) --no-print-directory system-deps SYSTEM_PACKAGES="$(IMAGE_BUILD_PACKAGES)"
	rm -rf $(IMAGE_WHEELS) build/lib
	$(BIN)/pip wheel --quiet --no-deps --wheel-dir $(IMAGE_WHEELS) .
	$(BIN)/python images/gateway/build_image.py --wheel $(IMAGE_WHEELS)/appliance-*.whl

# The arm64 image itself booted under qemu-system-aarch64 -M virt (TCG, no KVM) through U-Boot's A/B boot script:
# tests/images/test_qemu_boot.py (boot, provisioning, MQTT, state store, power cut) and test_qemu_update.py (RAUC
# bundles: install, fallback, power cut during an install, a foreign key). Builds the image first (cached root:
# minutes). One emulated boot takes one to several minutes; not in CI.
IMAGE_QEMU_PACKAGES := qemu-system-arm u-boot-qemu zstd mtools e2fsprogs fdisk
test-image-slow: image
	@$(MAKE) --no-print-directory system-deps SYSTEM_PACKAGES="$(IMAGE_QEMU_PACKAGES)"
	$(KEEP_BYTECODE) $(BIN)/pytest -n 0 -p no:randomly -s -m image tests/images/test_image_contents.py tests/images/test_qemu_boot.py tests/images/test_qemu_update.py $(PYTEST_ARGS)
