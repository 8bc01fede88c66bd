// launch.c: launcher detection, process grid, device and data plane (see launch.h). The
// #ifdefs select the transports this binary was built with (MPI, PMI2, CUDA/NCCL).
#include "launch.h"

#include <omp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common.h"
#include "plan.h"
#ifdef FT_HAVE_CUDA
#include "attn_engine.h"
#include "backend_cuda.h"
#endif
#include "watchdog.h"

int launch_env_rank(void) {
    static const char *vars[] = {"PMI_RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i])) return atoi(getenv(vars[i]));
    return 0;
}

const char *launch_build_description(void) {
#if defined(FT_HAVE_MPI) && defined(FT_HAVE_PMI2)
    return "single process, MPI (mpirun, or srun with MPICH), Slurm PMI2 (srun --mpi=pmi2)";
#elif defined(FT_HAVE_MPI)
    return "single process, MPI (mpirun, or srun with MPICH); no Slurm PMI2 without MPI";
#elif defined(FT_HAVE_PMI2)
    return "single process, Slurm PMI2 (srun --mpi=pmi2, GPU ranks only); no MPI";
#else
    return "single process only (built without MPI and PMI2)";
#endif
}

int launch_env_world_size(void) {
    static const char *vars[] = {"PMI_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", NULL};
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i]) && atoi(getenv(vars[i])) > 0) return atoi(getenv(vars[i]));
    return 1;
}

// ----------------------------------------------------------------------------
// control plane

// The number of tasks a launcher says it started together (srun's step, MPICH's hydra, Open
// MPI), and the variable saying so; 1 when none does. A batch script's own shell sets none
// of these (SLURM_NTASKS, which it sets, is the allocation's, not a step's).
static int launch_env_tasks(const char **var) {
    static const char *vars[] = {"PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", NULL};   // ranks first
    for (int i = 0; vars[i]; i++)
        if (getenv(vars[i]) && atoi(getenv(vars[i])) > 1) {
            *var = vars[i];
            return atoi(getenv(vars[i]));
        }
    return 1;
}

// MPI (mpirun, or srun with MPICH), else PMI2 without MPI (srun --mpi=pmi2), else one
// process. 0 / -1.
static int control_plane_open(launch *L, int *argc, char ***argv) {
    L->boot = (boot_info){"single process", 0, 1, 0, 1};
    L->launcher = "single process";
#ifdef FT_HAVE_MPI
    if (comm_mpi_launched()) {
        TRY(comm_mpi_init_world(&L->world, L->cpu, argc, argv));
        L->mpi = 1;
        L->launcher = getenv("SLURM_STEP_ID") ? "MPI over Slurm PMI2 (srun)" : "MPI (mpirun)";
    }
#else
    (void)argc; (void)argv;
#endif
#ifdef FT_HAVE_PMI2
    // a build without MPI under srun --mpi=pmi2: libpmi2 gives rank, size and a KVS, enough to
    // share the NCCL id of GPU ranks (CPU ranks need MPI to move data)
    if (!L->mpi && boot_pmi2_present()) {
        TRY(boot_pmi2_init(&L->boot));
        L->pmi2_open = 1;
        L->pmi2_ranks = L->boot.size > 1;
        L->launcher = "Slurm PMI2 (libpmi2, no MPI)";
    }
#endif
    if (!L->mpi) comm_init_single(&L->world, L->cpu);
    L->W = L->mpi ? L->world.size : L->boot.size;
    // one of N tasks started together that found no way to join the others (srun without a
    // PMI this build speaks, mpirun of a build without MPI): N jobs each training the whole
    // model alone (the --out_dir lock refuses all but one of them when they share it). Said,
    // not refused: N independent runs in one step (a sweep, one --out_dir each) are legitimate.
    const char *var = NULL;
    const int tasks = launch_env_tasks(&var);
    if (L->W == 1 && tasks > 1)
        fprintf(stderr, "finetune: warning: this process is one of %d tasks (%s=%d) but joined none of the others "
                "(this build: %s), so it trains alone; for one job over all of them under Slurm, run srun --mpi=pmi2 "
                "(as slurm/*.sbatch do)\n", tasks, var, tasks, launch_build_description());
    L->rank = L->mpi ? L->world.rank : L->boot.rank;
    L->local_rank = L->boot.local_rank;
    L->local_size = L->boot.local_size;
    return 0;
}

// The process grid: shard groups of S consecutive ranks, replica groups across them (MPI
// groups for CPU ranks); ranks sharing a node split its cores unless OMP_NUM_THREADS is set.
static int grid_open(launch *L, int S, const char *device) {
    TRY(plan_validate_grid(L->W, S));
    if (L->pmi2_ranks && strcmp(device, "cuda") != 0)
        return ft_error("launcher: %d ranks under srun but this build has no MPI for CPU ranks (rebuild with MPICH, "
                        "or use --device cuda)", L->W);
    L->cc = (train_comms){&L->world, &L->world, &L->world, 0};
#ifdef FT_HAVE_MPI
    if (L->mpi) {
        // a deadline-bound barrier first: the blocking calls below start once every rank is
        // known to be alive (src/watchdog.h)
        TRY(comm_barrier(&L->world));
        TRY(comm_mpi_local_info(&L->local_rank, &L->local_size));
        TRY(comm_mpi_split(&L->world, L->world.rank / S, L->world.rank % S, &L->shard));
        if (comm_mpi_split(&L->world, L->world.rank % S, L->world.rank / S, &L->replica) != 0) {
            comm_destroy(&L->shard);
            return -1;
        }
        L->cc.shard = &L->shard;
        L->cc.replica = &L->replica;
        L->shard.label = "shard group";
        L->replica.label = "replica group";
        L->mpi_split = 1;
        if (!getenv("OMP_NUM_THREADS")) {
            int t = omp_get_num_procs() / L->local_size;
            omp_set_num_threads(t > 0 ? t : 1);
        }
    }
#endif
    return 0;
}

// ----------------------------------------------------------------------------
// device and data plane

// Device memory for --device cuda: the plan of this job (bf16 storage), the inference model of
// --sample_tokens and the margin for what the plan does not see (plan_arena_bytes).
static int device_arena_bytes(const train_options *o, int W, size_t *out) {
    llama_config cfg;
    char path[FT_PATH_MAX];
    TRY(ft_path(path, sizeof path, "%s/config.json", o->model_dir));
    TRY(llama_config_load(&cfg, path));
    const plan_request req = train_plan_request(o, W, 2);
    plan p;
    TRY(plan_compute(&p, &cfg, &req));
    *out = plan_arena_bytes(&p);
    return 0;
}

// TEST-ONLY: FT_TEST_NCCL_SELF set gives a one-rank GPU job the NCCL data plane (a one-rank
// communicator and, as a shard group gets, a reduce-scatter lane split from it) instead of the
// single transport, so that one GPU runs comm_nccl.c: loading NCCL, its version gates, init,
// split, the host all-reduces of losses and norms, the watchdog's hooks and teardown
// (tests/gpu/test_gpu.sh; on the emulator, tests/test_cuda_emu_train.sh under mpiexec -n 1).
static int nccl_self_test(const launch *L) { return L->W == 1 && ft_getenv("FT_TEST_NCCL_SELF") != NULL; }

// GPU ranks beyond one need NCCL, loaded at run time (src/comm_nccl.c); *one_lane: whether
// this rank's NCCL needs the one-lane mode (comm_nccl_choose_lanes). The communicators' CTA
// bound is set here (L->nccl_max_ctas); NCCL_MAX_CTAS in the environment wins over it inside
// NCCL, and rank 0 says so once. 0 / -1.
static int nccl_available(const launch *L, int *one_lane) {
#ifdef FT_HAVE_CUDA
    TRY(comm_nccl_choose_lanes(one_lane));
    comm_nccl_set_max_ctas(L->nccl_max_ctas);
    const char *env_max = getenv("NCCL_MAX_CTAS");
    if (env_max && L->nccl_max_ctas > 0 && L->rank == 0)
        fprintf(stderr, "finetune: NCCL_MAX_CTAS=%s in the environment: NCCL takes it over --nccl_max_ctas %d\n", env_max,
                L->nccl_max_ctas);
    if (comm_nccl_wheel_python() && L->rank == 0)
        fprintf(stderr, "finetune: no libnccl.so.2 on the library path: loaded %s, from the nvidia-nccl wheel of %s\n",
                comm_nccl_describe(), comm_nccl_wheel_python());
    return 0;
#else
    (void)L; (void)one_lane;
    return ft_error("flag --device cuda: this binary was built without the CUDA toolkit (rebuild with make CUDA=1)");
#endif
}

// Every rank runs the same lane mode, the one-lane mode when any rank's NCCL needs it (older
// than 2.26, or NCCL_LAUNCH_ORDER_IMPLICIT=0: a node with another NCCL would otherwise wait
// forever in a split its peers never make). With shards of S > 1 ranks rank 0 says so once,
// naming how many ranks asked for it. Collective over the world. 0 / -1.
static int nccl_agree_lanes(launch *L, int one_lane, int S) {
#ifdef FT_HAVE_CUDA
    double asked = one_lane;
    TRY(comm_all_reduce_f64(&L->world, &asked, 1));
    if (asked == 0) return 0;
    comm_nccl_use_one_lane();
    if (S > 1 && L->rank == 0) {
        const char *order = getenv("NCCL_LAUNCH_ORDER_IMPLICIT");
        const char *why = !one_lane ? "is new enough, but another rank's NCCL is older than 2.26 or runs with "
                                      "NCCL_LAUNCH_ORDER_IMPLICIT=0"
                          : order && atoi(order) == 0 ? "with NCCL_LAUNCH_ORDER_IMPLICIT=0 does not order concurrent communicators"
                                                      : "is older than 2.26, which orders concurrent communicators";
        fprintf(stderr, "finetune: warning: %s %s (%.0f of %d ranks): the collectives of all NCCL communicators run "
                "one at a time on one stream, so each layer's gradient reduce-scatter no longer runs beside the next "
                "layer's all-gather (both still overlap the compute; the --dry_run step time already counts them one "
                "after the other on the link); NCCL 2.26+ with NCCL_LAUNCH_ORDER_IMPLICIT=1 on every node runs them in "
                "two lanes\n", comm_nccl_describe(), why, asked, L->W);
    }
#else
    (void)L; (void)one_lane; (void)S;
#endif
    return 0;
}

#ifdef FT_HAVE_CUDA
// TEST-ONLY (tests/test_watchdog.sh): FT_TEST_STOP_BEFORE=nccl_init or nccl_split stops world
// rank 1 (SIGSTOP) right before that NCCL call, after the exchange or barrier before it: its
// peers then wait inside NCCL's call, which only the watchdog's guard ends
static void test_stop_before(const launch *L, const char *call) {
    const char *v = ft_getenv("FT_TEST_STOP_BEFORE");
    if (v && L->rank == 1 && strcmp(v, call) == 0) raise(SIGSTOP);
}

// ncclCommSplit blocks until every rank of the parent entered it (under the watchdog's guard
// only): start each split once a deadline-bound barrier showed every rank alive, so that a
// rank that failed before it is named by the barrier's line (src/watchdog.h)
static int split_barrier(launch *L) { return L->mpi ? comm_barrier(&L->world) : 0; }

// A group of the data plane: the world group itself when it has every rank (pure FSDP's
// shard group, DDP's replica group: no duplicate NCCL communicator), one process when it has
// one rank (the single transport over the device), else an NCCL split. *own = 1 when `out`
// was created and must be destroyed. `label` names the group in the watchdog's messages (the
// world group's too when it serves as this group).
static int data_group_open(launch *L, int size, int color, int key, const char *label, comm *out, comm **group,
                           int *own) {
    *own = 0;
    if (size == L->W) {
        *group = &L->dworld;
        L->dworld.label = label;
        return 0;
    }
    *group = out;
    if (size == 1) comm_init_single(out, L->be);
    else {
        TRY(split_barrier(L));
        test_stop_before(L, "nccl_split");
        TRY(comm_nccl_split(&L->dworld, color, key, out));
        L->n_nccl++;
    }
    out->label = label;
    *own = 1;
    return 0;
}
#endif

// The data plane of GPU ranks beyond one: rank 0's NCCL unique id reaches every rank over MPI
// (or the PMI2 KVS), then the world group, the shard and replica groups (data_group_open)
// and the shard group's reduce-scatter lane (comm_nccl.c) are created, on the device already
// made current and before the backend sizes its arena, so the arena's fit check sees the
// memory NCCL took. The backend is not open yet: data_plane_bind gives the groups their be.
// 0, -1, or COMM_PEER_FAILED on the other ranks when rank 0 could not make the id (over MPI
// that failure is agreed before the broadcast; under PMI2 rank 0 shares zeros instead).
static int data_plane_open(launch *L, int S) {
#ifdef FT_HAVE_CUDA
    unsigned char id[128] = {0}, got[128] = {0}, zero[128] = {0};
    // rank 0 shares the id even when it could not make one (zeros, and its own error): the
    // others learn it at once instead of waiting for it (the PMI2 fence has no deadline)
    const int id_rc = L->rank == 0 ? comm_nccl_unique_id(id, sizeof id) : 0;
    int rc = 0, agreed = 0;
    if (L->W == 1) {   // (nccl_self_test: no one to share it with)
        rc = id_rc;
        memcpy(got, id, sizeof got);
    } else if (L->mpi) {   // agreed first: rank 0 alone says why, the others stop quietly
        if ((rc = comm_agree(&L->world, id_rc, &agreed)) != 0) return rc;   // (COMM_PEER_FAILED kept: not printed)
        memcpy(got, id, sizeof got);
        rc = comm_broadcast(&L->world, got, sizeof got, 0);
    } else {
#ifdef FT_HAVE_PMI2
        // (PMI2's fence waits for every rank without a deadline: under the watchdog's guard)
        if ((rc = watchdog_guard_begin("PMI2 exchange of the NCCL id", "world")) == 0) {
            rc = boot_pmi2_share(&L->boot, 0, "ncclUniqueId", id_rc == 0 ? id : zero, sizeof id, got);
            if (watchdog_guard_end() != 0) rc = -1;
        }
#endif
    }
    if (id_rc != 0 || rc != 0) return -1;
    if (memcmp(got, zero, sizeof got) == 0)
        return ft_error("rank %d: rank 0 could not create NCCL's unique id (rank 0's error says why)", L->rank);
    // from here a failure on one rank leaves the others inside NCCL's init or split, which
    // have no deadline: launch_close ends the job (launch_abort) instead of tearing down
    L->nccl_setup = 1;
    size_t free_before = 0, free_after = 0;
    TRY(backend_cuda_free_bytes(&free_before));
    test_stop_before(L, "nccl_init");
    TRY(comm_nccl_init(&L->dworld, NULL, L->rank, L->W, got, -1));
    L->nccl = 1;
    L->n_nccl = 1;
    comm *shard = NULL, *replica = NULL;
    TRY(data_group_open(L, S, L->rank / S, L->rank % S, "shard group", &L->dshard, &shard, &L->dshard_own));
    TRY(data_group_open(L, L->W / S, L->rank % S, L->rank / S, "replica group", &L->dreplica, &replica,
                        &L->dreplica_own));
    if (S > 1 || nccl_self_test(L)) {
        int created = 0;
        TRY(split_barrier(L));
        test_stop_before(L, "nccl_split");
        TRY(comm_nccl_add_reduce_scatter_lane(shard, &created));
        L->n_nccl += created;
    }
    L->cc = (train_comms){&L->dworld, shard, replica, 0};
    TRY(backend_cuda_free_bytes(&free_after));   // (connected at init: NCCL_RUNTIME_CONNECT=0)
    L->nccl_bytes = free_before > free_after ? free_before - free_after : 0;
    return 0;
#else
    (void)L; (void)S;
    return ft_error("GPU ranks need NCCL: this binary was built without the CUDA toolkit");
#endif
}

// After the backend opened: one process gets the single transport over the device; the NCCL
// groups (and single groups split from them) learn where their buffers live.
static void data_plane_bind(launch *L) {
    if (!L->nccl) {
        comm_init_single(&L->dworld, L->be);
        L->cc = (train_comms){&L->dworld, &L->dworld, &L->dworld, 0};
    }
    L->dworld.be = L->dshard.be = L->dreplica.be = L->be;
}

// A key per rank (collective over the MPI world): keys[r] = rank r's hash of its host name
// (FT_TEST_HOST replaces it: test-only) and `extra`, 52 bits and never 0, exact in a double.
// *keys: malloc'ed (W). 0 / -1.
static int rank_keys(launch *L, const char *extra, double **keys) {
    char text[320], host[128];
    const char *fake = ft_getenv("FT_TEST_HOST");
    if (fake) snprintf(host, sizeof host, "%s", fake);
    else ft_hostname(host, sizeof host);
    snprintf(text, sizeof text, "%s|%s", host, extra);
    *keys = ft_calloc((size_t)L->W, sizeof(double), "rank keys");
    if (!*keys) return -1;
    (*keys)[L->rank] = (double)((ft_hash64(text, strlen(text)) >> 12) | 1);
    if (comm_all_reduce_f64(&L->world, *keys, (size_t)L->W) == 0) return 0;
    free(*keys);
    *keys = NULL;
    return -1;
}

// Shard groups are S consecutive ranks; a launcher that places ranks round-robin over the
// hosts (mpiexec -hosts a,b) spreads a group that would fit on one node over several, and
// every all-gather and reduce-scatter then crosses the network. One warning (rank 0) when a
// group of S <= ranks per node spans hosts. Collective over the MPI world. 0 / -1.
static int warn_spread_shards(launch *L, int S) {
    double *keys = NULL;
    TRY(rank_keys(L, "", &keys));
    int spread = 0, first = -1;
    for (int g = 0; g < L->W / S; g++)
        for (int r = g * S + 1; r < (g + 1) * S; r++)
            if (keys[r] != keys[g * S]) {
                if (first < 0) first = g;
                spread++;
                break;
            }
    free(keys);
    if (spread && L->rank == 0)
        fprintf(stderr, "finetune: warning: %d of %d shard groups of %d ranks span several hosts (the first: ranks %d-%d), "
                "though %d ranks run per node: their all-gathers and reduce-scatters cross the network; place "
                "consecutive ranks on one node (srun's block distribution, mpiexec -ppn %d)\n", spread, L->W / S, S,
                first * S, first * S + S - 1, L->local_size, L->local_size);
    return 0;
}

// The device of this rank made current, before NCCL and the arena (GPU builds only). A rank
// takes the device of its place among the ranks of its node that see the same GPUs (the same
// host and CUDA_VISIBLE_DEVICES): its local rank when every task sees every GPU, 0 when each
// sees one, and with srun --gpu-bind=closest its place among its socket's tasks, however srun
// spread the tasks over the sockets (local rank modulo the visible count is right only for a
// block distribution; srun's default within a node is cyclic). The places come from one
// all-reduce of a key per rank over MPI; without MPI (a PMI2-only build) the local rank.
static int device_select(launch *L) {
#ifdef FT_HAVE_CUDA
    L->gpu_index = L->local_rank;
    if (L->mpi && L->W > 1) {
        const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
        double *keys = NULL;
        TRY(rank_keys(L, cvd ? cvd : "(all)", &keys));
        int before = 0;
        for (int r = 0; r < L->rank; r++) before += keys[r] == keys[L->rank];
        free(keys);
        L->gpu_index = before;
    }
    int device = 0;
    return backend_cuda_select_device(L->gpu_index, &device);
#else
    (void)L;
    return 0;
#endif
}

// --auto on GPUs: the device it plans for. Memory: the smallest total of the ranks' GPUs
// (collective over the MPI world; each rank reads the GPU of its local rank, before the
// device is selected); rates: the table's device whose family (its name's first four
// characters: "H100", "H200", "A100") the GPU's name holds, else the H100's, named so in the
// report. 0 / -1 on every rank when one could not read its GPU.
static int auto_device_probe(launch *L, plan_device *d) {
    static char label[200];
    char name[128] = "cuda";
    size_t total = 0;
    int rc = -1;
#ifdef FT_HAVE_CUDA
    rc = backend_cuda_device_memory(L->local_rank, &total, name, sizeof name);
#else
    ft_error("--auto: this build has no CUDA");
#endif
    double *mem = ft_calloc((size_t)L->W, sizeof(double), "GPU memory of the ranks");
    if (!mem) return -1;
    mem[L->rank] = rc == 0 ? (double)total : -1.0;   // (-1: this rank could not read it)
    int rc_all = comm_all_reduce_f64(&L->world, mem, (size_t)L->W);
    double least = mem[0];
    int failed = -1;
    for (int r = 0; r < L->W; r++) {
        if (mem[r] < 0 && failed < 0) failed = r;
        least = mem[r] < least ? mem[r] : least;
    }
    free(mem);
    if (rc != 0 || rc_all != 0) return -1;
    if (failed >= 0) return ft_error("--auto: rank %d could not read its GPU's memory", failed);
    const plan_device *rates = PLAN_FIT_DEVICE;
    for (int i = 0; i < plan_n_devices; i++) {
        char family[5];
        snprintf(family, sizeof family, "%s", plan_devices[i].name);
        if (strstr(name, family)) rates = &plan_devices[i];
    }
    *d = *rates;
    d->memory_bytes = (size_t)least;
    snprintf(label, sizeof label, "%s, the smallest of the ranks' (priced as the %s)", name, rates->name);
    d->name = label;
    return 0;
}

// ----------------------------------------------------------------------------
// open / close

int launch_open(launch *L, train_options *o, int *argc, char ***argv) {
    memset(L, 0, sizeof *L);
    L->cpu = backend_cpu();
    TRY(control_plane_open(L, argc, argv));
    watchdog_configure(o->collective_timeout, L->rank);
    L->nccl_comm_bytes = o->nccl_gib_per_comm > 0 ? (size_t)(o->nccl_gib_per_comm * 1073741824.0) : PLAN_NCCL_COMM_BYTES;
    L->nccl_max_ctas = o->nccl_max_ctas;
    int rc = 0, agreed = 0;
    if (o->auto_plan) {   // the grid's shard size may be its choice: first, agreed before the grid
        const int on_gpu = strcmp(o->device, "cpu") != 0;
        plan_device real;
        rc = on_gpu ? auto_device_probe(L, &real) : 0;
        if (rc == 0) rc = plan_auto_apply(o, L->W, on_gpu ? 2 : 4, on_gpu ? &real : NULL, &L->auto_choice);
        L->auto_done = rc == 0;
        if ((rc = comm_agree(&L->world, rc, &agreed)) != 0) return rc;
    }
    const int S = train_shard_size(o, L->W);
    rc = grid_open(L, S, o->device);
    // the device: a GPU's arena is sized from the memory plan of this very job, after the
    // NCCL communicators of several GPU ranks took their memory on it (review M5); GPU ranks
    // beyond one need NCCL (loaded at run time), checked before the device is touched
    const int gpu = strcmp(o->device, "cpu") != 0;
    size_t arena_bytes = 0;
    if (rc == 0 && gpu) rc = device_arena_bytes(o, L->W, &arena_bytes);
    const int nccl = gpu && (L->W > 1 || nccl_self_test(L));
    int one_lane = 0;
    if (rc == 0 && nccl) rc = nccl_available(L, &one_lane);
    if ((rc = comm_agree(&L->world, rc, &agreed)) != 0) return rc;
    if (nccl && (rc = nccl_agree_lanes(L, one_lane, nccl_self_test(L) ? 2 : S)) != 0) return rc;   // (the self-test's lane: concurrent)
    if (L->mpi && S > 1 && S <= L->local_size && L->W > S) rc = warn_spread_shards(L, S);   // (collective)
    if (rc == 0 && nccl) rc = device_select(L);   // (collective: every rank or none, after the agreement)
    if ((rc = comm_agree(&L->world, rc, &agreed)) != 0) return rc;
    if (nccl && (rc = data_plane_open(L, S)) != 0) return rc;   // -1, or COMM_PEER_FAILED
    rc = backend_set_attention(o->attention, o->deterministic);
    if (rc == 0) rc = backend_open(o->device, nccl ? L->gpu_index : L->local_rank, arena_bytes, &L->be);
#ifdef FT_HAVE_CUDA
    if (rc == 0 && gpu && L->rank == 0 && attn_engine_wheel_python())   // (the engine prints nothing itself)
        fprintf(stderr, "finetune: no libcudnn on the library path: loaded %s, from the nvidia-cudnn wheel of %s\n",
                attn_engine_library(), attn_engine_wheel_python());
#endif
    if ((rc = comm_agree(&L->world, rc, &agreed)) != 0) return rc;
    if (L->be != L->cpu) data_plane_bind(L);
    L->cc.local_size = L->local_size;
    L->ready = 1;
    return 0;
}

// Destroy the data plane's groups (the shard and replica groups before the world group they
// were split from, and only those created).
static void data_plane_close(launch *L) {
    if (L->dshard_own) comm_destroy(&L->dshard);
    if (L->dreplica_own) comm_destroy(&L->dreplica);
    if (L->nccl || L->be != L->cpu) comm_destroy(&L->dworld);
    L->dshard_own = L->dreplica_own = L->nccl = 0;
}

// the NCCL in use and its file ("NCCL 2.28.9 (libnccl.so.2)"; the CUDA builds only)
static const char *launch_nccl_describe(void) {
#ifdef FT_HAVE_CUDA
    return comm_nccl_describe();
#else
    return "NCCL";
#endif
}

void launch_print(const launch *L) {
    if (L->rank != 0) return;
    char ctas[64] = "CTAs per collective as NCCL chooses";   // (--nccl_max_ctas 0)
    if (L->nccl_max_ctas > 0) snprintf(ctas, sizeof ctas, "at most %d CTAs per collective", L->nccl_max_ctas);
    printf("finetune: bootstrap: %s; world %d rank(s), %d per node, %s per rank (rank 0: local rank %d, %s)",
           L->launcher, L->W, L->local_size, L->be == L->cpu ? "cpu" : "one GPU", L->local_rank,
           backend_describe(L->be));
    if (L->nccl)   // measured against the plan's assumption (--nccl_gib_per_comm, PLAN_NCCL_COMM_BYTES: src/plan.h)
        printf("; %d NCCL communicator(s) took %.2f GiB of device memory on rank 0 (planned %.2f GiB; %s), %s",
               L->n_nccl, L->nccl_bytes / 1073741824.0, L->n_nccl * (double)L->nccl_comm_bytes / 1073741824.0,
               launch_nccl_describe(), ctas);
    printf("\n");
}

void launch_abort(const launch *L) {
    fflush(NULL);   // what this rank printed so far (neither MPI_Abort nor _exit flushes stdio)
#ifdef FT_HAVE_MPI
    // The launcher forwards a rank's output through its proxy, which the abort kills: when
    // every rank aborted at once (two ranks on one GPU: NCCL's init fails on both), the error
    // lines were lost with it and the job ended silently (seen in CI). A moment first.
    if (L && L->mpi) {
        const struct timespec pause = {0, 300000000L};   // 0.3 s, once per failed job
        nanosleep(&pause, NULL);
        comm_mpi_abort(1);
    }
#else
    (void)L;
#endif
    _exit(1);
}

void launch_close(launch *L, int rc, int failure_agreed) {
    // MPI_Finalize waits for every rank with no deadline: enter it only once all got here
    watchdog_set_phase("teardown");
    if (L->ready && L->mpi && rc == 0 && L->W > 1) (void)comm_barrier(&L->world);
    if (!L->ready) {   // setup failed, agreed (or before the groups existed): no group is in use
        if (rc == -1 && L->W > 1 && L->nccl_setup) launch_abort(L);   // ... but for NCCL's setup (above)
        data_plane_close(L);
        backend_close(L->be);
#ifdef FT_HAVE_MPI
        if (L->mpi) comm_mpi_finalize();
#endif
        return;
    }
    // a failure the other ranks do not know: end the job before anything waits on them
    // (ncclCommDestroy synchronises streams that may wait on their collectives)
    if (rc == -1 && L->W > 1 && !failure_agreed) launch_abort(L);
    data_plane_close(L);
    if (L->mpi_split) {
        comm_destroy(&L->shard);
        comm_destroy(&L->replica);
    }
    comm_destroy(&L->world);
    backend_close(L->be);
#ifdef FT_HAVE_MPI
    if (L->mpi) comm_mpi_finalize();
#endif
#ifdef FT_HAVE_PMI2
    if (L->pmi2_open) boot_pmi2_finalize();
#endif
}
