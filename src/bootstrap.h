// bootstrap.h: how the ranks of a job find each other, before any data moves.
//
// Three launchers are recognised: Slurm's PMI2 (`srun --mpi=pmi2`, libpmi2: rank, size,
// local rank, and a key-value space to exchange small blobs such as the 128-byte NCCL
// unique id), MPI (`mpirun`, or srun with MPICH: MPI itself is then the bootstrap), and a
// single process. A process never runs both MPI and its own PMI2 client.
#pragma once
#include <stddef.h>

typedef struct {
    const char *launcher;   // "single process", "Slurm PMI2", ...
    int rank, size;         // in the job
    int local_rank, local_size;  // on this node (device = local_rank)
} boot_info;

// PMI2 (built when <slurm/pmi2.h> is found: src/bootstrap_pmi2.c).
// 1 when this process runs under a PMI2 server (srun --mpi=pmi2).
int boot_pmi2_present(void);
// PMI2_Init and the job geometry. 0 / -1 (CHECK_PMI records the failing call).
int boot_pmi2_init(boot_info *b);
// Rank `root` publishes `n` bytes (hex-encoded under `key` in the job's KVS); after a fence
// every rank reads them into `out` (collective). 0 / -1.
int boot_pmi2_share(const boot_info *b, int root, const char *key, const void *in, size_t n, void *out);
void boot_pmi2_finalize(void);

// Hex helpers (shared by every transport that moves binary ids as text).
void boot_hex_encode(const void *in, size_t n, char *out);   // out: 2n + 1 chars
int boot_hex_decode(const char *in, void *out, size_t n);    // 0, or -1 if malformed
