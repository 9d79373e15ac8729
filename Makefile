# rnnlua build. `make` builds ./rnnlua; `make test`, `make demo`, `make bench`, `make deps`, `make fuzz`,
# `make device-kit` (build-device/kit/, the self-contained folder run on a GPU machine: docs/gpu.md).
# Options: CUDA=0 (leave CUDA out), CUDA=1 (demand it; default: use it when nvcc is found),
#          MPI=0 (leave MPI out), MPI=1 (demand it; default: use Open MPI when pkg-config finds
#          it), NCCL comes with CUDA=1 when the toolkit has it (NCCL=0 leaves it out),
#          SANITIZE=1 (AddressSanitizer + UBSan, separate build dir), WERROR=1 (warnings fail),
#          BLAS=openblas (default) or BLAS=blis (separate build dir; bench/blas_compare.sh
#          measures both on rnnlua's GEMM shapes), CUDART=static (the CUDA runtime linked in).

CC      ?= cc
# FUZZ=1 (set by `make fuzz`): clang with libFuzzer's coverage, ASan and UBSan, no CUDA, no MPI,
# -O1 (the sanitized -O2 build of kernels/cpu takes many minutes).
ifeq ($(FUZZ),1)
  CUDA   := 0
  MPI    := 0
  CC     := clang
  CFLAGS ?= -O1 -g
endif
BLAS    ?= openblas
# -march of every object (native: the build machine's; see CFLAGS below)
ARCH    ?= native
ifeq ($(BLAS),openblas)
  PKGS  := lua5.4 hdf5 openblas libedit libmicrohttpd jansson sndfile samplerate fftw3f
else ifeq ($(BLAS),blis)
  PKGS  := lua5.4 hdf5 libedit libmicrohttpd jansson sndfile samplerate fftw3f
else
  $(error BLAS=$(BLAS): expected openblas or blis)
endif
NVCC    ?= $(or $(shell command -v nvcc 2>/dev/null),$(wildcard /usr/local/cuda/bin/nvcc))

ifeq ($(CUDA),)
  CUDA := $(if $(NVCC),1,0)
endif
ifeq ($(CUDA),1)
  ifeq ($(NVCC),)
    $(error CUDA=1 but no nvcc on the PATH or under /usr/local/cuda)
  endif
  CUDA_HOME := $(patsubst %/bin/nvcc,%,$(lastword $(NVCC)))
endif

BUILD   := build$(if $(filter 1,$(FUZZ)),-fuzz)$(if $(filter 1,$(SANITIZE)),-san)$(if $(filter 0,$(CUDA)),-nocuda)$(if $(filter 0,$(MPI)),-nompi)$(if $(filter blis,$(BLAS)),-blis)$(if $(filter-out native,$(ARCH)),-$(ARCH))
# On a fresh machine, install what is missing before anything is compiled.
ifeq ($(filter deps clean format,$(MAKECMDGOALS)),)
  ifneq ($(shell RL_BLAS=$(BLAS) bash scripts/deps.sh --check >/dev/null 2>&1 && echo ok),ok)
    $(info rnnlua: installing missing dependencies with scripts/deps.sh)
    ifneq ($(shell RL_BLAS=$(BLAS) bash scripts/deps.sh >&2; echo $$?),0)
      $(error scripts/deps.sh failed; run `make deps` to see why)
    endif
  endif
endif
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null) -llua5.4-filesystem

# MPI (data-parallel training, core/dist.c): Open MPI's C binding through pkg-config.
MPI_PKG := ompi-c
ifeq ($(MPI),)
  MPI := $(if $(shell pkg-config --exists $(MPI_PKG) 2>/dev/null && echo y),1,0)
endif
ifeq ($(MPI),1)
  ifneq ($(shell pkg-config --exists $(MPI_PKG) 2>/dev/null && echo y),y)
    $(error MPI=1 but pkg-config finds no $(MPI_PKG) (install libopenmpi-dev: scripts/deps.sh))
  endif
  PKG_CFLAGS += -DRL_WITH_MPI $(shell pkg-config --cflags $(MPI_PKG))
  PKG_LIBS   += $(shell pkg-config --libs $(MPI_PKG))
endif

WARN    := -Wall -Wextra -Wshadow -Wmissing-prototypes -Wno-unused-parameter
CFLAGS  ?= -O2 -g
# -fno-trapping-math lets GCC if-convert and vectorise the float formulas of
# kernels/pointwise.h (rnnlua never enables FP traps), -fno-math-errno lets it vectorise sqrt
# (rnnlua never reads errno after math calls); unlike -ffast-math/-Ofast both keep NaN and
# Inf semantics, which NaN checks and gradient checks rely on. The binary is built
# for the machine it is built on (ARCH=x86-64 for a portable one).
CFLAGS  += -std=c11 -D_GNU_SOURCE -fPIC -march=$(ARCH) -fno-trapping-math -fno-math-errno $(WARN) -MMD -MP -I. \
           $(PKG_CFLAGS)
LDLIBS  := $(PKG_LIBS) -lm -lpthread
ifeq ($(BLAS),blis)
  CFLAGS  += -DRL_BLAS_BLIS
  LDLIBS  += -lblis
endif
ifeq ($(WERROR),1)
  CFLAGS  += -Werror
  NVFLAGS += -Werror all-warnings
endif
ifeq ($(SANITIZE),1)
  CFLAGS  += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
  LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(FUZZ),1)
  FUZZ_SAN := -fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer \
              -fno-sanitize-recover=undefined
  CFLAGS  += $(FUZZ_SAN)
  LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(CUDA),1)
  CFLAGS   += -DRL_WITH_CUDA
  NVFLAGS  += -O2 -std=c++17 -I. -DRL_WITH_CUDA --compiler-options -fPIC,-Wall \
              -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
  # CUDART=static links the CUDA runtime into the programs (the device kit: one library fewer
  # to find on the GPU machine; cuBLAS, cuDNN and NCCL do not load libcudart themselves)
  CUDART_LIB := $(if $(filter static,$(CUDART)),-lcudart_static -ldl -lrt,-lcudart)
  LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 $(CUDART_LIB) -lcublas -lcudnn -lstdc++
  # NCCL (allreduce of device buffers across ranks) when the toolkit ships it
  ifeq ($(NCCL),)
    NCCL := $(if $(wildcard $(CUDA_HOME)/include/nccl.h),1,0)
  endif
endif
ifneq ($(CUDA),1)
  NCCL := 0
endif
ifeq ($(NCCL),1)
  NVFLAGS += -DRL_WITH_NCCL
  CFLAGS  += -DRL_WITH_NCCL
  LDLIBS  += -lnccl
endif

LIB_SRC  := $(wildcard core/*.c kernels/*.c kernels/cpu/*.c layers/*.c) \
            $(filter-out lua/rnnlua.c lua/embed.c,$(wildcard lua/*.c))
CU_SRC   := $(if $(filter 1,$(CUDA)),$(filter-out $(if $(filter 1,$(NCCL)),,kernels/cuda/nccl.cu),$(wildcard kernels/cuda/*.cu)))
LUA_LIB  := $(sort $(wildcard lua/rnnlua/*.lua layers/*.lua))
LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CU_SRC:%.cu=$(BUILD)/%.cu.o) $(BUILD)/gen/embedded.o
CTESTS   := $(patsubst tests/c/%.c,$(BUILD)/tests/%,$(wildcard tests/c/test_*.c))
BENCHES  := $(patsubst bench/%.c,$(BUILD)/bench/%,$(wildcard bench/*.c))

.PHONY: all deps test test-gpu demo bench bench-wrk bench-gpu clean format check-cuda fuzz fuzz-run rnnlua \
        device-kit kit-programs
all: rnnlua

# Install missing system packages (apt-get) on a fresh machine.
deps:
	@RL_BLAS=$(BLAS) bash scripts/deps.sh

# phony: the top-level binary is always the one of the build just asked for (CUDA, ARCH, BLAS)
rnnlua: $(BUILD)/rnnlua
	cp $< $@

# The library the programs link: librnnlua.a, or with KIT_SHARED=1 (the device kit)
# librnnlua-kit.so, so that the CUDA kernels of both GPU generations are in the kit once rather
# than once per program.
RL_LIB := $(BUILD)/librnnlua$(if $(filter 1,$(KIT_SHARED)),-kit.so,.a)

$(BUILD)/rnnlua: $(BUILD)/lua/rnnlua.o $(RL_LIB)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/librnnlua.a: $(LIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/librnnlua-kit.so: $(LIB_OBJ)
	$(CC) -shared -Wl,-soname,librnnlua-kit.so $(LDFLAGS) -o $@ $^ $(LDLIBS)

$(BUILD)/%.o: %.c Makefile
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/%.cu.o: %.cu Makefile
	@mkdir -p $(dir $@)
	$(NVCC) $(NVFLAGS) -M -MT $@ -o $(BUILD)/$*.cu.d $<
	$(NVCC) $(NVFLAGS) -c -o $@ $<

# The Lua library is compiled into the binary, so rnnlua finds it wherever it runs from.
$(BUILD)/embed: lua/embed.c
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -O2 -Wall -o $@ $<

$(BUILD)/gen/embedded.c: $(BUILD)/embed $(LUA_LIB)
	@mkdir -p $(dir $@)
	$(BUILD)/embed $@ $(LUA_LIB)

$(BUILD)/gen/embedded.o: $(BUILD)/gen/embedded.c
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/tests/%: tests/c/%.c $(RL_LIB) tests/c/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(RL_LIB) $(LDLIBS)

$(BUILD)/bench/%: bench/%.c $(RL_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(RL_LIB) $(LDLIBS)

# ---- the installed library: the C API (include/rnnlua.h, docs/embedding.md) and `make install`
# librnnlua.so.$(SO_MAJOR) is built from the objects of librnnlua.a (LIB_OBJ); its exported
# symbols are exactly the functions of include/rnnlua.h (include/rnnlua.map), so the library's
# internal rl_* functions stay its own. tests/sh/test_embed.sh installs into a temporary folder
# and builds examples/embed.c against it with pkg-config.
PREFIX     ?= /usr/local
DESTDIR    ?=
SO_MAJOR   := $(shell sed -n 's/^\#define RL_API_VERSION \([0-9]*\)$$/\1/p' include/rnnlua.h)
RL_VER     := $(shell sed -n 's/^\#define RL_VERSION "\(.*\)"$$/\1/p' lua/version.h)
SO_NAME    := librnnlua.so.$(SO_MAJOR)
INST_BIN   := $(DESTDIR)$(PREFIX)/bin
INST_LIB   := $(DESTDIR)$(PREFIX)/lib
INST_INC   := $(DESTDIR)$(PREFIX)/include
INST_SHARE := $(DESTDIR)$(PREFIX)/share
.PHONY: install uninstall shared

shared: $(BUILD)/$(SO_NAME) $(BUILD)/luamod/rnnlua.so

$(BUILD)/$(SO_NAME): $(LIB_OBJ) include/rnnlua.map
	$(CC) -shared -Wl,-soname,$(SO_NAME) -Wl,--version-script,include/rnnlua.map $(LDFLAGS) \
	    -o $@ $(LIB_OBJ) $(LDLIBS)

# The module for a system Lua 5.4 (`require "rnnlua"` from Debian's lua5.4): the same objects,
# exporting only luaopen_rnnlua, and without liblua: the interpreter that loads it provides Lua.
$(BUILD)/luamod/rnnlua.so: $(LIB_OBJ) lua/module.map
	@mkdir -p $(dir $@)
	$(CC) -shared -Wl,--version-script,lua/module.map $(LDFLAGS) -o $@ $(LIB_OBJ) \
	    $(filter-out -llua5.4,$(LDLIBS))

install: $(BUILD)/rnnlua $(BUILD)/$(SO_NAME) $(BUILD)/librnnlua.a $(BUILD)/luamod/rnnlua.so
	install -d $(INST_BIN) $(INST_LIB)/pkgconfig $(INST_INC) $(INST_SHARE)/man/man1 \
	    $(INST_SHARE)/doc/rnnlua/docs $(INST_SHARE)/doc/rnnlua/examples \
	    $(INST_SHARE)/rnnlua/lua/rnnlua $(INST_SHARE)/rnnlua/layers
	install -m 755 $(BUILD)/rnnlua $(INST_BIN)/rnnlua
	install -m 755 $(BUILD)/$(SO_NAME) $(INST_LIB)/$(SO_NAME)
	ln -sf $(SO_NAME) $(INST_LIB)/librnnlua.so
	install -m 644 $(BUILD)/librnnlua.a $(INST_LIB)/librnnlua.a
	install -d $(INST_LIB)/lua/5.4
	install -m 755 $(BUILD)/luamod/rnnlua.so $(INST_LIB)/lua/5.4/rnnlua.so
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(RL_VER)|' -e 's|@LIBS_PRIVATE@|$(LDLIBS)|' \
	    scripts/rnnlua.pc.in >$(INST_LIB)/pkgconfig/rnnlua.pc
	install -m 644 include/rnnlua.h $(INST_INC)/rnnlua.h
	install -m 644 docs/rnnlua.1 $(INST_SHARE)/man/man1/rnnlua.1
	install -m 644 README.md LICENSE THIRD_PARTY_NOTICES.md $(INST_SHARE)/doc/rnnlua
	install -m 644 $(wildcard docs/*.md) $(INST_SHARE)/doc/rnnlua/docs
	install -m 644 examples/embed.c $(INST_SHARE)/doc/rnnlua/examples
	install -m 644 $(wildcard lua/rnnlua/*.lua) $(INST_SHARE)/rnnlua/lua/rnnlua
	install -m 644 $(wildcard layers/*.lua) $(INST_SHARE)/rnnlua/layers

uninstall:
	rm -f $(INST_BIN)/rnnlua $(INST_LIB)/$(SO_NAME) $(INST_LIB)/librnnlua.so \
	    $(INST_LIB)/librnnlua.a $(INST_LIB)/pkgconfig/rnnlua.pc $(INST_INC)/rnnlua.h \
	    $(INST_LIB)/lua/5.4/rnnlua.so \
	    $(INST_SHARE)/man/man1/rnnlua.1
	rm -rf $(INST_SHARE)/doc/rnnlua $(INST_SHARE)/rnnlua

# RL_MAKE_VARS: the variables of this build, for tests/sh/test_embed.sh's `make install`
test: $(BUILD)/rnnlua $(CTESTS) $(BUILD)/$(SO_NAME) $(BUILD)/luamod/rnnlua.so
	@RL_MAKE_VARS="CUDA=$(CUDA) MPI=$(MPI) BLAS=$(BLAS) ARCH=$(ARCH) SANITIZE=$(SANITIZE)" \
	    bash tests/run.sh $(BUILD)

# CUDA-vs-CPU parity of every op, of the LSTM (own kernels, cuDNN), of the GRU, of CTC, of attention, of the
# optimizers and of networks of every other layer class (including whole rl.train runs), of
# rl.dist through NCCL (mpirun -np 2, one GPU per rank). Without a GPU the harnesses run with the
# CPU as the device side (what needs a device is skipped and said so), so a broken test shows.
# The parity programs in the order they run (the device kit runs the same list).
GPU_TESTS := test_parity test_bf16_parity test_stack_parity test_lstm_parity test_gru_parity test_optim_parity \
             test_mdlstm_parity test_ctc_parity test_attention_parity
test-gpu: $(BUILD)/rnnlua $(GPU_TESTS:%=$(BUILD)/tests-gpu/%)
	@set -e; for t in $(GPU_TESTS); do echo "$(BUILD)/tests-gpu/$$t"; $(BUILD)/tests-gpu/$$t; done
	$(BUILD)/rnnlua tests/gpu/test_layers_parity.lua
	bash tests/gpu/test_dist_nccl.sh $(BUILD)/rnnlua

$(BUILD)/tests-gpu/%: tests/gpu/%.c $(RL_LIB) tests/c/check.h tests/gpu/device_side.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(RL_LIB) $(LDLIBS)

bench: $(BUILD)/rnnlua $(BENCHES)
	@bash bench/run.sh $(BUILD)

# `rnnlua serve` under wrk alone (bench/serve_wrk.sh; `make bench` runs it too).
bench-wrk: $(BUILD)/rnnlua
	@bash bench/serve_wrk.sh $(BUILD)

# The GPU LSTM and GRU benchmark alone: own kernels vs cuDNN per configuration (one SKIP line without a
# GPU; `make bench` runs it too).
bench-gpu: $(BUILD)/bench/rnn_gpu $(BUILD)/bench/mdlstm_gpu
	$(BUILD)/bench/rnn_gpu
	$(BUILD)/bench/mdlstm_gpu

# The device kit (docs/gpu.md): rnnlua, the parity programs and the GPU benchmarks built for
# sm_80 and sm_90 (CUDA=1, MPI=0, AVX2 host code, the CUDA runtime linked in) in their own build
# folder, copied into build-device/kit/ with every non-system library they load and run.sh, the
# script that runs them all on a GPU machine and writes report.md. scripts/device_kit.sh fails
# when a program needs a library that is neither in the kit nor in the base set of that machine.
KIT_BUILD := build-device/build
KIT_VARS  := CUDA=1 MPI=0 ARCH=x86-64-v3 CUDART=static KIT_SHARED=1 BUILD=$(KIT_BUILD)
device-kit:
	$(MAKE) --no-print-directory $(KIT_VARS) kit-programs
	bash scripts/device_kit.sh $(KIT_BUILD) build-device/kit "$(GPU_TESTS)"

kit-programs: $(BUILD)/rnnlua $(GPU_TESTS:%=$(BUILD)/tests-gpu/%) $(BUILD)/bench/rnn_gpu \
              $(BUILD)/bench/mdlstm_gpu $(BUILD)/bench/mdlstm

demo: rnnlua
	./rnnlua recipes/12ax_blstm.lua

# libFuzzer targets (fuzz/fuzz_*.c): each runs FUZZ_TIME seconds from the seed corpus in
# fuzz/corpus/<target> (read only; new inputs go to build-fuzz-nocuda-nompi/corpus/<target>,
# crashes to build-fuzz-nocuda-nompi/crashes/). Exits non-zero on the first finding.
FUZZ_TIME    ?= 60
FUZZ_TARGETS := $(patsubst fuzz/fuzz_%.c,%,$(wildcard fuzz/fuzz_*.c))
fuzz:
	$(MAKE) --no-print-directory FUZZ=1 fuzz-run

fuzz-run: $(FUZZ_TARGETS:%=$(BUILD)/fuzz/fuzz_%)
	@mkdir -p $(BUILD)/crashes
	@found=""; for t in $(FUZZ_TARGETS); do \
	    mkdir -p $(BUILD)/corpus/$$t; \
	    echo "== fuzz $$t for $(FUZZ_TIME) s"; \
	    ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 \
	        $(BUILD)/fuzz/fuzz_$$t $(BUILD)/corpus/$$t fuzz/corpus/$$t \
	        -max_total_time=$(FUZZ_TIME) -timeout=10 -rss_limit_mb=4096 -print_final_stats=1 \
	        -artifact_prefix=$(BUILD)/crashes/$$t- 2>$(BUILD)/fuzz_$$t.log \
	        || { grep -A 30 -E "^==[0-9]+== ?ERROR|deadly signal|timeout|out-of-memory" \
	             $(BUILD)/fuzz_$$t.log | head -n 40 | grep . || tail -n 30 $(BUILD)/fuzz_$$t.log; \
	             if bash fuzz/in_libhdf5.sh $(BUILD)/fuzz_$$t.log; then \
	                 echo "fuzz $$t: the finding is inside libhdf5 (docs/robustness.md: Fuzzing), not counted"; \
	             else found="$$found $$t"; fi; }; \
	    grep -E "^stat::(number_of_executed_units|new_units_added)" $(BUILD)/fuzz_$$t.log; \
	done; \
	if [ -n "$$found" ]; then echo "fuzz: findings in$$found (inputs in $(BUILD)/crashes)"; exit 1; fi

# The CPU kernels are not what the targets exercise (files and parsers), and clang takes tens of
# minutes over their sanitized, instrumented build: they are compiled plain.
$(BUILD)/kernels/cpu/%.o: CFLAGS := $(filter-out $(FUZZ_SAN),$(CFLAGS))

$(BUILD)/fuzz/fuzz_%: fuzz/fuzz_%.c fuzz/fuzz.h $(BUILD)/librnnlua.a
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -fsanitize=fuzzer $(LDFLAGS) -o $@ $< $(BUILD)/librnnlua.a $(LDLIBS)

# Compile-and-link check of every CUDA source (no GPU needed).
check-cuda:
	$(MAKE) --no-print-directory CUDA=1 WERROR=1 $(BUILD)/rnnlua

format:
	clang-format -i $(wildcard core/*.[ch] kernels/*.[ch] kernels/cpu/*.[ch] kernels/cuda/*.cu kernels/cuda/*.h layers/*.[ch] lua/*.[ch] tests/c/*.[ch] bench/*.c fuzz/*.[ch])

clean:
	rm -rf build build-* rnnlua

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
