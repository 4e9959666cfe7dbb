# heapwalk: everything a fresh Debian machine needs, from two commands:
#   make demo   build a multi-threaded reproducer, capture its core, print heapwalk's view of it
#   make test   the test suite (reproducer cores are captured on the way)

SHELL := /bin/bash
# chromium: the tests open the HTML report in a real browser (headless)
# debootstrap: the chroots of other Debian suites' gdb and Python (cores/scripts/chroots.py)
# cmake: mimalloc's releases built from the sources crates and PyPI sdists bundle (cores/scripts/mibuilds.py)
# qemu-system-x86: Debian's kernel in a machine, for the capture's pre-copy where this one lacks soft-dirty (cores/scripts/vm.py)
# gcc-aarch64-linux-gnu, libc6-dev-arm64-cross (its C library headers, only recommended by it), qemu-user,
# gdb-multiarch: the reproducers built for arm64, run on Debian's arm64 glibc
# under qemu-user, their cores read by gdb-multiarch (cores/scripts/foreign.py); qemu-system-arm: Debian's arm64
# kernel in a machine, for the capture and the live attach on arm64 (cores/scripts/armvm.py)
DEB_PACKAGES := gdb gcc make libc6-dbg libc6-dev python3 python3-venv util-linux debian-archive-keyring \
  libjemalloc2 libtcmalloc-minimal4 chromium debootstrap cmake qemu-system-x86 \
  gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user gdb-multiarch qemu-system-arm
# gdb embeds the system Python: the virtualenv is made with that interpreter, so
# gdbinit can put its site-packages on gdb's sys.path.
SYSTEM_PYTHON := /usr/bin/python3
VENV := .venv
PY := $(VENV)/bin/python
BUILD := build
# build/ is a link into the cache: the programs and cores a clone's sources make are found by the next clone,
# and made again only when what they are made from changed (cores/scripts/fresh.py)
CACHE := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/heapwalk
$(shell [ -e $(BUILD) ] || { mkdir -p $(CACHE)/build && ln -s $(CACHE)/build $(BUILD); })
CORES := $(BUILD)/cores
SYSROOTS := $(BUILD)/sysroots
# Debian suites whose glibc the tests also run under (see cores/scripts/sysroots.py)
SUITES := bullseye trixie sid
# Debian suites whose gdb and Python heapwalk is run with, each in a chroot (see cores/scripts/chroots.py)
CHROOT_SUITES := bullseye trixie sid
# Debian suites whose libjemalloc2 the jemalloc reproducers run on (5.2.1, 5.3.0, 5.3.1: sid's runs on sid's glibc;
# see cores/scripts/sysroots.py)
JEMALLOC_SUITES := bullseye bookworm sid
# the same jemallocs linked into the program (their libjemalloc-dev archive), the program stripped
JEMALLOC_LINKED := $(addsuffix -linked,bullseye bookworm)
# jemallocs built from Debian's sources as programs that bring their own configure them (see cores/scripts/jebuilds.py)
# Debian's gperftools tcmalloc builds the tcmalloc reproducer runs on (2.8.1, 2.10, 2.16, 2.18.1, the full
# build, the minimal archive linked in), and a Rust program on Google's tcmalloc (see cores/scripts/tcbuilds.py)
TCMALLOC_BUILDS := bullseye bookworm trixie sid bookworm-full bookworm-linked google
# Debian's mimalloc of each suite the mimalloc reproducer runs on (2.0.9, 3.0.1, and sid's 3.6.0),
# releases other distributions and the Rust crates ship, built from the sources registry packages bundle (crates,
# PyPI sdists), releases linked into the program, and a Rust program on the mimalloc crate (3.3.2; 2.3.2 with its
# v2 feature) (see cores/scripts/mibuilds.py)
MIMALLOC_BUILDS := bookworm trixie sid 2.0.6 2.0.7 2.1.2 2.3.2 3.3.2 3.4.3 3.6.0 2.1.2-linked 2.3.2-linked \
                   3.1.5-linked 3.3.2-linked rust rust-v2 2.1.4 2.1.7 2.1.9 2.2.4 2.3.1 3.1.5 3.2.8 3.3.0
JEMALLOC_BUILT := 5.3.0-je 5.1.0 5.1.0-debug 5.3.0-q32 5.3.1 5.3.0-debug 5.3.0-debug-O0 5.2.1-debug 5.3.0-q8-debug 5.3.0-nostats redis-5.2.1 5.3.0-noietls 5.3.0-q8 5.3.0-vaddr57 redis-5.2.1-vaddr57
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
PYTEST_ARGS ?=

.PHONY: all deps venv bytecode sysroots chroots vm cores setup demo test unit fuzz bench docs clean distclean

all: test

# Debian packages, installed only when missing (checked again whenever this Makefile changes).
deps: $(BUILD)/.deps
$(BUILD)/.deps: Makefile
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	mkdir -p $(BUILD); \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing (apt's output in $(BUILD)/apt.log)"; \
	  { $(SUDO) apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq --no-install-recommends $$missing; \
	  } > $(BUILD)/apt.log 2>&1 || { cat $(BUILD)/apt.log; exit 1; }; \
	fi
	@touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml setup.py heapwalk/glibc/bulk/_native.c heapwalk/jemalloc/_native.c \
		heapwalk/inferior/_slots.c heapwalk/analysis/_reach.c | $(BUILD)/.deps
	@echo "making the virtualenv $(VENV) (pip's output in $(BUILD)/pip.log)"
	@$(SYSTEM_PYTHON) -m venv $(VENV)
	@mkdir -p $(BUILD) && : > $(BUILD)/pip.log
	@$(PY) -m pip install -q --upgrade pip >> $(BUILD)/pip.log 2>&1 || { cat $(BUILD)/pip.log; exit 1; }
	@$(PY) -m pip install -q -e '.[test]' >> $(BUILD)/pip.log 2>&1 || { cat $(BUILD)/pip.log; exit 1; }
	@touch $@

# Each module compiled once, beside its source: every gdb a test starts loads heapwalk, and a shell that sets
# PYTHONDONTWRITEBYTECODE (as CI's does) would otherwise compile all of it in each one (1.5 s rather than 0.7).
bytecode: venv
	@$(PY) -m compileall -q -j0 heapwalk tests cores > /dev/null

# Debian's libc6/libc6-dbg of each suite, libjemalloc2 of the jemalloc suites, tcmalloc's and mimalloc's builds,
# downloaded once (cached in ~/.cache/heapwalk) and unpacked.
sysroots: venv
	$(PY) cores/scripts/sysroots.py $(SYSROOTS) $(SUITES)
	$(PY) cores/scripts/sysroots.py $(SYSROOTS) --jemalloc $(JEMALLOC_SUITES) $(JEMALLOC_LINKED)
	$(PY) cores/scripts/jebuilds.py $(SYSROOTS) $(JEMALLOC_BUILT) redis rust
	$(PY) cores/scripts/tcbuilds.py $(SYSROOTS) $(TCMALLOC_BUILDS)
	$(PY) cores/scripts/mibuilds.py $(SYSROOTS) $(MIMALLOC_BUILDS)
	$(PY) cores/scripts/foreign.py $(CORES)/arm64 --roots $(SYSROOTS) --bindir $(BUILD)/bin

# A chroot of each of CHROOT_SUITES with its gdb, Python and gcc, made once (cached in ~/.cache/heapwalk/chroots).
chroots: venv
	$(PY) cores/scripts/chroots.py $(CHROOT_SUITES)

# Debian bookworm's kernel and a small initramfs, for a machine that tracks soft-dirty pages, and its arm64
# kernel with a root of its arm64 gdb and Python, for the capture and the live attach on arm64 (cached).
vm: venv
	$(PY) cores/scripts/vm.py --prepare
	$(PY) cores/scripts/armvm.py --prepare

# Every reproducer's core under the system glibc and under each sysroot's.
cores: sysroots
	$(PY) cores/scripts/harness.py $(CORES)/system --bindir $(BUILD)/bin
	@for s in $(SUITES); do $(PY) cores/scripts/harness.py $(CORES)/$$s --bindir $(BUILD)/bin --glibc $$s || exit 1; done
	@for s in $(JEMALLOC_SUITES) $(JEMALLOC_LINKED) $(JEMALLOC_BUILT); do $(PY) cores/scripts/harness.py $(CORES)/jemalloc-$$s --bindir $(BUILD)/bin --jemalloc $$s || exit 1; done

demo: venv bytecode
	@$(PY) cores/scripts/harness.py $(BUILD)/demo --bindir $(BUILD)/bin thread_arenas
	@echo
	@echo "== gdb -batch -x gdbinit -ex 'heapwalk report --html $(BUILD)/demo/report.html' -ex 'heapwalk map' -ex 'heapwalk tcache --thread 2' EXE CORE"
	@gdb -nx -batch -q -x gdbinit -ex 'heapwalk report --html $(BUILD)/demo/report.html' -ex 'heapwalk map' \
	  -ex 'heapwalk tcache --thread 2' \
	  $(BUILD)/bin/thread_arenas $(BUILD)/demo/thread_arenas/core 2>&1 | grep -v -e '^\[New LWP' -e '^\[Thread debugging' -e '^Using host libthread_db'
	@echo
	@echo "== the report as one page, maps and charts inline, to open in a browser or attach to a ticket:"
	@echo "   $(abspath $(BUILD)/demo/report.html)"

# The whole suite: unit tests, reproducer cores against malloc_info and ledgers, live attach, and heapwalk
# run with the gdb and Python of each chroot; in one shard per core side by side (TEST_JOBS), then the timing
# tests, and the one that hides a sysroot for a moment, alone (tests/tools/parallel.py).  Its set-up runs two at a
# time: the chroots and the VM's kernel (mostly the network and the disk) beside the builds and the cores (the
# processor); each keeps its own apt lists.
test: venv
	@$(MAKE) --no-print-directory -j2 --output-sync=line setup
	$(PY) tests/tools/parallel.py -q --durations=15 $(PYTEST_ARGS)

setup: cores chroots vm bytecode

# Mutation fuzzing on every reproducer core of every glibc (make test runs a smaller share of it).
# FUZZ_ARGS: e.g. --count 1000 --seed 7
FUZZ_ARGS ?=
fuzz: cores bytecode
	$(PY) tests/tools/fuzz.py $(FUZZ_ARGS)

# The benchmark: heapwalk's commands timed on cores of cores/glibc/bench.c, cores/jemalloc/je_bench.c and
# cores/common/bench_preload.c on tcmalloc and mimalloc (BENCH_SIZE: small, medium, large, huge).  Prints a table,
# writes build/bench/bench-SIZE.json, its size's part of docs/performance.md (the machine, the date, the commit, the
# method) and the growth plot beside it; never fails on a slow machine.
BENCH_SIZE ?= large
BENCH_ARGS ?=
bench: venv bytecode
	$(PY) tests/tools/bench.py --size $(BENCH_SIZE) --docs docs/performance.md $(BENCH_ARGS)

# docs/commands.md, from the code's own help (make test fails when it is out of date).
docs: venv
	$(PY) tests/tools/commands_doc.py

# The tier that needs neither gdb, nor cores, nor the network: what plain `pytest` runs (pyproject's addopts).
unit: venv
	$(PY) -m pytest -q

# clean: the link to the cache's build folder and what it holds
clean:
	@if [ -L $(BUILD) ]; then rm -rf "$$(readlink -f $(BUILD))"; fi
	rm -rf $(BUILD)

distclean: clean
	rm -rf $(VENV) *.egg-info
