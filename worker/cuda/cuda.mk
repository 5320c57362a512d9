# SPDX-License-Identifier: Apache-2.0
# worker/cuda/cuda.mk -- GPU test and benchmark programs (included by the
# top Makefile before its CUDA section). They link the CUDA backend
# (build/libfedbox-cuda.so, found through an $ORIGIN rpath) and the worker's
# static archives; -rdynamic exports the fb_* symbols the backend calls:
# fb_log, fb_model_get_ops, fb_model_param_count, fb_model_tensor_count,
# fb_model_tensor_info, fb_model_task, fb_train_batch_order, fb_model_mlp_ops,
# fb_model_logreg_ops.
ifeq ($(CUDA),1)
GPU_PROGS = $(B)/tests/gpu/cuda_check $(B)/bench/gpu/fedbox_bench \
    $(B)/tests/gpu/mask_check $(B)/bench/gpu/mask_bench
ifndef SAN
GPU_PROGS += $(B)/tests/gpu/mask_host_check
endif
BINS += $(GPU_PROGS)

.PHONY: gpu
gpu: $(B)/libfedbox-cuda.so $(GPU_PROGS)

$(B)/tests/gpu/cuda_check: $(B)/tests/gpu/cuda_check.o \
    $(B)/libfedbox-cuda.so $(call libs_of,worker)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $< -L$(B) -lfedbox-cuda \
	    $(call libs_of,worker) $(LDLIBS) -Wl,-rpath,'$$ORIGIN/../..'

$(B)/bench/gpu/fedbox_bench: $(B)/bench/gpu/fedbox_bench.o \
    $(B)/libfedbox-cuda.so $(call libs_of,worker)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $< -L$(B) -lfedbox-cuda \
	    $(call libs_of,worker) $(LDLIBS) -Wl,-rpath,'$$ORIGIN/../..'

# The mask check and bench compare the GPU with crypto/'s fb_mask_apply
# (libsodium), which the worker's archives already hold.
$(B)/tests/gpu/mask_check: $(B)/tests/gpu/mask_check.o \
    $(B)/libfedbox-cuda.so $(call libs_of,worker)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $< -L$(B) -lfedbox-cuda \
	    $(call libs_of,worker) $(LDLIBS) -Wl,-rpath,'$$ORIGIN/../..'

$(B)/bench/gpu/mask_bench: $(B)/bench/gpu/mask_bench.o \
    $(B)/libfedbox-cuda.so $(call libs_of,worker)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $< -L$(B) -lfedbox-cuda \
	    $(call libs_of,worker) $(LDLIBS) -Wl,-rpath,'$$ORIGIN/../..'

# The kernel's block code compiled for the host, checked against
# fb_mask_apply where there is no GPU (tests/run runs it). nvcc links it,
# so the sanitizer builds, whose archives need the sanitizer runtime, skip
# it.
ifndef SAN
$(B)/tests/gpu/mask_host_check: tests/gpu/mask_host_check.cu \
    worker/cuda/mask.cu worker/cuda/cuda_impl.h $(call libs_of,crypto)
	@mkdir -p $(@D)
	$(NVCC) -O2 -std=c++17 -Xcompiler -Wall -I. -I$(B) -o $@ $< \
	    $(call libs_of,crypto) -lsodium -lcrypto
endif
endif
