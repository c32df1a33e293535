# llm-tools: one engine archive (build/*/libllm.a), thin tools (bin/llm-*).
#
#   make demo         dependencies, build, then the toolchain's chain on a small model
#   make test         dependencies, build, then the whole suite (TAP, ends "N passed, N failed, N skipped")
#   make              build the library and the tools (CUDA when nvcc is found)
#   make CUDA=0       CPU-only build
#   make deps         install the missing Debian packages and the npm test clients
#   make asan         the suite under AddressSanitizer + UBSan (separate build tree)
#   make fuzz         build the libFuzzer harnesses (clang)
#   make install PREFIX=/usr/local    tools and man pages
#   make clean
#
# Builds run in parallel (one job per core) unless -j is given. Each
# configuration has its own tree, build/cpu or build/cuda, so switching
# between CUDA=0 and CUDA=1 never rebuilds the other; bin/ is a link to the
# tools of the configuration built last.

# one job per core; a -j on the command line wins (make -j1 serialises);
# the makes this one runs share its job slots
ifeq ($(MAKELEVEL),0)
MAKEFLAGS += -j$(shell nproc 2>/dev/null || echo 2)
endif

PREFIX   ?= /usr/local
MANDIR   ?= $(PREFIX)/share/man
CC       ?= cc
CFLAGS   ?= -O2 -g
# mandatory flags are appended even when CFLAGS is given on the command line
# (make asan, make fuzz); -iquote keeps common/ out of <...> lookups. The
# engine's headers are included by name (#include "ckpt.h"): each layer's
# folder is on the quote path, and tests/cli/layers.sh checks that a file
# includes only its own folder and the folders below it (common/README)
LAYERS   := base text checkpoint engine train serve jobs
IQUOTE   := -iquote common $(LAYERS:%=-iquote common/%)
override CFLAGS += -std=c11 -Wall -Wextra -pthread -MMD -MP $(IQUOTE) -iquote tests/lib
override LDFLAGS += -pthread
LDLIBS   += -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lm
LDLIBS   += -lcurl
NVCC     ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
# make CUDA=0 forces a CPU-only build (no comment after a value: make keeps the spaces)
CUDA     ?= $(if $(NVCC),1,0)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
# the build tree of this configuration; bin/ links to its tools
B        ?= build/$(if $(filter 1,$(CUDA)),cuda,cpu)
BIN      ?= $(B)/bin
# make CUDA_SM=90 builds for that one architecture (bench/gpu.sh passes the device's)
ifneq ($(CUDA_SM),)
CUDA_ARCH ?= -gencode arch=compute_$(CUDA_SM),code=sm_$(CUDA_SM)
endif
CUDA_ARCH ?= -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
# nvcc has no -iquote: kernels/ include common/ headers by relative path
NVCCFLAGS ?= -O3 -std=c++17 -Xcompiler -Wall,-Wextra

TOOLS     = llm-quantize llm-repartition llm-generate llm-serve llm-finetune llm-bench
LIB_SRC   = $(wildcard $(LAYERS:%=common/%/*.c))
CU_SRC    = $(if $(filter 1,$(CUDA)),$(wildcard kernels/*.cu))
CUC_SRC   = $(if $(filter 1,$(CUDA)),$(wildcard kernels/*.c))
LIB_OBJ   = $(LIB_SRC:%.c=$(B)/%.o)
# the CUDA backend: a shared library of its own, loaded by the programs when
# asked for (common/engine/backend.c), so that the CPU backend never maps cuBLAS
CUDA_OBJ  = $(CUC_SRC:%.c=$(B)/%.o) $(CU_SRC:%.cu=$(B)/%.cu.o)
CUDA_SO   = $(if $(filter 1,$(CUDA)),$(B)/lib/libllm_cuda.so)
TOOL_BINS = $(patsubst tools/%.c,$(BIN)/%,$(wildcard tools/llm-*.c))
TEST_SRC  = $(wildcard tests/test_*.c)
TEST_BINS = $(TEST_SRC:tests/%.c=$(B)/tests/%)
# the libFuzzer harnesses, each linked with tests/lib/fuzz_replay.c: their
# kept corpora run in make test (tests/cli/fuzz.sh)
FUZZ_BINS = $(patsubst tests/fuzz/%.c,$(B)/tests/fuzz/%,$(wildcard tests/fuzz/*.c))
# the GPU bench drivers bench/gpu.sh runs (the tile sweep, the bandwidth probe): CUDA builds only
BENCH_BINS = $(if $(filter 1,$(CUDA)),$(B)/bench/gemm_sweep $(B)/bench/gpu_bandwidth)
# CPU bench programs, built with everything: one draw of the host sampler
CPU_BENCH_BINS = $(B)/bench/sampler_bench $(B)/bench/matmul_bench

ifeq ($(CUDA),1)
override CFLAGS += -DLLM_CUDA -I$(CUDA_HOME)/include
NVCCFLAGS += -DLLM_CUDA
# what libllm_cuda.so links, and the programs that call into it directly
CUDA_LIBS = -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart -lcublas -lstdc++
# every program exports the functions the library takes from it
LDLIBS   += -ldl -Wl,--dynamic-list=kernels/imports.list
endif
$(info cuda: $(if $(filter 1,$(CUDA)),yes ($(NVCC)),no))

# NCCL (the CUDA toolkit's, or Debian's libnccl-dev) in CUDA builds: the
# communicator of GPU ranks, common/engine/comm_nccl.c (-DLLM_NCCL); make NCCL=0
# leaves it out.
ifeq ($(CUDA),1)
NCCL_H   ?= $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h))
NCCL     ?= $(if $(NCCL_H),1,0)
else
NCCL     := 0
endif
ifeq ($(NCCL),1)
override CFLAGS += -DLLM_NCCL
# comm_nccl.c goes into libllm_cuda.so (the backend's comm_open), so only
# a program that loads the CUDA backend loads NCCL and the CUDA runtime
LIB_SRC  := $(filter-out common/engine/comm_nccl.c,$(LIB_SRC))
CUDA_OBJ += $(B)/common/engine/comm_nccl.o
CUDA_LIBS += -lnccl
endif
$(info nccl: $(if $(filter 1,$(NCCL)),yes ($(NCCL_H)),no))

# MPI (OpenMPI from Debian: libopenmpi-dev) when mpicc is found; make MPI=0
# builds the single-process communication layer only. The flags come from
# the wrapper itself, so no MPI path is hard-coded.
MPICC    ?= $(shell command -v mpicc 2>/dev/null)
MPI      ?= $(if $(MPICC),1,0)
ifeq ($(MPI),1)
MPI_CFLAGS := $(shell $(MPICC) --showme:compile)
MPI_LIBS   := $(shell $(MPICC) --showme:link)
override CFLAGS += -DLLM_MPI
LDLIBS   += $(MPI_LIBS)
$(B)/common/engine/comm_mpi.o: CFLAGS += $(MPI_CFLAGS)
endif
$(info mpi: $(if $(filter 1,$(MPI)),yes ($(MPICC)),no))

all: $(TOOL_BINS) $(TEST_BINS) $(FUZZ_BINS) $(BENCH_BINS) $(CPU_BENCH_BINS) $(B)/tests/mpi_check

# bin/ follows the default trees only (make asan and make fuzz name their own)
ifeq ($(origin B),file)
all: bin-link
endif
bin-link: $(TOOL_BINS)
	@if [ -d bin ] && [ ! -L bin ]; then rm -rf bin; fi
	@[ "$$(readlink bin 2>/dev/null)" = "$(B)/bin" ] || { ln -sfn $(B)/bin bin && echo "bin -> $(B)/bin"; }

# Changed flags force a rebuild: objects depend on a file holding them
# (CUDA builds: with the kernels' -fPIC of the shared library, and
# comm_nccl.c's where it joins them).
FLAGS_LINE = $(CC) $(CFLAGS) $(NVCCFLAGS) $(CUDA) $(CUDA_ARCH)$(if $(CUDA_SO), kernels -fPIC)$(if $(filter 1,$(NCCL)), comm_nccl -fPIC)
$(B)/flags: FORCE
	@mkdir -p $(B)
	@echo '$(FLAGS_LINE)' | cmp -s - $@ || echo '$(FLAGS_LINE)' > $@

$(B)/%.o: %.c $(B)/flags
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(B)/%.cu.o: %.cu $(B)/flags
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) $(CUDA_ARCH) -c -o $@ $<

$(B)/libllm.a: $(LIB_OBJ)
	@rm -f $@
	$(AR) rcs $@ $^

# position-independent, for the shared library
$(CUDA_OBJ): CFLAGS += -fPIC
$(CUDA_OBJ): NVCCFLAGS += -Xcompiler -fPIC
$(B)/lib/libllm_cuda.so: $(CUDA_OBJ)
	@mkdir -p $(dir $@)
	$(CC) -shared $(LDFLAGS) -Wl,-soname,libllm_cuda.so -o $@ $^ $(CUDA_LIBS)

# the tools load libllm_cuda.so at run time: built with them, not linked
$(BIN)/%: $(B)/tools/%.o $(B)/libllm.a | $(CUDA_SO)
	@mkdir -p $(BIN)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/tests/%: $(B)/tests/%.o $(B)/tests/lib/check.o $(B)/libllm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/tests/fuzz/%: $(B)/tests/fuzz/%.o $(B)/tests/lib/fuzz_replay.o $(B)/libllm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(B)/bench/%: $(B)/bench/%.o $(B)/libllm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# the programs that call the CUDA backend's own functions link it (found
# through $ORIGIN/../lib; named before libllm.a, which then supplies what
# it imports) and the CUDA runtime
ifeq ($(CUDA),1)
$(B)/tests/test_cuda: $(B)/tests/test_cuda.o $(B)/tests/lib/check.o $(CUDA_SO) $(B)/libllm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS) -Wl,-rpath,'$$ORIGIN/../lib'
$(BENCH_BINS): $(B)/bench/%: $(B)/bench/%.o $(CUDA_SO) $(B)/libllm.a
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS) $(CUDA_LIBS) -Wl,-rpath,'$$ORIGIN/../lib'
endif

# The missing Debian packages (apt-get as root, or through sudo) and the npm
# clients tests/cli/serve_openai.sh and serve_clients.sh drive; quick when
# everything is there.
deps:
	@tools/deps.sh

# The dependencies first, then the build (nothing is rebuilt that make
# built), then the suite.
test: deps
	@$(MAKE) --no-print-directory all
	LLM_BIN=$(abspath $(BIN)) LLM_TESTBIN=$(abspath $(B)/tests) tests/run

# The toolchain's chain on the small real model beside the project (or a
# random checkpoint when it is absent): quantize, generate, serve, one request.
demo: deps
	@$(MAKE) --no-print-directory all
	@LLM_BIN=$(abspath $(BIN)) tools/demo.sh

# The suite under AddressSanitizer + UndefinedBehaviorSanitizer, CPU only.
asan:
	$(MAKE) B=build/asan BIN=build/asan/bin CUDA=0 \
	  CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined" \
	  LDFLAGS="-fsanitize=address,undefined" test

# libFuzzer harnesses (tests/fuzz/*.c), built with clang.
fuzz:
	$(MAKE) B=build/fuzz BIN=build/fuzz/bin CUDA=0 CC=clang \
	  CFLAGS="-O1 -g -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined" build/fuzz/libllm.a
	@for f in tests/fuzz/*.c; do n=$$(basename $$f .c); \
	  echo "clang $$f -> build/fuzz/$$n"; \
	  clang -std=c11 -O1 -g $(IQUOTE) -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -o build/fuzz/$$n $$f build/fuzz/libllm.a $(LDLIBS) || exit 1; done

install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man5
	install -m 755 $(TOOL_BINS) $(DESTDIR)$(PREFIX)/bin
	install -m 644 $(wildcard man/*.1) $(DESTDIR)$(MANDIR)/man1
	install -m 644 $(wildcard man/*.5) $(DESTDIR)$(MANDIR)/man5
	$(if $(CUDA_SO),install -d $(DESTDIR)$(PREFIX)/lib && install -m 755 $(CUDA_SO) $(DESTDIR)$(PREFIX)/lib)

uninstall:
	rm -f $(TOOLS:%=$(DESTDIR)$(PREFIX)/bin/%) $(DESTDIR)$(PREFIX)/lib/libllm_cuda.so $(TOOLS:%=$(DESTDIR)$(MANDIR)/man1/%.1) $(DESTDIR)$(MANDIR)/man5/llm-checkpoint.5

clean:
	rm -rf build build-asan build-fuzz bin tests/tmp

.PHONY: all bin-link deps test demo asan fuzz install uninstall clean FORCE
.SECONDARY:
-include $(wildcard $(B)/*/*.d $(B)/*/*/*.d)
