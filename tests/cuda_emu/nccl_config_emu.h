// nccl_config_emu.h: the CTA bounds of an ncclConfig_t (minCTAs, maxCTAs) as NCCL reads,
// checks and keeps them, for the emulated NCCL (cuda_emu_host.cpp) and the NCCL stand-in
// (tests/nccl_standin/nccl_standin.c), C and C++ alike. Neither runs NCCL kernels, so the
// bounds change nothing there; they are kept so that a test can see what each communicator
// was given: with FT_EMU_NCCL_CONFIG set, every communicator created prints one line to
// stderr (tests/test_lib_compat.sh, tests/test_nccl_standin.sh).
//
// NCCL's rules (init.cc, parseCommConfig, 2.17 to 2.28): the config must carry the
// initializer's magic; it reads min(config->size, its own size) bytes of it; a config of a
// version before 2.17 has no CTA fields; a bound that is set must be positive and minCTAs no
// larger than maxCTAs (else ncclInvalidArgument); a split without a config inherits the
// parent's.
#pragma once
#include <limits.h>
#include <nccl.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct {
    int min_ctas, max_ctas;   // NCCL_CONFIG_UNDEF_INT: NCCL's default
} emu_ctas;

static inline emu_ctas emu_ctas_default(void) {
    emu_ctas c = {NCCL_CONFIG_UNDEF_INT, NCCL_CONFIG_UNDEF_INT};
    return c;
}

// *out = the bounds of cfg (NULL: *parent's, or NCCL's defaults without a parent). 0, or -1
// when NCCL would refuse the config (ncclInvalidArgument).
static inline int emu_ctas_from_config(const ncclConfig_t *cfg, const emu_ctas *parent, emu_ctas *out) {
    *out = parent ? *parent : emu_ctas_default();
    if (!cfg) return 0;
    if (cfg->magic != 0xcafebeef) return -1;
    *out = emu_ctas_default();
    if (cfg->size < offsetof(ncclConfig_t, maxCTAs) + sizeof(int) || cfg->version < NCCL_VERSION(2, 17, 0)) return 0;
    const int lo = cfg->minCTAs, hi = cfg->maxCTAs;
    if ((lo != NCCL_CONFIG_UNDEF_INT && lo <= 0) || (hi != NCCL_CONFIG_UNDEF_INT && hi <= 0) || lo > hi) return -1;
    out->min_ctas = lo;
    out->max_ctas = hi;
    return 0;
}

// FT_EMU_NCCL_CONFIG set: "<who>: NCCL communicator <how> (rank r of n): minCTAs A, maxCTAs B"
// on stderr, "default" for a bound left to NCCL
static inline void emu_ctas_log(const char *who, const char *how, int rank, int size, const emu_ctas *c) {
    const char *e = getenv("FT_EMU_NCCL_CONFIG");
    if (!e || !*e) return;
    char lo[16] = "default", hi[16] = "default";
    if (c->min_ctas != NCCL_CONFIG_UNDEF_INT) snprintf(lo, sizeof lo, "%d", c->min_ctas);
    if (c->max_ctas != NCCL_CONFIG_UNDEF_INT) snprintf(hi, sizeof hi, "%d", c->max_ctas);
    fprintf(stderr, "%s: NCCL communicator %s (rank %d of %d): minCTAs %s, maxCTAs %s\n", who, how, rank, size, lo, hi);
}

// a communicator just created takes bounds *c (into *dst) and logs them
static inline void emu_ctas_take(emu_ctas *dst, const emu_ctas *c, const char *who, const char *how, int rank,
                                 int size) {
    *dst = *c;
    emu_ctas_log(who, how, rank, size, dst);
}
