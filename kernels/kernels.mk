# kernels/kernels.mk: the hand-written CUDA kernels (included by the Makefile, after
# tests/cuda_emu/emu.mk).
#
#   $(BUILD)/tests/test_kernels   every kernel compiled as C++ against the CPU emulator and
#                                 compared with the CPU backend (added to TEST_BINS, so it runs
#                                 in `make test` and, under ASan+UBSan, in `make test-asan`)
#   $(BUILD)/tests/test_kernels_gpumath   the same with FMA contraction and the GPU's
#                                 worst-case approximate math (__expf, rsqrtf, logf)
#   tests/mutate_kernels.sh       mutation testing of test_kernels (in `make test-slow`)
#   make nvcc-check               every kernels/*.cu through nvcc for sm_80 and sm_90 (SASS) and
#                                 compute_90 (PTX) with all warnings, register spills and local
#                                 memory as errors; prints the per-kernel resource report
#                                 (registers, smem, spills) and checks each fatbin's contents

KERNEL_SRCS := $(wildcard kernels/*.cu)
KERNEL_HDRS := $(wildcard kernels/*.cuh kernels/*.h) src/backend.h src/dtype.h

# ---------------------------------------------------------------- emulated (CPU) build
# Two emulated builds of every kernel: exact host math (test_kernels) and the GPU's
# worst-case approximate math with FMA contraction (test_kernels_gpumath, EMU_GPU_MATH_FLAGS
# from emu.mk); the same test source and thresholds for both.
ifneq ($(EMU_OK),)
KERNEL_EMU_OBJS := $(patsubst kernels/%.cu,$(BUILD)/emu/kernels/%.o,$(KERNEL_SRCS))
KERNEL_EMU_GPU_OBJS := $(patsubst kernels/%.cu,$(BUILD)/emu/kernels_gpumath/%.o,$(KERNEL_SRCS))

$(BUILD)/emu/kernels/%.o: kernels/%.cu
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -Ikernels -x c++ -c $< -o $@

$(BUILD)/emu/kernels_gpumath/%.o: kernels/%.cu
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(EMU_GPU_MATH_FLAGS) -Ikernels -x c++ -c $< -o $@

$(BUILD)/emu/test_kernels.o: tests/cuda_emu/test_kernels.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -Ikernels -c $< -o $@

$(BUILD)/emu/test_kernels_gpumath.o: tests/cuda_emu/test_kernels.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -DFT_TEST_GPU_MATH -Ikernels -c $< -o $@

# the CPU backend is the reference, and the model's RoPE table builder provides the tables:
# both come from the library (only the members they need are linked)
$(BUILD)/tests/test_kernels: $(BUILD)/emu/test_kernels.o $(KERNEL_EMU_OBJS) $(EMU_OBJ) \
                             $(BUILD)/libfinetune.a
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@ $(EMU_LDLIBS) $(LDLIBS)

$(BUILD)/tests/test_kernels_gpumath: $(BUILD)/emu/test_kernels_gpumath.o $(KERNEL_EMU_GPU_OBJS) \
                                     $(EMU_OBJ) $(BUILD)/libfinetune.a
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@ $(EMU_LDLIBS) $(LDLIBS)

TEST_BINS += $(BUILD)/tests/test_kernels $(BUILD)/tests/test_kernels_gpumath
# every one-line mutant of tests/mutate_kernels.sh's table must make test_kernels fail
# (two mutants at a time; its time: docs/results/2026-11-26-cpu.md; a slow suite: SLOW_TESTS in the
# Makefile)
TEST_SCRIPTS += tests/mutate_kernels.sh

# tests/mutate_kernels.sh rebuilds test_kernels with one kernel source changed: how the
# objects above are compiled and linked, as shell assignments
.PHONY: kernel-emu-vars
kernel-emu-vars:
	@printf '%s\n' "CXX='$(CXX)'" "KERNEL_CXXFLAGS='$(filter-out -g -MMD -MP,$(EMU_CXXFLAGS))'" \
	  "KERNEL_OBJS='$(KERNEL_EMU_OBJS)'" "TEST_OBJS='$(BUILD)/emu/test_kernels.o $(EMU_OBJ) $(BUILD)/libfinetune.a'" \
	  "LINK_LIBS='$(EMU_LDLIBS) $(LDLIBS)'"

# The whole trainer on the emulated device: src/ compiled exactly as for the CUDA build, linked
# with the emulated kernels (GPU-like math) and tests/cuda_emu/cuda_emu_host.cpp in place of
# libcudart, cuBLASLt, NCCL and the nvcc objects, and tests/cuda_emu/attention_cudnn_emu.cpp (the
# CPU stand-in of the cuDNN attention engine) in place of src/attention_cudnn_graph.c and
# libcudnn (it comes before the library, so the library's engine object is not linked).
# tests/test_cuda_emu_train.sh runs it.
ifeq ($(CUDA),1)
$(BUILD)/emu/cuda_emu_host.o: tests/cuda_emu/cuda_emu_host.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(if $(filter 1,$(MPI)),$(filter -I%,$(MPI_FLAGS)) -DFT_HAVE_MPI) -c $< -o $@
$(BUILD)/emu/attention_cudnn_emu.o: tests/cuda_emu/attention_cudnn_emu.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@
EMU_HOST_OBJS := $(BUILD)/emu/attention_cudnn_emu.o $(BUILD)/emu/cuda_emu_host.o

# -rdynamic: the emulated CUDA runtime is exported, for a library loaded at run time against it
# (tests/nccl_standin/standin.mk: the NCCL stand-in, FT_NCCL_LIBRARY)
$(BUILD)/tests/finetune_emu: $(BUILD)/obj/main.o $(EMU_HOST_OBJS) $(BUILD)/libfinetune.a $(KERNEL_EMU_GPU_OBJS) \
                             $(EMU_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@ -rdynamic $(EMU_LDLIBS) $(filter-out $(CUDA_LDLIBS),$(LDLIBS))

# tests/gpu/test_backend_gpu.c (every backend op, CUDA vs CPU) on the emulated device
# (the emulator's clock prices through plan_price.o, which nothing before it in the link pulls
# from the archive here: linked by name, as test_emu does)
$(BUILD)/tests/test_backend_emu: tests/gpu/test_backend_gpu.c $(EMU_HOST_OBJS) $(BUILD)/libfinetune.a \
                                 $(KERNEL_EMU_GPU_OBJS) $(EMU_OBJ) $(EMU_PRICE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -c $< -o $@.o
	$(CXX) $@.o $(filter-out $<,$^) -o $@ $(EMU_LDLIBS) $(filter-out $(CUDA_LDLIBS),$(LDLIBS))

# Fault-injection builds for tests/test_cuda_emu_hazards.sh: finetune_emu with src/fsdp.c,
# src/comm_nccl.c and src/model.c compiled with one TEST-ONLY macro each (never in a real build), to show that
# the asynchronous emulated runtime reports the ordering bug it creates:
#   finetune_emu_fault_prefetch  -DFT_FAULT_SKIP_PREFETCH_WAIT: FSDP uses a prefetched layer
#                                without waiting for its all-gather
#   finetune_emu_fault_rs        -DFT_FAULT_SKIP_RS_WAIT: the overlapped reduce-scatter does
#                                not wait for the backward that produces its gradients
#   finetune_emu_fault_offload   -DFT_FAULT_SKIP_OFFLOAD_WAIT: --offload_optimizer's step does
#                                not wait for the copies of the new weights to the device
#                                (tests/test_offload.sh)
#   finetune_emu_fault_ar        -DFT_FAULT_SKIP_AR_WAIT: the gradient norm and the optimizer do
#                                not wait for the units' all-reduces across replicas
#   finetune_emu_fault_upload    -DFT_FAULT_UPLOAD_NO_WAIT: the model stages each micro-batch's
#                                rows in one pinned slot without waiting for its last uploads
FAULT_DEFS_prefetch := -DFT_FAULT_SKIP_PREFETCH_WAIT
FAULT_DEFS_rs := -DFT_FAULT_SKIP_RS_WAIT
FAULT_DEFS_offload := -DFT_FAULT_SKIP_OFFLOAD_WAIT
FAULT_DEFS_ar := -DFT_FAULT_SKIP_AR_WAIT
FAULT_DEFS_upload := -DFT_FAULT_UPLOAD_NO_WAIT
$(BUILD)/emu/fault_%/fsdp.o: src/fsdp.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FAULT_DEFS_$*) -c $< -o $@
$(BUILD)/emu/fault_%/comm_nccl.o: src/comm_nccl.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FAULT_DEFS_$*) -c $< -o $@
$(BUILD)/emu/fault_%/model.o: src/model.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(FAULT_DEFS_$*) -c $< -o $@
# (the faulted objects come first, so the library's own fsdp.o, comm_nccl.o and model.o are
# not linked)
$(BUILD)/tests/finetune_emu_fault_%: $(BUILD)/emu/fault_%/fsdp.o $(BUILD)/emu/fault_%/comm_nccl.o \
                                    $(BUILD)/emu/fault_%/model.o \
                                    $(BUILD)/obj/main.o $(EMU_HOST_OBJS) $(BUILD)/libfinetune.a \
                                    $(KERNEL_EMU_GPU_OBJS) $(EMU_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@ $(EMU_LDLIBS) $(filter-out $(CUDA_LDLIBS),$(LDLIBS))
.PRECIOUS: $(BUILD)/emu/fault_%/fsdp.o $(BUILD)/emu/fault_%/comm_nccl.o $(BUILD)/emu/fault_%/model.o

EXTRA_TEST_DEPS += $(BUILD)/tests/finetune_emu $(BUILD)/tests/finetune_emu_fault_prefetch \
                   $(BUILD)/tests/finetune_emu_fault_rs $(BUILD)/tests/finetune_emu_fault_offload \
                   $(BUILD)/tests/finetune_emu_fault_ar $(BUILD)/tests/finetune_emu_fault_upload
-include $(wildcard $(BUILD)/emu/fault_*/*.d)
# tests/cuda_emu/test_emu_host.cpp: the emulated cuBLASLt's and NCCL's aliasing rules
$(BUILD)/tests/test_emu_host: tests/cuda_emu/test_emu_host.cpp $(BUILD)/emu/cuda_emu_host.o $(EMU_OBJ) $(EMU_PRICE_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(if $(filter 1,$(MPI)),$(filter -I%,$(MPI_FLAGS)) -DFT_HAVE_MPI) $(filter %.cpp %.o,$^) -o $@ $(EMU_LDLIBS) \
	  $(if $(filter 1,$(MPI)),$(filter-out -I%,$(MPI_FLAGS)))
# tests/cuda_emu/test_emu_vclock.cu: the virtual clock's rules (one process, a few seconds: a C
# test of the fast tier; tests/test_emu_vclock.sh also runs it clock off and on 2 ranks); MPI
# builds only
ifeq ($(MPI),1)
$(BUILD)/tests/test_emu_vclock: tests/cuda_emu/test_emu_vclock.cu $(BUILD)/emu/cuda_emu_host.o $(EMU_OBJ) $(EMU_PRICE_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) $(filter -I%,$(MPI_FLAGS)) -DFT_HAVE_MPI -x c++ $< -x none $(filter %.o,$^) -o $@ $(EMU_LDLIBS) \
	  $(filter-out -I%,$(MPI_FLAGS))
TEST_BINS += $(BUILD)/tests/test_emu_vclock
CUDA_ONLY_TEST_BINS += $(BUILD)/tests/test_emu_vclock
endif
# tests/gpu/test_fp8_gpu.c (the FP8 ops, CUDA vs CPU) on the emulated device, an emulated sm_90
$(BUILD)/tests/test_fp8_emu: tests/gpu/test_fp8_gpu.c $(EMU_HOST_OBJS) $(BUILD)/libfinetune.a \
                             $(KERNEL_EMU_GPU_OBJS) $(EMU_OBJ) $(EMU_PRICE_OBJ)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests -c $< -o $@.o
	$(CXX) $@.o $(filter-out $<,$^) -o $@ $(EMU_LDLIBS) $(filter-out $(CUDA_LDLIBS),$(LDLIBS))
TEST_BINS += $(BUILD)/tests/test_fp8_emu
CUDA_ONLY_TEST_BINS += $(BUILD)/tests/test_fp8_emu
TEST_BINS += $(BUILD)/tests/test_backend_emu $(BUILD)/tests/test_emu_host
CUDA_ONLY_TEST_BINS += $(BUILD)/tests/test_backend_emu $(BUILD)/tests/test_emu_host   # not in the CUDA=0 sanitizer build
endif
-include $(wildcard $(BUILD)/emu/kernels/*.d $(BUILD)/emu/kernels_gpumath/*.d)
endif

# ---------------------------------------------------------------- nvcc
# One nvcc per file builds every architecture; files compile in parallel. The fatbin holds
# SASS for each of NVCC_SASS_ARCHS (sm_80: A100, sm_90: H100/H200) and the PTX of
# NVCC_PTX_ARCH (the newest of them), which the driver compiles when the program first loads
# on a GPU newer than every SASS here (Blackwell: sm_100, sm_120). tests/gpu/first_light.sh
# builds for the local GPU only (NVCC_SASS_ARCHS=<its sm> NVCC_PTX_ARCH=); an empty
# NVCC_PTX_ARCH embeds no PTX. Objects rebuild when the flags change (a stamp file).
NVCC_SASS_ARCHS ?= 80 90
NVCC_PTX_ARCH ?= 90
comma := ,
NVCC_ARCH_FLAGS := $(foreach a,$(NVCC_SASS_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
                   $(foreach a,$(NVCC_PTX_ARCH),-gencode arch=compute_$(a)$(comma)code=compute_$(a))
# what the build holds for which GPUs ("sm_80 sm_90": cubins; "compute_XX": PTX), for the CUDA
# backend's check at open (src/backend_cuda.c); empty when the flags use another form
NVCC_CODES := $(patsubst code=%,%,$(filter code=% sm_% compute_%,$(subst [,,$(subst ],,$(subst $(comma), ,$(NVCC_ARCH_FLAGS))))))
CFLAGS += -DFT_CUDA_CODES='"$(NVCC_CODES)"'
NVCC_FLAGS := -O3 -std=c++17 -Isrc -Ikernels $(NVCC_ARCH_FLAGS) -Werror all-warnings \
              -Xptxas -v,--warn-on-spills,--warn-on-local-memory-usage \
              -Xcompiler -Wall,-Wextra $(NVCC_EXTRA)
# NVCC_EXTRA: more nvcc flags, e.g. -lineinfo (tests/gpu/first_light.sh: source lines in
# compute-sanitizer's reports; no effect on the generated code's speed)
NVCC_OBJS := $(patsubst kernels/%.cu,$(BUILD)/nvcc/%.o,$(KERNEL_SRCS))
NVCC_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
NVCC_STAMP := $(BUILD)/nvcc/flags.stamp

# (rewritten while the Makefile is read, only when the flags changed, so that `make -n` / `-q`
# see unchanged flags as up to date; the rule makes it only when missing: `make clean all`)
NVCC_STAMP_LINE := echo '$(NVCC) $(NVCC_FLAGS)'
ifeq ($(MAKE_WRITES),yes)
_ := $(shell mkdir -p $(dir $(NVCC_STAMP)) && { $(NVCC_STAMP_LINE) | cmp -s - $(NVCC_STAMP) || $(NVCC_STAMP_LINE) > $(NVCC_STAMP); })
endif
$(NVCC_STAMP):
	@mkdir -p $(dir $@) && $(NVCC_STAMP_LINE) > $@

# (the backend's FT_CUDA_CODES comes from the same flags)
$(BUILD)/obj/backend_cuda.o: $(NVCC_STAMP)

$(BUILD)/nvcc/%.o: kernels/%.cu $(KERNEL_HDRS) $(NVCC_STAMP)
	@mkdir -p $(dir $@)
	@echo "nvcc $<"
	@$(NVCC) $(NVCC_FLAGS) -c $< -o $@ > $@.log 2>&1 || { cat $@.log; rm -f $@; exit 1; }

# every warning, spill and local-memory use is an error (NVCC_FLAGS); then the resource
# table, and each object's fatbin holds exactly the SASS and PTX asked for
.PHONY: nvcc-check
nvcc-check:
	@test -n "$(NVCC)" || { echo "nvcc-check: nvcc not found (set NVCC=...)"; exit 1; }
	@$(MAKE) --no-print-directory -j$(NVCC_JOBS) $(NVCC_OBJS)
	@sh kernels/nvcc_report.sh $(patsubst %,%.log,$(NVCC_OBJS))
	@python3 kernels/fatbin_check.py --sass "$(NVCC_SASS_ARCHS)" --ptx "$(NVCC_PTX_ARCH)" $(NVCC_OBJS)
