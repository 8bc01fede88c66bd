# finetune: one Makefile. `make` builds build/finetune; `make test` runs the fast tier of the
# CPU tests (a few minutes), `make test-slow` the slow suites (SLOW_TESTS below), `make
# test-all` both; `make test-asan` runs the C tests under ASan+UBSan; `make check` is all of
# these plus the nvcc build and the Slurm test. No GPU is needed for any of these.
#
#   make CUDA=0      never build CUDA code (default: build it when nvcc is found)
#   make CUDA=1      require nvcc
#   make DEBUG=1     -O0
#   make SAN=1       AddressSanitizer + UndefinedBehaviorSanitizer (use BUILD=... to keep apart)
#   make DEPS_PREFIX=.deps/root   libraries from scripts/gpu_bundle.sh's folder (no apt needed)

CC      ?= gcc
CXX     ?= g++
BUILD   ?= build
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
ifeq ($(origin CUDA), undefined)
  CUDA := $(if $(NVCC),1,0)
endif

# README's two commands on a fresh machine: `make run` and `make check` first check the system
# libraries and tools they need (scripts/deps.sh: as root it apt-installs what is missing,
# otherwise it prints the apt-get line and the build stops). Here, before the detection
# below, so what it installs is detected.
DEPS_SET := $(if $(filter check,$(MAKECMDGOALS)),check,$(if $(filter run,$(MAKECMDGOALS)),run))
ifneq ($(DEPS_SET),)
  ifneq ($(shell DEPS_PREFIX='$(DEPS_PREFIX)' bash scripts/deps.sh $(DEPS_SET) >&2; echo $$?),0)
    $(error missing dependencies: see the line above)
  endif
endif

OPT     := $(if $(DEBUG),-O0,-O2)
# CPU BLAS: OpenBLAS, OpenMP build, linked explicitly so BLAS threads and our OpenMP loops
# share one pool (the pthread build oversubscribes cores when called inside OpenMP).
BLAS_INC := -I/usr/include/x86_64-linux-gnu/openblas-openmp
BLAS_LIB := -L/usr/lib/x86_64-linux-gnu/openblas-openmp -Wl,-rpath,/usr/lib/x86_64-linux-gnu/openblas-openmp -lopenblas
# DEPS_PREFIX=DIR: jansson, OpenBLAS (and MPICH) from Debian packages extracted under DIR
# (scripts/gpu_bundle.sh, for machines without a package manager) ahead of the system's; the
# run paths into DIR are DT_RPATH, which also serves those libraries' own dependencies
ifneq ($(DEPS_PREFIX),)
  DEPS_INC := $(abspath $(DEPS_PREFIX))/usr/include
  DEPS_LIB := $(abspath $(DEPS_PREFIX))/usr/lib/x86_64-linux-gnu
  BLAS_INC := -I$(DEPS_INC)/x86_64-linux-gnu/openblas-openmp -I$(DEPS_INC)
  BLAS_LIB := -L$(DEPS_LIB)/openblas-openmp -L$(DEPS_LIB) -Wl,--disable-new-dtags \
              -Wl,-rpath,$(DEPS_LIB)/openblas-openmp -Wl,-rpath,$(DEPS_LIB) -lopenblas
  DEPS_MPI_FLAGS := $(if $(wildcard $(DEPS_INC)/x86_64-linux-gnu/mpich/mpi.h),-I$(DEPS_INC)/x86_64-linux-gnu/mpich -lmpich)
endif
SAN_ON   := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
SANFLAGS := $(if $(SAN),$(SAN_ON))

CFLAGS  += -std=gnu11 $(OPT) -g -Wall -Wextra -Werror=implicit-function-declaration -fopenmp \
           -Isrc $(BLAS_INC) $(SANFLAGS) -MMD -MP
LDLIBS  += $(BLAS_LIB) -ljansson -lm -fopenmp $(SANFLAGS)

# MPI (CPU ranks): MPICH from Debian, found through pkg-config (or in DEPS_PREFIX); MPI=0/1 overrides
MPI_FLAGS := $(or $(DEPS_MPI_FLAGS),$(shell pkg-config --cflags --libs mpich 2>/dev/null))
ifeq ($(origin MPI), undefined)
  MPI := $(if $(MPI_FLAGS),1,0)
endif
ifeq ($(MPI),1)
  CFLAGS += $(filter -I%,$(MPI_FLAGS)) -DFT_HAVE_MPI
  LDLIBS += $(filter-out -I%,$(MPI_FLAGS))
endif

# PMI2 (Slurm's libpmi2) for bootstrapping ranks under srun without MPI: slurm/pmi2.h under
# SLURM_DIR, by default the prefix of the srun on PATH (a cluster's Slurm in /opt/slurm:
# /opt/slurm/bin/srun -> /opt/slurm/include/slurm/pmi2.h and libpmi2 in its lib64/ or lib/: the
# library of the Slurm that runs the job), else in the system's include directory (Debian's
# libpmi2-0-dev). PMI2=0/1 and SLURM_DIR=... override.
SLURM_DIR ?= $(patsubst %/bin/srun,%,$(shell command -v srun 2>/dev/null))
PMI2_PREFIX := $(if $(filter-out /usr,$(SLURM_DIR)),$(if $(wildcard $(SLURM_DIR)/include/slurm/pmi2.h),$(if \
                 $(wildcard $(SLURM_DIR)/lib64/libpmi2.* $(SLURM_DIR)/lib/libpmi2.*),$(SLURM_DIR))))
ifeq ($(origin PMI2), undefined)
  PMI2 := $(if $(PMI2_PREFIX)$(wildcard /usr/include/slurm/pmi2.h),1,0)
endif
ifeq ($(PMI2),1)
  CFLAGS += -DFT_HAVE_PMI2 $(if $(PMI2_PREFIX),-I$(PMI2_PREFIX)/include)
  LDLIBS += $(foreach d,$(wildcard $(PMI2_PREFIX:%=%/lib64) $(PMI2_PREFIX:%=%/lib)),-L$(d) -Wl,-rpath,$(d)) -lpmi2
endif

# CUDA toolkit: host C files that talk to the CUDA runtime, cuBLASLt, cuDNN and NCCL
CUDA_HOME ?= /usr/local/cuda
# (the CUDA backend links the nvcc-built kernels: $(BUILD)/libftkernels.a, rules in kernels.mk)
ifeq ($(CUDA),1)
  CFLAGS += -I$(CUDA_HOME)/include -Ikernels -DFT_HAVE_CUDA
  # (NCCL and cuDNN are not linked: src/comm_nccl.c loads NCCL at run time, only for GPU jobs of
  # several ranks, src/attention_cudnn_graph.c cuDNN, for --attention cudnn; both also from pip wheels)
  CUDA_LDLIBS := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -ldl -lstdc++
  LDLIBS += $(CUDA_LDLIBS)
  KERNEL_LIB := $(BUILD)/libftkernels.a
endif

NEEDS_MPI  := src/comm_mpi.c
NEEDS_PMI2 := src/bootstrap_pmi2.c
NEEDS_CUDA := src/comm_nccl.c src/backend_cuda.c src/cuda_wait.c src/attention_cudnn.c src/attention_cudnn_graph.c
LIB_SRCS := $(filter-out src/main.c $(if $(filter 1,$(MPI)),,$(NEEDS_MPI)) $(if $(filter 1,$(PMI2)),,$(NEEDS_PMI2)) \
              $(if $(filter 1,$(CUDA)),,$(NEEDS_CUDA)),$(wildcard src/*.c))
LIB_OBJS := $(patsubst src/%.c,$(BUILD)/obj/%.o,$(LIB_SRCS))
# C tests that need the CUDA toolkit's libraries (CUDA=1 only; not in the CUDA=0 sanitizer build):
#   test_cudnn_plan   cuDNN plans the attention graphs for an H100 it is only told about (no GPU;
#                     the toolkit's stub libcuda, loaded by path, stands in for the driver)
CUDA_TEST_SRCS := tests/test_cudnn_plan.c
CUDA_ONLY_TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(CUDA_TEST_SRCS))
TEST_SRCS := $(filter-out $(if $(filter 1,$(CUDA)),,$(CUDA_TEST_SRCS)),$(wildcard tests/test_*.c))
TEST_BINS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SRCS))
# tests that need a real GPU (make test-gpu): built whenever CUDA=1, run only there
GPU_TEST_BINS := $(if $(filter 1,$(CUDA)),$(patsubst tests/gpu/%.c,$(BUILD)/tests/gpu/%,$(wildcard tests/gpu/*.c)))
# shell tests (they receive the build dir as $1)
TEST_SCRIPTS := $(wildcard tests/test_*.sh)

# Test tiers. `make test` runs every suite (a C test's binary, a shell suite's script) except
# the slow ones named here, by file name; `make test-slow` runs these; `make test-all` and
# `make check` run both. A new tests/test_*.c or tests/test_*.sh is in the fast tier unless
# named here: name it when it takes more than about 20 s of CPU time (run_all.sh prints each
# suite's wall and CPU seconds). The fast tier's budget: 5 minutes on an idle 2-core machine.
# Figures: wall / CPU seconds measured 2026-11-28 on the shared 2-core development machine at
# load 10-40 (so the wall times are 3-6 times an idle machine's), or the suite's own header.
SLOW_TESTS :=
SLOW_TESTS += test_cuda_emu_soak.sh   # header: 12-15 min; 472 emulated-GPU steps (bf16 moments, --fp8), stops, resumes
SLOW_TESTS += mutate_kernels.sh       # header: ~300 s of CPU; 136 kernel mutants
SLOW_TESTS += test_cuda_emu_train.sh  # header: 3.5-7 min wall, 4 min of CPU
SLOW_TESTS += test_offload.sh         # header: 2 min
SLOW_TESTS += test_backend_emu        # 159 s wall at load 9: every backend op, emulated CUDA
SLOW_TESTS += test_watchdog.sh        # header: 67-131 s
SLOW_TESTS += test_gpu_faults.sh      # about 50 s: 3 emulated 2-GPU jobs with a fault on rank 1, resumed
SLOW_TESTS += test_lora.sh            # header: 48-91 s wall, 60 s of CPU
SLOW_TESTS += test_emu_vclock.sh      # header: 90 s wall: 8 short emulated-GPU training runs
SLOW_TESTS += test_plan_vclock.sh     # 90 s wall, 35 s of CPU at load 10: 8 emulated-GPU jobs and their --dry_run
SLOW_TESTS += test_cudnn_plan         # 62 s wall at load 9
SLOW_TESTS += test_soak_script.sh     # header: 40 s
SLOW_TESTS += test_data_in.sh         # header: 35 s idle, 2-4 min loaded
SLOW_TESTS += test_cuda_emu_attention.sh  # header: 40 s wall, 58 s of CPU
SLOW_TESTS += test_pack_attention.sh  # 507 s / 89 s
SLOW_TESTS += test_make_run.sh        # 440 s / 85 s
SLOW_TESTS += test_plan.sh            # 469 s / 82 s
SLOW_TESTS += test_train.sh           # > 8 min / > 83 s (stopped there)
SLOW_TESTS += test_build_config.sh    # 2 builds of the C sources: ~1 min each idle, 3-4 min loaded
SLOW_TESTS += test_nccl_standin.sh    # 163 s of CPU, 4.5 min wall at load ~15: 3 emulated multi-rank jobs, twice
SLOW_TESTS += test_early_update.sh     # 2 min wall, 38 s of CPU: 9 CPU and 2 emulated-GPU job pairs

.PHONY: all test test-slow test-all test-list test-bins test-asan test-slurm test-gpu check run clean docs
all: $(BUILD)/finetune

$(BUILD)/obj/%.o: src/%.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# the CPU backend: sqrtf without its errno branch, which keeps AdamW's loop from vectorising
# (3.4x on that loop; results are the same bits)
$(BUILD)/obj/backend_cpu.o: CFLAGS += -fno-math-errno

$(BUILD)/libfinetune.a: $(LIB_OBJS)
	rm -f $@ && ar rcs $@ $^

# --version: the source revision (git describe), in $(BUILD)/version.h, rewritten only when it
# changes, so that a new commit rebuilds main.o alone
FT_VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
# (written while the Makefile is read, not by a FORCE'd rule, so that `make -n` and `make -q`
# see an unchanged header as up to date; not for `make clean` alone, nor under `make -n`, which
# must leave the tree as it is: MAKE_WRITES is empty then)
MAKE_WRITES := $(if $(filter clean,$(MAKECMDGOALS))$(findstring n,$(firstword -$(MAKEFLAGS))),,yes)
ifeq ($(MAKE_WRITES),yes)
# (\043 is '#', which a make function's text cannot hold portably across make versions)
VERSION_LINE := printf '\043define FT_VERSION "%s"\n' '$(FT_VERSION)'
_ := $(shell mkdir -p $(BUILD) && { $(VERSION_LINE) | cmp -s - $(BUILD)/version.h || $(VERSION_LINE) > $(BUILD)/version.h; })
endif
$(BUILD)/version.h:   # (only when missing: `make clean all`)
	@mkdir -p $(BUILD) && $(VERSION_LINE) > $@
$(BUILD)/obj/main.o: $(BUILD)/version.h
$(BUILD)/obj/main.o: CFLAGS += -I$(BUILD)

$(BUILD)/finetune: $(BUILD)/obj/main.o $(BUILD)/libfinetune.a $(KERNEL_LIB)
	$(CC) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libfinetune.a $(KERNEL_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libfinetune.a $(KERNEL_LIB) -o $@ $(LDLIBS)
$(BUILD)/tests/test_cudnn_plan: CFLAGS += -DFT_CUDA_STUB_LIBCUDA='"$(CUDA_HOME)/lib64/stubs/libcuda.so"'

# small tools the shell tests use
TOOL_SRCS := $(filter-out $(if $(filter 111,$(CUDA)$(PMI2)$(MPI)),,tests/tools/nccl_id_exchange.c),$(wildcard tests/tools/*.c))
TOOL_BINS := $(patsubst tests/tools/%.c,$(BUILD)/tests/%,$(TOOL_SRCS))
$(BUILD)/tests/%: tests/tools/%.c $(BUILD)/libfinetune.a $(KERNEL_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libfinetune.a $(KERNEL_LIB) -o $@ $(LDLIBS)

# fragments contributed by sub-projects (CUDA emulator, kernels) add to TEST_BINS/TEST_CMDS
-include tests/cuda_emu/emu.mk
-include kernels/kernels.mk
-include tests/nccl_standin/standin.mk

# The build's configuration: what was detected and with which paths, in $(BUILD)/build_config.h
# (scripts/build_config.sh rewrites it only when it changes). Every target depends on it
# (.EXTRA_PREREQS, GNU make 4.3+), so a build made before MPICH, libpmi2 or the CUDA toolkit was
# installed, or with other flags, does not survive a build after; `finetune --version` prints it.
# One simply-expanded variable holds the lines, read from the global flags at parse time (a
# target's own additions, e.g. main.o's -I$(BUILD), never leak into it).
CC_VERSION := $(shell $(CC) --version 2>/dev/null | head -n 1)
NVCC_VERSION := $(if $(NVCC),$(shell $(NVCC) --version 2>/dev/null | tail -n 1))
shq = '$(subst ','\'',$(1))'
BUILD_CONFIG_LINES := \
  $(call shq,compiler: $(CC) ($(CC_VERSION)); C++: $(CXX)) \
  $(call shq,CFLAGS: $(CFLAGS)) \
  $(call shq,LDLIBS: $(LDLIBS)) \
  $(call shq,MPI: $(if $(filter 1,$(MPI)),yes ($(or $(MPI_FLAGS),flags given)),no ($(if $(filter command line,$(origin MPI)),MPI=$(MPI) given,pkg-config mpich found nothing; MPI=1 forces)))) \
  $(call shq,PMI2: $(if $(filter 1,$(PMI2)),yes ($(or $(PMI2_PREFIX),/usr): libpmi2),no ($(if $(filter command line,$(origin PMI2)),PMI2=$(PMI2) given,no slurm/pmi2.h)))) \
  $(call shq,CUDA: $(if $(filter 1,$(CUDA)),yes ($(CUDA_HOME); nvcc $(NVCC): $(NVCC_VERSION); kernels for $(NVCC_CODES)),no ($(if $(filter command line,$(origin CUDA)),CUDA=$(CUDA) given,nvcc not found; CUDA=1 forces)))) \
  $(call shq,BLAS: $(BLAS_INC) $(BLAS_LIB)) \
  $(call shq,DEPS_PREFIX: $(or $(DEPS_PREFIX),none)) \
  $(call shq,sanitizers: $(if $(SAN),ASan+UBSan,none))
BUILD_CONFIG_H := $(BUILD)/build_config.h
ifeq ($(MAKE_WRITES),yes)
_ := $(shell mkdir -p $(BUILD) && bash scripts/build_config.sh $(BUILD_CONFIG_H) $(BUILD_CONFIG_LINES))
endif
$(BUILD_CONFIG_H):   # (only when missing: `make clean all`)
	@mkdir -p $(BUILD) && bash scripts/build_config.sh $@ $(BUILD_CONFIG_LINES)
$(BUILD)/obj/main.o: $(BUILD_CONFIG_H)

# the nvcc-built kernels (sm_80 + sm_90 in each object) for the CUDA backend
$(BUILD)/libftkernels.a: $(NVCC_OBJS)
	rm -f $@ && ar rcs $@ $^

# the two tiers' commands for tests/run_all.sh: a binary runs as is, a script as `bash SCRIPT
# BUILD`; commands a fragment adds to TEST_CMDS itself are in the fast tier
SUITES := $(TEST_BINS) $(TEST_SCRIPTS)
suite_cmd = $(if $(filter %.sh,$(1)),"bash $(1) $(BUILD)",$(1))
slow_suite = $(filter $(SLOW_TESTS),$(notdir $(1)))
TEST_CMDS += $(foreach s,$(SUITES),$(if $(call slow_suite,$(s)),,$(call suite_cmd,$(s))))
SLOW_CMDS := $(foreach s,$(SUITES),$(if $(call slow_suite,$(s)),$(call suite_cmd,$(s))))
$(foreach t,$(filter %.sh,$(SLOW_TESTS)),$(if $(wildcard tests/$(t)),,$(warning SLOW_TESTS: no tests/$(t))))
RUN_ALL := OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} tests/run_all.sh

test-bins: $(TEST_BINS) $(TOOL_BINS) $(GPU_TEST_BINS) $(BUILD)/finetune $(EXTRA_TEST_DEPS)

# the fast tier; the slow suites; both in one run (one summary, the slowest of all listed)
test: test-bins
	$(RUN_ALL) $(TEST_CMDS)
test-slow: test-bins
	$(RUN_ALL) $(SLOW_CMDS)
test-all: test-bins
	$(RUN_ALL) $(TEST_CMDS) $(SLOW_CMDS)
# the commands of each tier, one a line (tests/test_run_all.sh checks the split)
test-list:
	@$(if $(TEST_CMDS),printf 'fast %s\n' $(TEST_CMDS))
	@$(if $(SLOW_CMDS),printf 'slow %s\n' $(SLOW_CMDS))

# C tests, and finetune itself through the CLI and training suites, under ASan+UBSan in a
# separate build dir (slow paths skipped by the tests themselves when FT_SANITIZED is set).
# Every report goes to a log file (log_path), and any file there fails the run: a process
# whose exit status a test does not look at cannot hide one.
SAN_LOGS := $(CURDIR)/build/asan/san-logs
test-asan:
	$(MAKE) BUILD=build/asan SAN=1 CUDA=0 test-bins
	rm -rf $(SAN_LOGS) && mkdir -p $(SAN_LOGS)
	FT_SANITIZED=1 ASAN_OPTIONS=detect_leaks=1:log_path=$(SAN_LOGS)/asan \
	  UBSAN_OPTIONS=print_stacktrace=1:log_path=$(SAN_LOGS)/ubsan \
	  OMP_NUM_THREADS=2 tests/run_all.sh $(patsubst $(BUILD)/%,build/asan/%,$(filter-out $(CUDA_ONLY_TEST_BINS),$(TEST_BINS))) \
	  "bash tests/test_cli.sh build/asan" "bash tests/test_train.sh build/asan" "bash tests/sanitizer_logs.sh $(SAN_LOGS)"

# On a machine with a GPU: kernels on the device vs the CPU, GPU vs CPU training, 2-GPU FSDP
# vs 1 GPU. Elsewhere it says it skipped and exits 0.
test-gpu: $(BUILD)/finetune $(GPU_TEST_BINS)
	bash tests/gpu/test_gpu.sh $(BUILD)

# A real Slurm on localhost (two simulated nodes): PMI2 bootstrap and the shipped sbatch
# scripts on CPU ranks. Needs root, slurm-wlm, munge, libpmi2-0-dev; skips otherwise (fails
# when CI=true).
test-slurm: $(BUILD)/finetune $(TOOL_BINS)
	bash tests/slurm/test_slurm.sh $(BUILD)

# README's test command: every CPU test (both tiers), the same C tests under sanitizers, the
# nvcc build of every kernel for sm_80/sm_90 when nvcc exists (nvcc-check comes from
# kernels/kernels.mk), and the Slurm test.
check: test-all test-asan $(if $(and $(filter 1,$(CUDA)),$(wildcard kernels/kernels.mk)),nvcc-check) test-slurm

# README's first command: train the bundled tiny model on the bundled chess games (CPU).
# RUN_STEPS and RUN_OUT change the length and the output directory alone (tests/test_make_run.sh
# runs it short); RUN_FLAGS replaces all the flags.
RUN_STEPS ?= 1000
RUN_OUT ?= out/default
RUN_FLAGS ?= --pack --seq_len 256 --batch_size_per_device 8 --total_batch_size 16 --learning_rate 5e-3 \
             --max_steps $(RUN_STEPS) --eval_every 250 --save_every 250 --sample_tokens 40 --sample_games 64 \
             --out_dir $(RUN_OUT) --overwrite_out_dir
run: $(BUILD)/finetune
	$(BUILD)/finetune --model_dir data/model --data_dir data/chess $(RUN_FLAGS)
	@if command -v stockfish >/dev/null || [ -x /usr/games/stockfish ]; then python3 scripts/legal_moves.py $(RUN_OUT); \
	 else echo "(as root: apt-get install stockfish, then python3 scripts/legal_moves.py $(RUN_OUT) judges the sampled moves)"; fi
	@rm -f $(RUN_OUT)/metrics.png; py=$$(for p in python3 /usr/bin/python3; do $$p -c 'import matplotlib' 2>/dev/null && { echo $$p; break; }; done); \
	 if [ -n "$$py" ]; then $$py scripts/plot_metrics.py $(RUN_OUT); \
	 else echo "(as root: apt-get install python3-matplotlib, then /usr/bin/python3 scripts/plot_metrics.py $(RUN_OUT) draws the curves)"; fi

# the generated references: the flags (src/options.c's table) and the environment variables
# (src/common.c's table); tests/test_gen_docs.sh fails when the committed copies are stale
docs: $(BUILD)/finetune
	$(BUILD)/finetune --help=markdown > docs/flags.md
	$(BUILD)/finetune --help=env > docs/environment.md

clean:
	rm -rf build out

-include $(wildcard $(BUILD)/obj/*.d $(BUILD)/tests/*.d)

# every target depends on the build's configuration (above), except the ones that make it
.EXTRA_PREREQS := $(BUILD_CONFIG_H)
$(BUILD_CONFIG_H) $(BUILD)/version.h $(NVCC_STAMP) clean: .EXTRA_PREREQS :=
# GNU make before 4.3 ignores .EXTRA_PREREQS (RHEL 8 has 4.2.1): there the objects name it
# (their recipes compile $< alone), and the libraries and binaries follow from them
ifeq ($(filter-out 3.% 4.0% 4.1% 4.2%,$(MAKE_VERSION)),)
$(LIB_OBJS) $(NVCC_OBJS) $(EMU_OBJ) $(EMU_HOST_OBJS) $(KERNEL_EMU_OBJS) $(KERNEL_EMU_GPU_OBJS): $(BUILD_CONFIG_H)
endif

