# SPDX-License-Identifier: Apache-2.0
# tests/fuzz/fuzz.mk -- libFuzzer targets, included by the top Makefile.
#
# A target is one file tests/fuzz/targets/<module>_<what>.c defining
# LLVMFuzzerTestOneInput; it builds to build/fuzz/<module>_<what> with clang
# from the module's SOURCES (never from gcc-built archives), listed in
# FUZZ_SRCS_<module> and linked with FUZZ_LIBS_<module>. Seed corpora live
# in tests/fuzz/corpus/<module>_<what>/. See tests/fuzz/README.md.
#
#   make build/fuzz/crypto_msg_open     one target
#   make fuzz-build                     all targets and corpus generators
#   tests/fuzz/run 10                   build, then run each for 10 s

FUZZ_CC      ?= clang
FUZZ_CFLAGS  ?= -g -O1
FUZZ_SAN     ?= -fsanitize=address,undefined -fno-sanitize-recover=all \
                -fno-omit-frame-pointer
FUZZ_CPPFLAGS = -std=c11 -D_GNU_SOURCE -I. -I$(B)

FUZZ_SRCS_common = common/err.c common/log.c common/util.c

# crypto/: the library sources, not the keygen program.
FUZZ_SRCS_crypto = $(filter-out crypto/keygen.c,$(wildcard crypto/*.c)) \
                   $(FUZZ_SRCS_common)
FUZZ_LIBS_crypto = -lsodium -lcrypto -lm -lpthread

# secagg_*: the secure-aggregation decoders of crypto/ (secagg.c), with
# their round fixture tests/fuzz/secagg_common.h.
FUZZ_SRCS_secagg = $(FUZZ_SRCS_crypto)
FUZZ_LIBS_secagg = $(FUZZ_LIBS_crypto)
FUZZ_HDRS_secagg = $(wildcard crypto/*.h)

# proto/: the decoders, the generated protobuf-c code, and crypto/ (which
# secure.c calls to seal and open frames; it brings common/). link.c stays
# in because secure.c sends through it; no target opens a socket.
FUZZ_SRCS_proto = $(filter-out %/main.c,$(wildcard proto/*.c)) \
                  $(B)/proto/fedbox.pb-c.c $(FUZZ_SRCS_crypto)
FUZZ_LIBS_proto = -lprotobuf-c -lzmq $(FUZZ_LIBS_crypto)
# Headers of other modules a module's targets depend on (for rebuilds).
FUZZ_HDRS_proto = $(wildcard crypto/*.h) $(B)/proto/fedbox.pb-c.h

# data/: the file readers (CSV, .npy, .npz, IDX) and normalisation.
FUZZ_SRCS_data = $(wildcard data/*.c) $(FUZZ_SRCS_common)
FUZZ_LIBS_data = -lz -lm
FUZZ_HDRS_data = $(wildcard model/*.h)
# worker/: the trainer-process messages, and model/ for the layouts they
# are checked against.
FUZZ_SRCS_worker = worker/proc/wire.c $(wildcard model/*.c model/cpu/*.c) \
                   $(FUZZ_SRCS_common)
FUZZ_LIBS_worker = -lm -ldl -lpthread
FUZZ_HDRS_worker = $(wildcard model/*.h worker/proc/*.h)

# model/: the layouts a welcome carries (model/layout.c), with the rest of
# model/ they are built into.
FUZZ_SRCS_model = $(wildcard model/*.c model/cpu/*.c) $(FUZZ_SRCS_common)
FUZZ_LIBS_model = -lm -ldl -lpthread

FUZZ_NAMES := $(patsubst tests/fuzz/targets/%.c,%,\
                $(wildcard tests/fuzz/targets/*.c))
FUZZ_GENS  := $(patsubst tests/fuzz/gen/%.c,%,$(wildcard tests/fuzz/gen/*.c))
fuzz_module = $(firstword $(subst _, ,$(1)))

define fuzz_target_rule
$(B)/fuzz/$(1): tests/fuzz/targets/$(1).c \
    $$(FUZZ_SRCS_$(call fuzz_module,$(1))) $$(wildcard tests/fuzz/*.h \
    $(call fuzz_module,$(1))/*.h common/*.h) \
    $$(FUZZ_HDRS_$(call fuzz_module,$(1)))
	@mkdir -p $$(@D)
	$$(FUZZ_CC) $$(FUZZ_CPPFLAGS) $$(FUZZ_CFLAGS) $$(FUZZ_SAN) \
	    -fsanitize=fuzzer -o $$@ $$< \
	    $$(FUZZ_SRCS_$(call fuzz_module,$(1))) \
	    $$(FUZZ_LIBS_$(call fuzz_module,$(1)))
endef

# Corpus generators: plain programs (no libFuzzer main), same sources.
define fuzz_gen_rule
$(B)/fuzz/gen/$(1): tests/fuzz/gen/$(1).c \
    $$(FUZZ_SRCS_$(call fuzz_module,$(1))) $$(wildcard tests/fuzz/*.h \
    $(call fuzz_module,$(1))/*.h common/*.h) \
    $$(FUZZ_HDRS_$(call fuzz_module,$(1)))
	@mkdir -p $$(@D)
	$$(FUZZ_CC) $$(FUZZ_CPPFLAGS) $$(FUZZ_CFLAGS) $$(FUZZ_SAN) \
	    -o $$@ $$< $$(FUZZ_SRCS_$(call fuzz_module,$(1))) \
	    $$(FUZZ_LIBS_$(call fuzz_module,$(1)))
endef

$(foreach t,$(FUZZ_NAMES),$(eval $(call fuzz_target_rule,$(t))))
$(foreach g,$(FUZZ_GENS),$(eval $(call fuzz_gen_rule,$(g))))

.PHONY: fuzz-build
fuzz-build: $(FUZZ_NAMES:%=$(B)/fuzz/%) $(FUZZ_GENS:%=$(B)/fuzz/gen/%)
