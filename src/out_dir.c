// out_dir.c: the checks on --out_dir, before a run writes into it and while it trains (see out_dir.h).
#include "out_dir.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "fsutil.h"

// ----------------------------------------------------------------------------
// before the run writes

int out_dir_check_fresh(const char *out_dir, int overwrite) {
    static const struct { const char *path, *what; } earlier[] = {
        {"checkpoints/latest", "checkpoints"}, {"final", "export"}, {"final_merged", "merged export"}};
    for (size_t i = 0; i < sizeof earlier / sizeof earlier[0] && !overwrite; i++) {
        char p[FT_PATH_MAX];
        struct stat sb;
        TRY(ft_path(p, sizeof p, "%s/%s", out_dir, earlier[i].path));
        if (lstat(p, &sb) != 0) continue;
        return ft_error("%s: --out_dir holds an earlier run's %s: %s--overwrite_out_dir starts over (removing its "
                        "checkpoints/, final/ and final_merged/), or choose another --out_dir",
                        p, earlier[i].what, i == 0 ? "--resume latest continues it, " : "");
    }
    return 0;
}

// A node-local path (a job's --out_dir under /tmp, or a filesystem mounted on some nodes
// only) gives each node its own directory: one rank resumed at step 3 while another started
// fresh and mixed their weights, then the job hung until the watchdog blamed the network.
// Rank 0's lock file names it ("pid P on host H"): each rank reads OUT/.lock and compares its
// hash with rank 0's (sent as 16-bit pieces through a sum, exact in doubles). Skipped when
// rank 0 holds no lock (a filesystem without locks: warned about already).
// OUT/.lock's text (up to n - 1 bytes, "" when it cannot be read) and its hash (0: none).
static uint64_t lock_text(const char *path, char *text, size_t n) {
    text[0] = '\0';
    const int f = path[0] ? open(path, O_RDONLY | O_CLOEXEC) : -1;
    const ssize_t got = f >= 0 ? read(f, text, n - 1) : -1;
    if (f >= 0) close(f);
    text[got > 0 ? got : 0] = '\0';
    return got > 0 ? ft_hash64(text, (size_t)got) : 0;
}

int out_dir_check_shared(const char *out_dir, int rank0_locked, comm *world) {
    char path[FT_PATH_MAX] = "", text[256];
    const int path_rc = ft_path(path, sizeof path, "%s/.lock", out_dir);   // (its error kept for after the collective)
    uint64_t mine = path_rc == 0 ? lock_text(path, text, sizeof text) : 0;
    double theirs[5] = {0};   // rank 0's hash in four 16-bit pieces, and whether it holds a lock
    if (world->rank == 0) {
        for (int k = 0; k < 4; k++) theirs[k] = (double)((mine >> (16 * k)) & 0xffff);
        theirs[4] = rank0_locked;
    }
    TRY(comm_all_reduce_f64(world, theirs, 5));
    if (path_rc != 0) return -1;
    if (theirs[4] == 0 || world->rank == 0) return 0;
    uint64_t want = 0;
    for (int k = 0; k < 4; k++) want |= (uint64_t)theirs[k] << (16 * k);
    // A network filesystem may answer from its cache for a while (NFS keeps a directory's
    // attributes, and a name it found missing, up to acdirmax, 60 s by default): look again,
    // once a second, before calling the directory another (FT_TEST_OUT_DIR_WAIT_S: test-only)
    const char *wait_env = ft_getenv("FT_TEST_OUT_DIR_WAIT_S");
    const int wait_s = wait_env ? atoi(wait_env) : 60;
    for (int t = 0; mine != want && t < wait_s; t++) {
        sleep(1);
        mine = lock_text(path, text, sizeof text);
    }
    if (mine == want) return 0;
    text[strcspn(text, "\r\n")] = '\0';
    // (the line main prints names this rank and its host)
    return ft_error("--out_dir %s: this rank does not see the lock rank 0 holds in it (%s%s, after %d s): every rank "
                    "must see the same directory (a filesystem shared by all nodes, not a node-local path), or "
                    "checkpoints and --resume differ between nodes", out_dir,
                    text[0] ? "it finds another job's: " : "no .lock there", text, wait_s);
}

int out_dir_clear(const char *out_dir) {
    static const char *const sub[] = {"checkpoints", "final", "final_merged"};
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
        char p[FT_PATH_MAX];
        struct stat sb;
        TRY(ft_path(p, sizeof p, "%s/%s", out_dir, sub[i]));
        if (lstat(p, &sb) == 0 && fs_remove_tree(p) != 0)
            return ft_error("%s: cannot remove (--overwrite_out_dir): %s", p, strerror(errno));
    }
    return 0;
}

// ----------------------------------------------------------------------------
// the watch while training

int out_dir_watch(const char *out_dir, int dir_fd, int lock_fd, int metrics_fd, const char *after) {
    char why[160], p[FT_PATH_MAX];
    if (dir_fd < 0) return 0;
    if (!fs_still_at(dir_fd, out_dir, why, sizeof why)) {
        fprintf(stderr, "finetune: warning: --out_dir %s was deleted or replaced while training: metrics, checkpoints "
                "and the export would be lost\n", out_dir);
        return ft_error("stopping %s: --out_dir %s %s, so nothing this job saves would reach it; start the job again",
                        after, out_dir, why);
    }
    const struct { int fd; const char *name, *loss; } held[] = {   // fd -1: none (no locks; metrics closed)
        {lock_fd, ".lock", "this job no longer keeps another out of --out_dir"},
        {metrics_fd, "metrics.jsonl", "the records this job appends would not reach it"},
    };
    for (size_t i = 0; i < sizeof held / sizeof held[0]; i++) {
        if (held[i].fd < 0) continue;
        TRY(ft_path(p, sizeof p, "%s/%s", out_dir, held[i].name));
        if (!fs_still_at(held[i].fd, p, why, sizeof why))
            return ft_error("stopping %s: %s %s, so %s; start the job again", after, p, why, held[i].loss);
    }
    return 0;
}
