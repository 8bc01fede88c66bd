// nccl_id_exchange: the GPU bootstrap path without a GPU. Rank 0 creates a real NCCL unique
// id (ncclGetUniqueId needs only the network) and every rank receives it through the
// launcher: Slurm PMI2 (srun --mpi=pmi2, libpmi2 KVS, hex-encoded) or MPI (mpirun). Each rank
// prints "rank R/N via <launcher>: id <fnv64 of the 128 bytes>"; tests compare the lines.
// Built when CUDA, PMI2 and MPI are all available.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "bootstrap.h"
#include "comm.h"
#include "common.h"

static uint64_t fnv64(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

int main(int argc, char **argv) {
    uint8_t id[128] = {0}, got[128] = {0};
    boot_info b = {"single process", 0, 1, 0, 1};
    comm world;
    int use_mpi = !boot_pmi2_present() && comm_mpi_launched(), rc = 0;
    if (boot_pmi2_present()) rc = boot_pmi2_init(&b);
    else if (use_mpi) {
        rc = comm_mpi_init_world(&world, backend_cpu(), &argc, &argv);
        b.launcher = "MPI";
        b.rank = world.rank;
        b.size = world.size;
    }
    if (rc == 0 && b.rank == 0) rc = comm_nccl_unique_id(id, sizeof id);
    if (rc == 0) {
        if (b.size == 1) memcpy(got, id, sizeof id);
        else if (use_mpi) { memcpy(got, id, sizeof id); rc = comm_broadcast(&world, got, sizeof got, 0); }
        else rc = boot_pmi2_share(&b, 0, "ncclUniqueId", id, sizeof id, got);
    }
    if (rc != 0) { fprintf(stderr, "nccl_id_exchange: rank %d: %s\n", b.rank, ft_error_message()); return 1; }
    int nonzero = 0;
    for (size_t i = 0; i < sizeof got; i++) nonzero |= got[i];
    printf("rank %d/%d via %s: id %016llx%s\n", b.rank, b.size, b.launcher, (unsigned long long)fnv64(got, sizeof got),
           nonzero ? "" : " (all zero!)");
    if (use_mpi) comm_mpi_finalize();
    else if (boot_pmi2_present()) boot_pmi2_finalize();
    return nonzero ? 0 : 1;
}
