// bootstrap_pmi2.c: Slurm's PMI2 client (libpmi2) for rank discovery and small exchanges
// (built when <slurm/pmi2.h> is found; see bootstrap.h).
#include <slurm/pmi2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bootstrap.h"
#include "common.h"

#define CHECK_PMI(call) do { int pmi_rc_ = (call); if (pmi_rc_ != PMI2_SUCCESS) \
    return ft_error("%s failed at %s:%d: PMI2 error %d", #call, FT_WHERE, pmi_rc_); } while (0)

static char g_jobid[PMI2_MAX_VALLEN];

int boot_pmi2_present(void) { return getenv("PMI_FD") != NULL && getenv("SLURM_STEP_ID") != NULL; }

int boot_pmi2_init(boot_info *b) {
    int spawned = 0, size = 0, rank = 0, appnum = 0;
    CHECK_PMI(PMI2_Init(&spawned, &size, &rank, &appnum));
    CHECK_PMI(PMI2_Job_GetId(g_jobid, sizeof g_jobid));
    b->launcher = "Slurm PMI2";
    b->rank = rank;
    b->size = size;
    // Slurm exports the node-local geometry of the step
    const char *lid = getenv("SLURM_LOCALID"), *ntasks = getenv("SLURM_STEP_TASKS_PER_NODE");
    b->local_rank = lid ? atoi(lid) : 0;
    b->local_size = ntasks ? atoi(ntasks) : 1;   // "2(x2)" -> 2: tasks on this kind of node
    if (b->local_size < 1) b->local_size = 1;
    return 0;
}

int boot_pmi2_share(const boot_info *b, int root, const char *key, const void *in, size_t n, void *out) {
    if (2 * n + 1 > PMI2_MAX_VALLEN) return ft_error("pmi2: %zu bytes do not fit one KVS value", n);
    char val[PMI2_MAX_VALLEN];
    if (b->rank == root) {
        boot_hex_encode(in, n, val);
        CHECK_PMI(PMI2_KVS_Put(key, val));
    }
    CHECK_PMI(PMI2_KVS_Fence());
    int len = 0;
    CHECK_PMI(PMI2_KVS_Get(g_jobid, PMI2_ID_NULL, key, val, sizeof val, &len));
    if (boot_hex_decode(val, out, n) != 0) return ft_error("pmi2: key '%s': malformed value", key);
    return 0;
}

void boot_pmi2_finalize(void) { PMI2_Finalize(); }
