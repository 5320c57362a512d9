# SPDX-License-Identifier: Apache-2.0
# fedbox -- one GNU Makefile, everything built under build/.
#
#   make            build binaries, libraries and tests (installs Debian deps)
#   make test       unit + integration tests
#   make test-hostile  the door's flood test at its acceptance sizes
#   make demo       4-worker federation on Fashion-MNIST (runs/demo/)
#   make example-pytorch-cnn   the same with a PyTorch CNN in trainer
#                   processes (runs/pytorch-cnn/; EXAMPLE_ARGS=... adds
#                   fedbox-local options, e.g. --device cuda --torchrun 2)
#   make fuzz       run every fuzz target for a while
#   make install    PREFIX=/usr/local DESTDIR=... (bin, lib/fedbox, man, doc)
#   make test-deploy  heavy deploy checks: .deb in a chroot, image, Slurm
#   make test-faults  the fault suite's long variants (tests/faults/run)
# Knobs: CFLAGS, SAN=address,undefined, CUDA=0|1, CUDA_HOME, DEBUG=1,
#        WERROR=1 (CI), BOOTSTRAP=0 (skip the package check).

CC       ?= cc
CFLAGS   ?= -O2 -g
ifeq ($(DEBUG),1)
CFLAGS   := -O0 -g3
endif
WARN      = -std=c11 -Wall -Wextra -Wpedantic -Wshadow -Wformat=2 \
            -Wcast-qual -Wmissing-prototypes -Wstrict-prototypes -Wvla \
            -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN     += -Werror
endif
# Sanitizer builds live in their own tree so they never mix with normal ones
# (nor with each other: SAN=thread builds in build/san-thread).
comma := ,
B := build$(if $(SAN),/san-$(subst $(comma),-,$(SAN)))
CPPFLAGS += -D_GNU_SOURCE -I. -I$(B)
LDLIBS    = -lzmq -lprotobuf-c -lsodium -lcrypto -lyaml -lz -lm -lpthread -ldl
ifdef SAN
CFLAGS   += -fsanitize=$(SAN) -fno-omit-frame-pointer -fno-sanitize-recover=all
LDFLAGS  += -fsanitize=$(SAN)
endif
# Compute kernels are built with -O3 so that the inner loops vectorise.
KERNEL_CFLAGS = -O3 -fno-math-errno

# CUDA backend: built whenever nvcc is found, unless CUDA=0.
CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
ifeq ($(origin CUDA),undefined)
CUDA := $(if $(wildcard $(NVCC)),1,0)
endif

.DEFAULT_GOAL := all
.PHONY: all test test-hostile demo fuzz bench clean bootstrap install \
        test-deploy test-chaos test-faults example-tabular example-pytorch-cnn

bootstrap:
ifneq ($(BOOTSTRAP),0)
	@scripts/bootstrap
endif

# ---- generated protocol code ------------------------------------------------
$(B)/proto/fedbox.pb-c.c $(B)/proto/fedbox.pb-c.h: proto/fedbox.proto
	@mkdir -p $(B)/proto
	protoc-c --proto_path=proto --c_out=$(B)/proto proto/fedbox.proto

$(B)/proto/fedbox.pb-c.o: $(B)/proto/fedbox.pb-c.c
	$(CC) $(CPPFLAGS) -std=c11 $(CFLAGS) -MMD -MP -c $< -o $@

# ---- modules -> static archives ---------------------------------------------
# Each module's sources: its folder plus cpu/ for kernels; main.c files and
# tools are programs, not library members.
define module_srcs
$(filter-out %/main.c %/keygen.c,$(wildcard $(1)/*.c $(1)/cpu/*.c))
endef
MODULES   = common proto data model crypto aggregation worker coordinator
$(foreach m,$(MODULES),$(eval SRCS_$(m) := $(call module_srcs,$(m))))
# The trainer-process backend (worker/proc/) is part of the worker module.
SRCS_worker += $(wildcard worker/proc/*.c)
$(foreach m,$(MODULES),$(eval OBJS_$(m) := $(SRCS_$(m):%.c=$(B)/%.o)))
OBJS_proto += $(B)/proto/fedbox.pb-c.o

# What each module may use (dependencies point down).
DEPS_common      = common
DEPS_proto       = proto crypto common
DEPS_data        = data common
DEPS_model       = model common
DEPS_crypto      = crypto common
DEPS_aggregation = aggregation common
DEPS_worker      = worker model data aggregation proto crypto common
DEPS_worker_sm   = $(DEPS_worker)
DEPS_coordinator = coordinator model data aggregation proto crypto common
DEPS_rules       = aggregation common
DEPS_fedbuff     = aggregation common
DEPS_metrics_http = coordinator common
DEPS_worker_proc = $(DEPS_worker)
DEPS_secagg = crypto aggregation common
DEPS_secagg_engine = crypto common
DEPS_round  = coordinator model data aggregation proto crypto common

libs_of = $(foreach d,$(DEPS_$(1)),$(B)/lib/libfb_$(d).a)

$(B)/lib/libfb_%.a:
	@mkdir -p $(@D)
	@rm -f $@
	$(AR) rcs $@ $^
$(foreach m,$(MODULES),$(eval $(B)/lib/libfb_$(m).a: $(OBJS_$(m))))

# Everything that includes generated headers waits for them.
ALL_OBJS = $(foreach m,$(MODULES),$(OBJS_$(m)))
$(filter-out $(B)/proto/fedbox.pb-c.o,$(ALL_OBJS)): | $(B)/proto/fedbox.pb-c.h

$(B)/%.o: %.c
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CPPFLAGS) $(CFLAGS) -MMD -MP -c $< -o $@

$(B)/model/cpu/%.o: model/cpu/%.c
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CPPFLAGS) $(CFLAGS) $(KERNEL_CFLAGS) -MMD -MP -c $< -o $@

$(B)/aggregation/%.o: aggregation/%.c
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CPPFLAGS) $(CFLAGS) $(KERNEL_CFLAGS) -MMD -MP -c $< -o $@

# The mask expansion's add pass (SecAgg) is a kernel too: -O2 leaves it scalar.
$(B)/crypto/mask.o: crypto/mask.c
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CPPFLAGS) $(CFLAGS) $(KERNEL_CFLAGS) -MMD -MP -c $< -o $@

# bench/accum_add keeps a copy of the old add loops, built as the kernels are.
$(B)/bench/accum_add.o: bench/accum_add.c
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CPPFLAGS) $(CFLAGS) $(KERNEL_CFLAGS) -MMD -MP -c $< -o $@

# ---- programs ----------------------------------------------------------------
BINS = $(B)/fedbox-coordinator $(B)/fedbox-worker
ifneq ($(wildcard crypto/keygen.c),)
BINS += $(B)/fedbox-keygen
$(B)/fedbox-keygen: $(B)/crypto/keygen.o $(call libs_of,crypto)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
endif

$(B)/fedbox-coordinator: $(B)/coordinator/main.o $(call libs_of,coordinator)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $^ $(LDLIBS)
$(B)/fedbox-worker: $(B)/worker/main.o $(call libs_of,worker)
	$(CC) $(LDFLAGS) -rdynamic -o $@ $^ $(LDLIBS)

# ---- CUDA backend (a shared library the worker loads at run time) ----------
# worker/cuda/cuda.mk may add GPU test and bench programs.
-include worker/cuda/cuda.mk
ifeq ($(CUDA),1)
CU_SRCS  = $(wildcard worker/cuda/*.cu)
CU_CSRCS = $(wildcard worker/cuda/*.c)
ifneq ($(CU_SRCS),)
NVCCFLAGS ?= -O3 -std=c++17 -gencode arch=compute_90,code=sm_90 \
             -gencode arch=compute_90,code=compute_90 \
             -Xcompiler -fPIC,-Wall
CU_OBJS  = $(CU_SRCS:%.cu=$(B)/%.cu.o) $(CU_CSRCS:%.c=$(B)/%.pic.o)
BINS    += $(B)/libfedbox-cuda.so
$(B)/%.cu.o: %.cu
	@mkdir -p $(@D)
	$(NVCC) $(NVCCFLAGS) -I. -I$(B) -MMD -MP -c $< -o $@
$(B)/%.pic.o: %.c
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CPPFLAGS) -I$(CUDA_HOME)/include $(CFLAGS) -fPIC \
	    -MMD -MP -c $< -o $@
$(B)/libfedbox-cuda.so: $(CU_OBJS)
	$(NVCC) -shared -o $@ $^ -L$(CUDA_HOME)/lib64 -lcudart -lcublas -lnccl \
	    -Xlinker -rpath,$(CUDA_HOME)/lib64
endif
endif

# ---- example plug-in model ---------------------------------------------------
PLUGINS = $(patsubst examples/%/plugin.c,$(B)/examples/%.so,$(wildcard examples/*/plugin.c))
$(B)/examples/%.so: examples/%/plugin.c
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CPPFLAGS) $(CFLAGS) -fPIC -shared -o $@ $< -lm

# ---- tests -------------------------------------------------------------------
UNIT_SRCS  = $(wildcard tests/unit/*_test.c)
UNIT_BINS  = $(UNIT_SRCS:tests/unit/%.c=$(B)/tests/%)
$(B)/tests/%_test: $(B)/tests/unit/%_test.o $(B)/tests/unit/harness.o
	@mkdir -p $(@D)
	$(CC) $(LDFLAGS) -o $@ $^ -lcmocka $(LDLIBS)
# A test links its module's archive and what that module may use.
$(foreach t,$(UNIT_SRCS:tests/unit/%_test.c=%),\
  $(eval $(B)/tests/$(t)_test: $(call libs_of,$(t))))

# A coordinator that lies in the secure-aggregation consistency check
# (coordinator/secagg.c and upload.c under FB_TEST_LIAR), for the
# tests/integration/*_liar.sh tests only; never installed.
LIAR = $(B)/tests/fedbox-coordinator-liar
LIAR_SRCS = coordinator/secagg.c coordinator/upload.c
$(B)/tests/liar/%.o: coordinator/%.c | $(B)/proto/fedbox.pb-c.h
	@mkdir -p $(@D)
	$(CC) $(WARN) $(CPPFLAGS) $(CFLAGS) -DFB_TEST_LIAR -MMD -MP -c $< -o $@
$(LIAR): $(B)/coordinator/main.o \
    $(LIAR_SRCS:coordinator/%.c=$(B)/tests/liar/%.o) \
    $(filter-out $(LIAR_SRCS:coordinator/%.c=$(B)/coordinator/%.o),\
      $(OBJS_coordinator)) \
    $(filter-out %/libfb_coordinator.a,$(call libs_of,coordinator))
	$(CC) $(LDFLAGS) -rdynamic -o $@ $^ $(LDLIBS)

TOOL_SRCS = $(wildcard tests/tools/*.c bench/*.c)
TOOL_BINS = $(patsubst %.c,$(B)/%,$(TOOL_SRCS))
$(B)/tests/tools/%: $(B)/tests/tools/%.o $(call libs_of,coordinator)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
$(B)/bench/%: $(B)/bench/%.o $(call libs_of,coordinator)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)
# The trainer-process boundary is the worker's.
$(B)/bench/trainer_boundary: $(B)/bench/trainer_boundary.o $(call libs_of,worker)
	$(CC) $(LDFLAGS) -o $@ $^ $(LDLIBS)

# libmicrohttpd serves the coordinator's Prometheus endpoint
# (coordinator/metrics_http.c, its only user): only programs that link the
# coordinator's archive get it, never the worker.
$(B)/fedbox-coordinator $(B)/tests/metrics_http_test $(B)/tests/round_test \
    $(B)/tests/coordinator_test $(TOOL_BINS) $(LIAR): LDLIBS += -lmicrohttpd

all: bootstrap
	@$(MAKE) --no-print-directory build-all

.PHONY: build-all programs
build-all: $(BINS) $(UNIT_BINS) $(TOOL_BINS) $(PLUGINS) $(LIAR)
# Only what make install ships (the Debian package builds this).
programs: $(BINS)

test: all
ifneq ($(BOOTSTRAP),0)
	@scripts/bootstrap test
endif
	@FB_BUILD=$(B) tests/run

# Hostile peers at the door at the acceptance sizes (2,000 idle and 300
# partial-frame connections; tests/integration/door.sh): a few minutes.
test-hostile: all
	@FB_BUILD=$(B) FB_ONLY=door FB_DOOR_FULL=1 FB_FUZZ_SECONDS=0 tests/run

# The demo's federated run, then an independent check of the exported model
# (numpy reading the safetensors file; a test tool, not part of the product)
# and the plots of its metrics (runs/demo/accuracy.png, workers.png).
DEMO_PORT ?= 5555
demo: all
	@rm -rf runs/demo
	scripts/fedbox-local --workers 4 --rounds 20 --alpha 0.5 \
	    --out runs/demo --port $(DEMO_PORT)
	@echo "independent evaluation of runs/demo/model.safetensors:"
	@/usr/bin/python3 tests/tools/st_eval.py runs/demo/model.safetensors
	@scripts/fedbox-plot runs/demo/metrics.jsonl --out runs/demo

# examples/tabular: three hospitals' breast-cancer CSV files, trained
# natively (runs/tabular/); ends with a numpy evaluation of the model.
example-tabular: all
	examples/tabular/run --out runs/tabular

# The pytorch-cnn example: the same federation, each worker's training done
# by a PyTorch trainer process (examples/pytorch-cnn/), then an independent
# PyTorch evaluation of the exported model.
EXAMPLE_ARGS ?=
example-pytorch-cnn: all
	@rm -rf runs/pytorch-cnn
	scripts/fedbox-local --example pytorch-cnn --workers 4 --rounds 20 \
	    --alpha 0.5 --secure on --epochs 1 --batch 64 --lr 0.05 \
	    --momentum 0.9 --out runs/pytorch-cnn --port $(DEMO_PORT) \
	    $(EXAMPLE_ARGS)

bench: all
	bench/round_overhead

fuzz: all
	@tests/fuzz/run $(or $(FUZZ_SECONDS),60)

# tests/fuzz/fuzz.mk defines the libFuzzer targets (clang).
-include tests/fuzz/fuzz.mk

# ---- install -------------------------------------------------------------------
# The standard layout under $(DESTDIR)$(PREFIX): programs in bin/, the CUDA
# backend in lib/fedbox/ (where the worker looks after its own folder), man
# pages made from each program's --help by help2man, and the example
# configs, the key reference and the licence in share/doc/fedbox/.
PREFIX  ?= /usr/local
BINDIR  ?= $(PREFIX)/bin
LIBDIR  ?= $(PREFIX)/lib
MANDIR  ?= $(PREFIX)/share/man
DOCDIR  ?= $(PREFIX)/share/doc/fedbox
INSTALL ?= install
PROGS    = fedbox-coordinator fedbox-worker fedbox-keygen
MANS     = $(PROGS:%=$(B)/man/%.1) $(B)/man/fedbox-provision.1
MAN_NAME_fedbox-coordinator = run federated training rounds over ZeroMQ
MAN_NAME_fedbox-worker      = train on the local data for a fedbox coordinator
MAN_NAME_fedbox-keygen      = make an Ed25519 identity for fedbox
MAN_NAME_fedbox-provision   = make startup kits for a fedbox federation

$(B)/man/%.1: $(B)/%
	@mkdir -p $(@D)
	help2man --no-info --no-discard-stderr --section=1 \
	    --name='$(MAN_NAME_$*)' --output=$@ ./$<
$(B)/man/fedbox-provision.1: scripts/fedbox-provision
	@mkdir -p $(@D)
	help2man --no-info --section=1 --name='$(MAN_NAME_fedbox-provision)' \
	    --output=$@ ./$<

.PHONY: man
man: $(MANS)

install:
ifneq ($(BOOTSTRAP),0)
	@scripts/bootstrap install
endif
	@$(MAKE) --no-print-directory programs man
	$(INSTALL) -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(MANDIR)/man1 \
	    $(DESTDIR)$(DOCDIR)/examples
	$(INSTALL) -m 0755 $(PROGS:%=$(B)/%) scripts/fedbox-provision \
	    $(DESTDIR)$(BINDIR)/
	$(if $(wildcard $(B)/libfedbox-cuda.so),$(INSTALL) -d \
	    $(DESTDIR)$(LIBDIR)/fedbox && $(INSTALL) -m 0644 \
	    $(B)/libfedbox-cuda.so $(DESTDIR)$(LIBDIR)/fedbox/)
	$(INSTALL) -m 0644 $(MANS) $(DESTDIR)$(MANDIR)/man1/
	$(INSTALL) -m 0644 configs/coordinator.yaml configs/worker.yaml \
	    deploy/hosts.example $(DESTDIR)$(DOCDIR)/examples/
	$(INSTALL) -m 0644 configs/README.md $(DESTDIR)$(DOCDIR)/config-reference.md
	$(INSTALL) -m 0644 README.md LICENSE $(DESTDIR)$(DOCDIR)/

# Heavy deployment checks, each starting what it needs and skipping (with
# the reason) where this machine cannot run it: the .deb installed in a
# debootstrap chroot, the container image with podman, a one-node Slurm.
test-deploy: all
ifneq ($(BOOTSTRAP),0)
	@scripts/bootstrap deploy
endif
	@FB_BUILD=$(B) tests/deploy/run

# The coordinator killed 50 times per run and resumed, for three rules,
# plain and secure (tests/faults/chaos.sh; tens of minutes).
test-chaos: all
	@FB_BUILD=$(B) tests/faults/chaos.sh

# The fault suite's long variants: 5 s and 60 s partitions, a slow and a
# lossy link, a 10-minute outage, a full and a read-only disk
# (tests/faults/run; about 20 minutes; make test runs the short ones).
test-faults: all
	@FB_BUILD=$(B) tests/faults/run

clean:
	rm -rf $(B)

-include $(shell find $(B) -name '*.d' $(if $(SAN),,-not -path 'build/san-*') 2>/dev/null)
