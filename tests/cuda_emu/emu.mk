# tests/cuda_emu/emu.mk: the CPU emulator for CUDA kernel sources (included by the Makefile).
# Builds $(BUILD)/emu/cuda_emu.o and the emulator's self-test $(BUILD)/tests/test_emu, added
# to TEST_BINS (so `make test` and `make test-asan` run it). Needs only the CUDA headers (no
# GPU, no libcudart, no nvcc) and an x86-64 host; without them nothing is added.

CUDA_HOME ?= /usr/local/cuda
EMU_OK := $(and $(wildcard $(CUDA_HOME)/include/cuda_bf16.h),$(filter x86_64,$(shell uname -m)))

ifneq ($(EMU_OK),)
# -fno-strict-aliasing: kernels reinterpret bf16 arrays as uint4 for 16-byte loads.
EMU_CXXFLAGS := -std=gnu++17 $(OPT) -g -Wall -Wextra -Wno-unknown-pragmas -fno-strict-aliasing -pthread \
                -isystem $(CUDA_HOME)/include -Itests/cuda_emu -Itests -Isrc $(SANFLAGS) -MMD -MP
EMU_LDLIBS := -pthread -ldl $(SANFLAGS)
EMU_OBJ := $(BUILD)/emu/cuda_emu.o $(BUILD)/emu/cuda_emu_wmma.o $(BUILD)/emu/cuda_emu_stream.o \
           $(BUILD)/emu/cuda_emu_shadow.o $(BUILD)/emu/cuda_emu_vclock.o
# the virtual clock's prices (src/plan_price.c, a pure member of the library): a program that
# links EMU_OBJ without the library links this object
EMU_PRICE_OBJ := $(BUILD)/obj/plan_price.o
# the second build of kernel sources: the GPU's worst-case approximate math and FMA
# contraction (see "device functions" in cuda_emu.h)
EMU_GPU_MATH_FLAGS := -DCUEMU_GPU_MATH -mfma -ffp-contract=fast

$(EMU_OBJ): $(BUILD)/emu/%.o: tests/cuda_emu/%.cpp
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -c $< -o $@

# emulated .cu sources compile as C++
$(BUILD)/emu/%.o: tests/cuda_emu/%.cu
	@mkdir -p $(dir $@)
	$(CXX) $(EMU_CXXFLAGS) -x c++ -c $< -o $@

$(BUILD)/tests/test_emu: $(BUILD)/emu/test_emu.o $(EMU_OBJ) $(EMU_PRICE_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@ $(EMU_LDLIBS)

# the asynchronous runtime's own tests (streams, events, the ordering checker)
$(BUILD)/tests/test_emu_async: $(BUILD)/emu/test_emu_async.o $(EMU_OBJ) $(EMU_PRICE_OBJ)
	@mkdir -p $(dir $@)
	$(CXX) $^ -o $@ $(EMU_LDLIBS)

TEST_BINS += $(BUILD)/tests/test_emu $(BUILD)/tests/test_emu_async

-include $(wildcard $(BUILD)/emu/*.d)
endif
