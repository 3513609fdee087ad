# weft: convenience targets around CMake.
#
# Each target asks only for what it needs: it first runs tools/deps.sh with
# its level (which installs missing Debian packages as root, or prints the
# apt-get command), then configures build/ with the parts it needs
# (WEFT_BUILD_TESTS, _EXAMPLES, _BENCH; see CMakeLists.txt) and builds it.
# Configure and build are quiet: one line each, the full output in
# build*/configure.log and build*/build.log, printed if they fail (V=1
# prints everything).
#
#   make [all]      the library and the examples in build/ (Release); needs
#                   only a C compiler, cmake, pkg-config and liburing-dev
#   make install [PREFIX=/usr/local] [DESTDIR=]  build, then install the
#                   library, header, weft.pc and CMake package
#   make demo       build the examples, benchmarks and their Asio peers
#                   (deps: g++, libasio-dev), then run tools/demo.sh: the
#                   failures weft exists to avoid, each beside the runtime
#                   that fails it, in about a minute
#   make test       build and ctest three configurations: build/ (gcc,
#                   Release), build-asan/ (clang, ASan+UBSan, Debug),
#                   build-tsan/ (gcc, TSan, RelWithDebInfo); the tests and
#                   examples only (deps: cmocka, clang, python3)
#   make test-release | test-asan | test-tsan    one of them
#   make model      the model tests' long exploration: build/ as make
#                   test-release builds it, then each lock-free part under
#                   MODEL_RUNS random and PCT schedules and every schedule
#                   with at most MODEL_DFS preemptions (up to MODEL_DFS_MAX),
#                   and each broken variant caught (tests/model/)
#   make bench      build the benchmarks and peers, then run every benchmark
#                   in build/bench/ (deps: everything, tools/deps.sh bench)
#   make bench-net  the same build, then run bench/net: HTTP servers and a
#                   TCP proxy under wrk against nginx, Asio, libuv and
#                   HAProxy
#   make bench-report  the same build, then tools/bench-report: every
#                   benchmark in 5 alternating rounds, their medians and
#                   plots written into BENCHMARKS.md and docs/img/ (deps:
#                   the above, python3-matplotlib and valgrind)
#   make reference  write docs/reference.md from include/weft.h (and the
#                   headers it includes)
#                   (tools/gen-reference; a test checks it is current)
#   make format | format-check                   clang-format the sources
#   make clean      remove the build directories
#
# build/ is shared: each target configures it with its own parts, so the
# parts of an earlier target may no longer be built (their files stay).
#
# Variables: JOBS (build parallelism, default nproc), V=1 (show configure
# and build output), CTEST_JOBS (tests run at once, default JOBS; most of
# a test's time is spent waiting, and tests assert behaviour, not speed),
# CTEST_TIMEOUT (seconds per test, default 300),
# CTEST_ARGS (more ctest arguments, e.g. -R strand), BENCH_SKIP (shell
# patterns of build/bench/ programs not to run), BENCH_NET_ARGS (bench/net
# options, e.g. --seconds 10 --connections 100), BENCH_REPORT_ARGS
# (tools/bench-report options, e.g. --rounds 7 --only post,net).

.NOTPARALLEL:
.DEFAULT_GOAL := all
MAKEFLAGS += --no-print-directory
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c

CMAKE ?= cmake
CTEST ?= ctest
CLANG_FORMAT ?= clang-format
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
PREFIX ?= /usr/local
CTEST_TIMEOUT ?= 300
CTEST_JOBS ?= $(JOBS)
CTEST_ARGS ?=
BENCH_SKIP ?= *helper* _*
BENCH_NET_ARGS ?=
BENCH_REPORT_ARGS ?=
MODEL_RUNS ?= 100000
MODEL_DFS ?= 3
MODEL_DFS_MAX ?= 5000000

WEFT_ASAN_OPTIONS ?= detect_leaks=1:halt_on_error=1:abort_on_error=0
WEFT_UBSAN_OPTIONS ?= halt_on_error=1:print_stacktrace=1
WEFT_TSAN_OPTIONS ?= halt_on_error=1:second_deadlock_stack=1

FORMAT_DIRS := $(wildcard src include tests bench examples)
FORMAT_FILES = $(shell find $(FORMAT_DIRS) -type f \
                 \( -name '*.c' -o -name '*.h' -o -name '*.cpp' \) | sort)

# $(call configure,DIR,CC,CXX,CMAKE ARGS): configure and build DIR quietly.
configure = CMAKE='$(CMAKE)' JOBS='$(JOBS)' VERBOSE='$(V)' \
  sh tools/build.sh $(1) $(2) $(3) $(4)
CTEST_RUN = $(CTEST) --output-on-failure --timeout $(CTEST_TIMEOUT) \
  -j $(CTEST_JOBS) $(CTEST_ARGS)

# The parts of the build each target needs (CMakeLists.txt).
LIB_PARTS := -DWEFT_BUILD_TESTS=OFF -DWEFT_BUILD_EXAMPLES=ON \
             -DWEFT_BUILD_BENCH=OFF
TEST_PARTS := -DWEFT_BUILD_TESTS=ON -DWEFT_BUILD_EXAMPLES=ON \
              -DWEFT_BUILD_BENCH=OFF
BENCH_PARTS := -DWEFT_BUILD_TESTS=OFF -DWEFT_BUILD_EXAMPLES=ON \
               -DWEFT_BUILD_BENCH=ON

RELEASE_ARGS := -DCMAKE_BUILD_TYPE=Release -DWEFT_SANITIZE= -DWEFT_TEST_SCALE=1
ASAN_ARGS := -DCMAKE_BUILD_TYPE=Debug -DWEFT_SANITIZE=address \
             -DWEFT_TEST_SCALE=8
TSAN_ARGS := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWEFT_SANITIZE=thread \
             -DWEFT_TEST_SCALE=16

.PHONY: all deps build build-bench demo test test-release test-asan \
        test-tsan model bench bench-net bench-report reference format \
        format-check install clean

all: build

deps:
	@sh tools/deps.sh

build: deps
	@$(call configure,build,gcc,g++,$(RELEASE_ARGS) $(LIB_PARTS))

# The benchmarks and peers (make demo, bench, bench-net); deps.sh runs first.
build-bench:
	@$(call configure,build,gcc,g++,$(RELEASE_ARGS) $(BENCH_PARTS))

demo:
	@sh tools/deps.sh demo
	@$(MAKE) build-bench
	@sh tools/demo.sh build

test: test-release test-asan test-tsan
	@echo "==== weft: all three test configurations passed ===="

test-release:
	@sh tools/deps.sh test
	@echo "==== weft test [1/3]: build/ gcc Release, WEFT_TEST_SCALE=1 ===="
	@$(call configure,build,gcc,g++,$(RELEASE_ARGS) $(TEST_PARTS))
	cd build && $(CTEST_RUN)

# clang if present (then gcc and clang both build weft with -Werror).
test-asan:
	@sh tools/deps.sh test
	@cc=gcc; cxx=g++; \
	if command -v clang >/dev/null && command -v clang++ >/dev/null; then \
	  cc=clang; cxx=clang++; fi; \
	echo "==== weft test [2/3]: build-asan/ $$cc Debug ASan+UBSan," \
	  "WEFT_TEST_SCALE=8 ===="; \
	$(call configure,build-asan,$$cc,$$cxx,$(ASAN_ARGS) $(TEST_PARTS)); \
	echo "+ cd build-asan && ctest"; \
	cd build-asan && ASAN_OPTIONS=$(WEFT_ASAN_OPTIONS) \
	  UBSAN_OPTIONS=$(WEFT_UBSAN_OPTIONS) \
	  ../tools/san-exec.sh address $$cc $(CTEST_RUN)

test-tsan:
	@sh tools/deps.sh test
	@echo "==== weft test [3/3]: build-tsan/ gcc RelWithDebInfo TSan," \
	  "WEFT_TEST_SCALE=16 ===="
	@$(call configure,build-tsan,gcc,g++,$(TSAN_ARGS) $(TEST_PARTS))
	cd build-tsan && TSAN_OPTIONS=$(WEFT_TSAN_OPTIONS) \
	  ../tools/san-exec.sh thread gcc $(CTEST_RUN)

model:
	@sh tools/deps.sh test
	@$(call configure,build,gcc,g++,$(RELEASE_ARGS) $(TEST_PARTS))
	@set -e; for t in build/tests/model/test_model_*; do \
	  [ -f "$$t" ] && [ -x "$$t" ] || continue; echo "+ $$t"; \
	  "$$t" --runs=$(MODEL_RUNS) --dfs=$(MODEL_DFS) \
	    --dfs-max=$(MODEL_DFS_MAX); \
	done
	cd build && $(CTEST) --output-on-failure -R '^model_'

bench:
	@sh tools/deps.sh bench
	@$(MAKE) build-bench
	@skip_pats='$(BENCH_SKIP)'; fail=0; ran=0; \
	for b in build/bench/*; do \
	  [ -f "$$b" ] && [ -x "$$b" ] || continue; \
	  name=$${b##*/}; skip=0; \
	  set -f; \
	  for pat in $$skip_pats; do \
	    case $$name in $$pat) skip=1 ;; esac; \
	  done; \
	  set +f; \
	  [ $$skip = 0 ] || continue; \
	  echo "==== bench: $$name ===="; ran=$$((ran + 1)); \
	  "$$b" || { echo "bench: $$name failed (status $$?)" >&2; fail=1; }; \
	done; \
	[ $$ran -gt 0 ] || { echo "bench: no programs in build/bench/" >&2; exit 1; }; \
	exit $$fail

bench-net:
	@sh tools/deps.sh bench
	@$(MAKE) build-bench
	./bench/net --build build $(BENCH_NET_ARGS)

bench-report:
	@sh tools/deps.sh report
	@$(MAKE) build-bench
	./tools/bench-report --build build $(BENCH_REPORT_ARGS)

reference:
	sh tools/gen-reference include/weft.h > docs/reference.md

format:
	@command -v $(CLANG_FORMAT) >/dev/null || \
	  { echo "$(CLANG_FORMAT) not found (apt-get install clang-format)" >&2; exit 1; }
	$(CLANG_FORMAT) -i $(FORMAT_FILES)

format-check:
	@command -v $(CLANG_FORMAT) >/dev/null || \
	  { echo "$(CLANG_FORMAT) not found (apt-get install clang-format)" >&2; exit 1; }
	$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_FILES)

install: build
	DESTDIR="$(DESTDIR)" $(CMAKE) --install build --prefix "$(PREFIX)"

clean:
	rm -rf build build-asan build-tsan
