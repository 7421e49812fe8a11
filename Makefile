# loom build. `make` builds build/loom and build/libloom.a, announcing what
# it found; `make demo` and `make test` are README's two commands and install
# what is missing first (scripts/install-deps.sh).

BUILD    ?= build
CC       ?= gcc
NATIVE   ?= 1
WERROR   ?= $(if $(CI),1,0)
PYTHON   ?= /usr/bin/python3

WARN   := -Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes
CFLAGS := -std=gnu11 -O3 -g $(WARN) -Iinclude -Isrc -fno-math-errno
ifeq ($(NATIVE),1)
CFLAGS += -march=native
endif
ifeq ($(WERROR),1)
CFLAGS += -Werror
endif
LDLIBS := -lm -lpthread

# ---- feature probes ---------------------------------------------------------
# BLAS: OpenBLAS built for OpenMP preferred (one thread pool with the kernels,
# single-threaded when called inside a parallel region); the pthread build
# works too.
OB_OMP := /usr/lib/x86_64-linux-gnu/openblas-openmp
ifneq ($(wildcard $(OB_OMP)/libopenblas.so),)
  BLAS_CFLAGS := -I/usr/include/x86_64-linux-gnu/openblas-openmp
  BLAS_LIBS   := -L$(OB_OMP) -Wl,-rpath,$(OB_OMP) -lopenblas
  BLAS_NAME   := OpenBLAS (OpenMP build)
else ifneq ($(shell pkg-config --exists openblas 2>/dev/null && echo y),)
  BLAS_CFLAGS := $(shell pkg-config --cflags openblas)
  BLAS_LIBS   := $(shell pkg-config --libs openblas)
  BLAS_NAME   := OpenBLAS (pkg-config)
else
  BLAS_NAME   :=
endif
CFLAGS += $(BLAS_CFLAGS)
LDLIBS += $(BLAS_LIBS)

HAVE_OPENMP := $(shell echo 'int main(void){return 0;}' | $(CC) -fopenmp -x c - -o /dev/null 2>/dev/null && echo 1)
ifeq ($(HAVE_OPENMP),1)
CFLAGS += -fopenmp
LDLIBS += -fopenmp
endif

HAVE_CJSON := $(shell pkg-config --exists libcjson 2>/dev/null && echo 1)
ifeq ($(HAVE_CJSON),1)
CFLAGS += $(shell pkg-config --cflags libcjson)
LDLIBS += $(shell pkg-config --libs libcjson)
endif

# PCRE2: the tokenizers' pre-tokenization patterns (tokenizer/bpe.c)
HAVE_PCRE2 := $(shell pkg-config --exists libpcre2-8 2>/dev/null && echo 1)
ifeq ($(HAVE_PCRE2),1)
CFLAGS += $(shell pkg-config --cflags libpcre2-8)
LDLIBS += $(shell pkg-config --libs libpcre2-8)
endif

# liburing: the offload files' asynchronous I/O (optim/offload.c)
HAVE_URING := $(shell pkg-config --exists liburing 2>/dev/null && echo 1)
ifeq ($(HAVE_URING),1)
CFLAGS += $(shell pkg-config --cflags liburing)
LDLIBS += $(shell pkg-config --libs liburing)
endif

HAVE_XXHASH := $(shell echo '\#include <xxhash.h>' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_XXHASH),1)
LDLIBS += -lxxhash
endif

# oneDNN: the bf16 matrix products (kernels/cpu/matmul_bf16.c); without it bf16 computes in float32
HAVE_DNNL := $(shell echo '\#include <dnnl.h>' | $(CC) -E -x c - >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_DNNL),1)
CFLAGS += -DLOOM_HAVE_DNNL=1
LDLIBS += -ldnnl
endif

# libsentencepiece: SentencePiece models (tokenizer/spm.c, through its C face
# tokenizer/spm_lib.cc, the one C++ file); without it a tokenizer.model is refused
CXX      ?= g++
HAVE_SPM := $(shell pkg-config --exists sentencepiece 2>/dev/null && echo '\#include <sentencepiece_processor.h>' | $(CXX) -E -x c++ - >/dev/null 2>&1 && echo 1)
ifeq ($(HAVE_SPM),1)
CFLAGS += -DLOOM_HAVE_SPM=1
LDLIBS += -lsentencepiece -lstdc++
SPM_OBJ := $(BUILD)/obj/src/tokenizer/spm_lib.o
SPM_ASAN_OBJ := $(BUILD)/asan/obj/src/tokenizer/spm_lib.o
endif
CXXFLAGS := -std=c++17 -O2 -g -Wall -Wextra -Isrc

MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null)
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null)
HAVE_MPI   := $(if $(MPI_LIBS),1,)
ifeq ($(HAVE_MPI),1)
CFLAGS += $(MPI_CFLAGS) -DLOOM_HAVE_MPI=1
LDLIBS += $(MPI_LIBS)
endif

# ---- sources ----------------------------------------------------------------
# every folder of src/ but the CLI is the library
LIB_SRC  := $(sort $(filter-out src/cli/%,$(wildcard src/*/*.c src/kernels/cpu/*.c src/kernels/guarded/*.c)))
CLI_SRC  := $(sort $(wildcard src/cli/*.c))
TEST_SRC := $(sort $(wildcard tests/test_*.c))
TOOL_SRC := $(sort $(wildcard tests/tools/*.c))
# examples/NAME/NAME.c: programs written against the public headers alone
EXAMPLE_BIN := $(patsubst examples/%/,$(BUILD)/examples/%,$(sort $(dir $(wildcard examples/*/*.c))))

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(SPM_OBJ)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/obj/%.o)
TEST_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/tests/%) $(TOOL_SRC:tests/%.c=$(BUILD)/tests/%)
ASAN_OBJ := $(LIB_SRC:%.c=$(BUILD)/asan/obj/%.o) $(SPM_ASAN_OBJ)
ASAN_BIN := $(TEST_SRC:tests/%.c=$(BUILD)/asan/tests/%)
ASAN_FLAGS := -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined

.PHONY: all announce deps test-deps demo test unit asan fuzz clean bench format check-format install
all: announce $(BUILD)/loom $(BUILD)/libloom.a $(TEST_BIN) $(EXAMPLE_BIN)

announce:
	@echo "loom build: CC=$(CC)"
	@echo "  BLAS     $(if $(BLAS_NAME),$(BLAS_NAME),NOT FOUND (run scripts/install-deps.sh))"
	@echo "  OpenMP   $(if $(HAVE_OPENMP),yes,no: kernels run single-threaded)"
	@echo "  cJSON    $(if $(HAVE_CJSON),yes,NOT FOUND (run scripts/install-deps.sh))"
	@echo "  PCRE2    $(if $(HAVE_PCRE2),yes,NOT FOUND (run scripts/install-deps.sh))"
	@echo "  liburing $(if $(HAVE_URING),yes,NOT FOUND (run scripts/install-deps.sh))"
	@echo "  xxHash   $(if $(HAVE_XXHASH),yes,NOT FOUND (run scripts/install-deps.sh))"
	@echo "  oneDNN   $(if $(HAVE_DNNL),yes,no: bf16 computes in float32 (run scripts/install-deps.sh))"
	@echo "  SentencePiece $(if $(HAVE_SPM),yes,no: tokenizer.model files are refused (run scripts/install-deps.sh))"
	@echo "  MPI      $(if $(HAVE_MPI),yes ($(shell mpicc --showme:version 2>/dev/null | cut -d: -f2 | head -1)),no: single-process only)"
	@echo "  CUDA     off (CPU backend)"
	@test -n "$(BLAS_NAME)" -a -n "$(HAVE_CJSON)" -a -n "$(HAVE_XXHASH)" -a -n "$(HAVE_PCRE2)" -a -n "$(HAVE_URING)" || { echo "loom build: missing BLAS, cJSON, xxHash, PCRE2 or liburing" >&2; exit 2; }

# Megatron's dataset rules round as Python does: no fused multiply-adds
$(BUILD)/obj/src/io/megatron_data.o $(BUILD)/asan/obj/src/io/megatron_data.o: CFLAGS += -ffp-contract=off

# The fused attention's softmax loops in whole AVX-512 vectors where the CPU
# has them (GCC's tuning for these CPUs prefers half-width loops)
FLASH_OBJ := src/kernels/cpu/flash_attention.o src/kernels/cpu/flash_attention_bf16.o
$(addprefix $(BUILD)/obj/,$(FLASH_OBJ)) $(addprefix $(BUILD)/asan/obj/,$(FLASH_OBJ)): CFLAGS += -mprefer-vector-width=512

$(BUILD)/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -MMD -MP -c $< -o $@

$(BUILD)/libloom.a: $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/loom: $(CLI_OBJ) $(BUILD)/libloom.a
	$(CC) $(CFLAGS) $^ -o $@ $(LDLIBS)

$(BUILD)/tests/%: tests/%.c $(BUILD)/libloom.a tests/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libloom.a -o $@ $(LDLIBS)

$(BUILD)/tests/tools/%: tests/tools/%.c $(BUILD)/libloom.a tests/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -Itests $< $(BUILD)/libloom.a -o $@ $(LDLIBS)

$(BUILD)/examples/%: examples/%/*.c $(BUILD)/libloom.a
	@mkdir -p $(dir $@)
	$(CC) $(filter-out -Isrc,$(CFLAGS)) $(filter %.c,$^) $(BUILD)/libloom.a -o $@ $(LDLIBS)

# Sanitizer build of the unit tests (address + undefined behaviour).
$(BUILD)/asan/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O1 $(ASAN_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/asan/obj/%.o: %.cc
	@mkdir -p $(dir $@)
	$(CXX) $(CXXFLAGS) -O1 $(ASAN_FLAGS) -MMD -MP -c $< -o $@

$(BUILD)/asan/libloom.a: $(ASAN_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/asan/tests/%: tests/%.c $(BUILD)/asan/libloom.a tests/check.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -O1 $(ASAN_FLAGS) -Itests $< $(BUILD)/asan/libloom.a -o $@ $(LDLIBS)

asan: $(ASAN_BIN)

# libFuzzer targets (clang, address + undefined behaviour): `make fuzz` builds
# build/fuzz/fuzz_NAME from each tests/fuzz/fuzz_NAME.c, which names the
# library sources it needs on a comment line " * fuzz-sources: ..." and what
# it links on " * fuzz-libs: ..."; only those are compiled, into
# build/fuzz/obj. tests/test_fuzz.py runs them. Without clang's libFuzzer
# runtime, `make fuzz` says so and builds nothing.
FUZZ_CC     ?= clang
FUZZ_SRC    := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_NAMES  := $(FUZZ_SRC:tests/fuzz/%.c=%)
FUZZ_CFLAGS := -std=gnu11 -g -O1 $(WARN) -Iinclude -Isrc -fno-omit-frame-pointer \
               -fsanitize=address,undefined -fno-sanitize-recover=undefined \
               $(if $(HAVE_CJSON),$(shell pkg-config --cflags libcjson)) $(if $(filter 1,$(WERROR)),-Werror)
fuzz_field   = $(shell sed -n 's/^ \* fuzz-$(2): *//p' tests/fuzz/$(1).c)
fuzz_objs    = $(patsubst %.c,$(BUILD)/fuzz/obj/%.o,tests/fuzz/$(1).c $(call fuzz_field,$(1),sources))
FUZZ_OBJ    := $(sort $(foreach n,$(FUZZ_NAMES),$(call fuzz_objs,$(n))))
ifneq ($(filter fuzz,$(MAKECMDGOALS)),)
HAVE_FUZZ := $(shell echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return 0; }' | \
                     $(FUZZ_CC) -fsanitize=fuzzer -x c - -o /dev/null 2>/dev/null && echo 1)
endif

$(BUILD)/fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -MMD -MP -c $< -o $@

define FUZZ_RULE
$(BUILD)/fuzz/$(1): $(call fuzz_objs,$(1))
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer $$^ -o $$@ $(call fuzz_field,$(1),libs)
endef
$(foreach n,$(FUZZ_NAMES),$(eval $(call FUZZ_RULE,$(n))))

ifeq ($(HAVE_FUZZ),1)
fuzz: $(FUZZ_NAMES:%=$(BUILD)/fuzz/%)
else
fuzz:
	@echo "fuzz: $(FUZZ_CC) with libFuzzer not found, fuzzers not built (scripts/install-deps.sh --test)"
endif

deps:
	@scripts/install-deps.sh

test-deps:
	@scripts/install-deps.sh --test

# The demo: train the default model on the built-in corpus.
# The demo: a quiet build (the compiler's lines go to $(BUILD)/build.log), gpt2-tiny trained on
# the built-in corpus with a checkpoint and metrics in $(BUILD)/demo, and the next commands.
DEMO := $(BUILD)/demo
DEMO_ARGS = --train-iters 300 --eval-interval 100 --log-interval 50 --save $(DEMO)/checkpoints --metrics $(DEMO)/metrics.jsonl
demo: deps
	@mkdir -p $(BUILD)
	@echo "loom demo: building loom ($(shell nproc 2>/dev/null || echo 2) jobs; the compiler's output goes to $(BUILD)/build.log)"
	@$(MAKE) --no-print-directory -j$(shell nproc 2>/dev/null || echo 2) all > $(BUILD)/build.log 2>&1 || \
	  { tail -n 30 $(BUILD)/build.log; echo "loom demo: the build failed (all of it in $(BUILD)/build.log)" >&2; exit 1; }
	@rm -rf $(DEMO) && mkdir -p $(DEMO)
	@echo "loom demo: $(BUILD)/loom train $(DEMO_ARGS)"
	@$(BUILD)/loom train $(DEMO_ARGS)
	@echo ""
	@echo "next: $(BUILD)/loom sample --load $(DEMO)/checkpoints --prompt 'the ' --max-new-tokens 80"
	@echo "      $(BUILD)/loom report $(DEMO)     # the run as one page: $(DEMO)/report.html"
	@echo "      $(BUILD)/loom train --help                                 # the flags; README.md: the tour"

test: test-deps
	@$(MAKE) --no-print-directory -j$(shell nproc 2>/dev/null || echo 2) all asan fuzz
	@PYTHON=$(PYTHON) BUILD=$(BUILD) tests/run.sh

bench: all
	$(PYTHON) bench/throughput.py

# Formatting: every C file follows .clang-format (`make format` applies it,
# `make check-format` fails on any difference; CI runs the check).
CLANG_FORMAT ?= clang-format
FORMAT_SRC := $(shell git ls-files '*.c' '*.h' '*.cc' 2>/dev/null)
format:
	@$(CLANG_FORMAT) -i $(FORMAT_SRC)

check-format:
	@$(CLANG_FORMAT) --dry-run --Werror $(FORMAT_SRC) || \
	  { echo "check-format: run 'make format' (clang-format, .clang-format)" >&2; exit 1; }

clean:
	rm -rf $(BUILD)

# `make install PREFIX=DIR` (default /usr/local; DESTDIR for staging): the
# command, the library, the public headers and loom.pc, so a program of
# yours builds with `cc prog.c $(pkg-config --cflags --libs loom)`. The
# library is static: loom.pc's Libs carry what it links against.
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCLUDEDIR ?= $(PREFIX)/include
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(LIBDIR)/pkgconfig $(DESTDIR)$(INCLUDEDIR)/loom
	install -m 755 $(BUILD)/loom $(DESTDIR)$(PREFIX)/bin/loom
	install -m 644 $(BUILD)/libloom.a $(DESTDIR)$(LIBDIR)/libloom.a
	install -m 644 include/loom/*.h $(DESTDIR)$(INCLUDEDIR)/loom/
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$(LIBDIR)' 'includedir=$(INCLUDEDIR)' '' \
	  'Name: loom' 'Description: distributed training for transformer language models (engine API)' \
	  'Version: $(shell sed -n 's/^#define LOOM_VERSION "\(.*\)"/\1/p' include/loom/loom.h)' \
	  'Cflags: -I$${includedir} $(filter -fopenmp,$(CFLAGS))' \
	  'Libs: -L$${libdir} -lloom $(LDLIBS)' > $(DESTDIR)$(LIBDIR)/pkgconfig/loom.pc
	@echo "installed loom into $(DESTDIR)$(PREFIX) (pkg-config: $(LIBDIR)/pkgconfig/loom.pc)"

-include $(LIB_OBJ:.o=.d) $(CLI_OBJ:.o=.d) $(ASAN_OBJ:.o=.d)
-include $(FUZZ_OBJ:.o=.d)
