// PMI2 bootstrap check under Slurm: what finetune's NCCL bootstrap does, without NCCL.
//
//   srun --mpi=pmi2 -N 2 --ntasks-per-node=2 pmi2_exchange [seed]
//
// 1. PMI2_Init gives rank and size; PMI_process_mapping gives ranks per node and local rank.
// 2. Rank 0 makes a 128-byte id (the size of an ncclUniqueId) from the seed (default: time and
//    pid), publishes it hex-encoded (256 chars; PMI2 values hold at most 1023), fence, every
//    rank reads it back, checks its form and prints its FNV-1a hash: the caller compares the
//    hashes of all ranks.
// 3. Every rank publishes its own 128-byte value derived from the id and its rank; after a
//    second fence every rank reads all the others and checks each against the expected bytes.
// Prints one line per rank: "pmi2_exchange: rank R/N node NAME local L/P id_fnv HEX peers ok".
// Any failure -> a message on stderr and exit 1. Outside srun PMI2 runs as a singleton (size 1).
// FT_PMI2_CORRUPT=R makes rank R publish a wrong value (the test's negative case).
#include <slurm/pmi2.h>

#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define ID_BYTES 128

static int g_rank = -1;

static void fail(const char *what, int rc) {
    fprintf(stderr, "pmi2_exchange: rank %d: %s failed (rc %d)\n", g_rank, what, rc);
    exit(1);
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static uint64_t fnv1a(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ULL;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

static void hex_encode(const unsigned char *in, size_t n, char *out) {
    static const char digits[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = digits[in[i] >> 4];
        out[2 * i + 1] = digits[in[i] & 15];
    }
    out[2 * n] = '\0';
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// exactly 2n lowercase hex digits -> n bytes; 0 on success
static int hex_decode(const char *in, size_t n, unsigned char *out) {
    if (strlen(in) != 2 * n) return -1;
    for (size_t i = 0; i < n; i++) {
        int hi = hex_value(in[2 * i]), lo = hex_value(in[2 * i + 1]);
        if (hi < 0 || lo < 0) return -1;
        out[i] = (unsigned char)(hi << 4 | lo);
    }
    return 0;
}

// the value rank r publishes in round 2: a function of the shared id and r
static void peer_value(const unsigned char id[ID_BYTES], int r, unsigned char out[ID_BYTES]) {
    uint64_t s = fnv1a(id, ID_BYTES) ^ ((uint64_t)(r + 1) * 0xd6e8feb86659fd93ULL);
    for (int i = 0; i < ID_BYTES; i += 8) {
        uint64_t v = splitmix64(&s);
        memcpy(out + i, &v, 8);
    }
}

// local rank and ranks on this node from PMI_process_mapping, e.g. "(vector,(0,2,2))" = block
// blocks of (first node, node count, ranks per node); returns 0 when parsed
static int local_info(int rank, int *local_rank, int *local_size) {
    char map[PMI2_MAX_ATTRVALUE + 1] = {0};
    int found = 0;
    if (PMI2_Info_GetJobAttr("PMI_process_mapping", map, sizeof map - 1, &found) != PMI2_SUCCESS || !found)
        return -1;
    const char *p = strstr(map, "(vector");
    if (!p) return -1;
    p += strlen("(vector");
    int first_rank = 0;
    for (;;) {
        int node, nodes, per;
        int used = 0;
        if (sscanf(p, ",(%d,%d,%d)%n", &node, &nodes, &per, &used) != 3 || used == 0) return -1;
        p += used;
        (void)node;
        if (rank < first_rank + nodes * per) {
            *local_rank = (rank - first_rank) % per;
            *local_size = per;
            return 0;
        }
        first_rank += nodes * per;
    }
}

int main(int argc, char **argv) {
    int spawned = 0, size = 0, rank = -1, appnum = 0, rc;
    if ((rc = PMI2_Init(&spawned, &size, &rank, &appnum)) != PMI2_SUCCESS) fail("PMI2_Init", rc);
    g_rank = rank;
    if (size < 1 || rank < 0 || rank >= size) {
        fprintf(stderr, "pmi2_exchange: bad rank %d / size %d\n", rank, size);
        return 1;
    }
    if (!getenv("PMI_FD")) {  // not launched by srun --mpi=pmi2: libpmi2 runs as a singleton
        printf("pmi2_exchange: rank %d/%d singleton (no PMI_FD)\n", rank, size);
        return size == 1 && rank == 0 ? 0 : 1;
    }
    char jobid[256] = {0};
    if ((rc = PMI2_Job_GetId(jobid, sizeof jobid)) != PMI2_SUCCESS) fail("PMI2_Job_GetId", rc);
    int local_rank = 0, local_size = 1;
    if (size > 1 && local_info(rank, &local_rank, &local_size) != 0) {
        fprintf(stderr, "pmi2_exchange: rank %d: cannot parse PMI_process_mapping\n", rank);
        return 1;
    }
    const char *corrupt = getenv("FT_PMI2_CORRUPT");
    const int corrupt_rank = corrupt && *corrupt ? atoi(corrupt) : -1;

    // round 1: rank 0's id to everyone
    unsigned char id[ID_BYTES];
    char hex[2 * ID_BYTES + 1], got[PMI2_MAX_VALLEN + 1];
    int len = 0;
    if (rank == 0) {
        uint64_t s = argc > 1 ? strtoull(argv[1], NULL, 0)
                              : (uint64_t)time(NULL) * 1000003u ^ (uint64_t)getpid() << 20;
        for (int i = 0; i < ID_BYTES; i += 8) {
            uint64_t v = splitmix64(&s);
            memcpy(id + i, &v, 8);
        }
        hex_encode(id, ID_BYTES, hex);
        if ((rc = PMI2_KVS_Put("ft_id", hex)) != PMI2_SUCCESS) fail("PMI2_KVS_Put(ft_id)", rc);
    }
    if ((rc = PMI2_KVS_Fence()) != PMI2_SUCCESS) fail("PMI2_KVS_Fence", rc);
    memset(got, 0, sizeof got);
    if ((rc = PMI2_KVS_Get(jobid, 0, "ft_id", got, PMI2_MAX_VALLEN, &len)) != PMI2_SUCCESS)
        fail("PMI2_KVS_Get(ft_id)", rc);
    unsigned char id_read[ID_BYTES];
    if (len != 2 * ID_BYTES || hex_decode(got, ID_BYTES, id_read) != 0) {
        fprintf(stderr, "pmi2_exchange: rank %d: ft_id malformed (%d chars: %.40s...)\n", rank, len, got);
        return 1;
    }
    if (rank == 0 && memcmp(id, id_read, ID_BYTES) != 0) {
        fprintf(stderr, "pmi2_exchange: rank 0: ft_id read back differs from what was put\n");
        return 1;
    }
    memcpy(id, id_read, ID_BYTES);

    // round 2: all to all
    unsigned char mine[ID_BYTES], want[ID_BYTES], theirs[ID_BYTES];
    char key[PMI2_MAX_KEYLEN];
    peer_value(id, rank, mine);
    if (rank == corrupt_rank) mine[ID_BYTES / 2] ^= 1;
    hex_encode(mine, ID_BYTES, hex);
    snprintf(key, sizeof key, "ft_r%d", rank);
    if ((rc = PMI2_KVS_Put(key, hex)) != PMI2_SUCCESS) fail("PMI2_KVS_Put(ft_rN)", rc);
    if ((rc = PMI2_KVS_Fence()) != PMI2_SUCCESS) fail("PMI2_KVS_Fence", rc);
    int bad = 0;
    for (int r = 0; r < size; r++) {
        snprintf(key, sizeof key, "ft_r%d", r);
        memset(got, 0, sizeof got);
        if ((rc = PMI2_KVS_Get(jobid, r, key, got, PMI2_MAX_VALLEN, &len)) != PMI2_SUCCESS) fail(key, rc);
        peer_value(id, r, want);
        if (len != 2 * ID_BYTES || hex_decode(got, ID_BYTES, theirs) != 0 || memcmp(theirs, want, ID_BYTES) != 0) {
            fprintf(stderr, "pmi2_exchange: rank %d: value of rank %d is wrong\n", rank, r);
            bad++;
        }
    }
    const char *node = getenv("SLURMD_NODENAME");
    printf("pmi2_exchange: rank %d/%d node %s local %d/%d id_fnv %016" PRIx64 " peers %s\n", rank, size,
           node ? node : "-", local_rank, local_size, fnv1a(id, ID_BYTES), bad ? "BAD" : "ok");
    fflush(stdout);
    PMI2_Finalize();
    return bad ? 1 : 0;
}
