# tests/nccl_standin/standin.mk: the TEST-ONLY NCCL stand-in (nccl_standin.c says what it is),
# included by the Makefile after kernels.mk. Built when CUDA=1 and MPI=1:
#
#   $(BUILD)/tests/libnccl_standin.so      against the real CUDA runtime (libcudart), for
#                                          several ranks on one real GPU (tests/gpu/multi_rank_gpu.sh)
#   $(BUILD)/tests/libnccl_standin_emu.so  against the emulated runtime: no libcudart; its CUDA
#                                          calls resolve, when finetune_emu dlopens it
#                                          (FT_NCCL_LIBRARY), to the emulator's, which
#                                          finetune_emu exports (-rdynamic, kernels.mk)
#                                          (tests/test_nccl_standin.sh)
#
# -Wl,-Bsymbolic: its own NCCL functions bind to themselves, never to the emulated NCCL that
# finetune_emu exports under the same names.
ifeq ($(CUDA)$(MPI),11)
STANDIN_CFLAGS := -std=gnu11 $(OPT) -g -Wall -Wextra -fPIC -shared -pthread -isystem $(CUDA_HOME)/include \
                  $(filter -I%,$(CFLAGS)) $(filter -I%,$(MPI_FLAGS))
STANDIN_MPI_LIBS := $(filter-out -I%,$(MPI_FLAGS)) $(filter -L% -Wl%,$(LDLIBS))

$(BUILD)/tests/libnccl_standin.so: tests/nccl_standin/nccl_standin.c
	@mkdir -p $(dir $@)
	$(CC) $(STANDIN_CFLAGS) $< -o $@ -Wl,-Bsymbolic -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudart \
	  $(STANDIN_MPI_LIBS)
EXTRA_TEST_DEPS += $(BUILD)/tests/libnccl_standin.so

ifneq ($(EMU_OK),)
$(BUILD)/tests/libnccl_standin_emu.so: tests/nccl_standin/nccl_standin.c
	@mkdir -p $(dir $@)
	$(CC) $(STANDIN_CFLAGS) $< -o $@ -Wl,-Bsymbolic $(STANDIN_MPI_LIBS)
# TEST-ONLY FAULT FT_FAULT_SKIP_GATE: the copy back does not wait for the exchange (the
# stream's gate is left out), which the emulator's checker must report (tests/test_nccl_standin.sh)
$(BUILD)/tests/libnccl_standin_emu_fault_gate.so: tests/nccl_standin/nccl_standin.c
	@mkdir -p $(dir $@)
	$(CC) $(STANDIN_CFLAGS) -DFT_FAULT_SKIP_GATE $< -o $@ -Wl,-Bsymbolic $(STANDIN_MPI_LIBS)
EXTRA_TEST_DEPS += $(BUILD)/tests/libnccl_standin_emu.so $(BUILD)/tests/libnccl_standin_emu_fault_gate.so
endif
endif
