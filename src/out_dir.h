// out_dir.h: the checks on a run's --out_dir (OUT): before it writes there, no earlier run's
// checkpoints or export in the way of a fresh start (or their removal with
// --overwrite_out_dir) and every rank seeing the one directory rank 0 locked (fs_lock_dir,
// fsutil.h); while it trains, the watch that OUT, its lock and its metrics file are still the
// ones this job holds. What OUT holds: checkpoints/ (ckpt.h), final/ and final_merged/ (hf_export.h),
// metrics.jsonl, samples.jsonl and .lock.
#pragma once
#include "comm.h"

// A fresh start (no --resume) writing into out_dir: refused when out_dir holds an earlier
// run's checkpoints (OUT/checkpoints/latest exists), whose steps would mix with the new run's
// and which --resume auto would later pick up, or its export (OUT/final, OUT/final_merged:
// the new run would replace a finished run's result, also after its checkpoints were deleted
// to free the disk), unless `overwrite` (--overwrite_out_dir). Reads only. 0 / -1 naming that
// file and the flags that would do.
int out_dir_check_fresh(const char *out_dir, int overwrite);

// Collective over `world` (2 or more ranks), after rank 0 locked out_dir (fs_lock_dir):
// every rank must see that directory, for --resume latest/auto is resolved by each rank in
// it and the checkpoints rank 0 writes there are what every rank resumes from. Each rank
// compares OUT/.lock's content with rank 0's; rank0_locked: rank 0 holds the lock (0 on the
// other ranks; 0 on rank 0 too when the filesystem has no locks: nothing to compare). A rank
// that does not see it looks again once a second for up to 60 s (a network filesystem's
// cache). 0, or -1 on a rank that does not see it (one line naming the rank, its host, what
// it found and the remedy).
int out_dir_check_shared(const char *out_dir, int rank0_locked, comm *world);

// Rank 0, a fresh start with --overwrite_out_dir, before anything is written: remove the
// earlier run's OUT/checkpoints, OUT/final and OUT/final_merged. 0 / -1 naming what stayed.
int out_dir_clear(const char *out_dir);

// Rank 0 of a running job: is --out_dir still the directory this job locked and writes into, and are its lock
// and metrics.jsonl still the files this job holds open there? A directory removed (rm -rf) or
// replaced while training would take the metrics, the checkpoints and the export with it:
// records appended to an unlinked metrics.jsonl, checkpoint paths recreated half-way, and
// nothing said until the end. The directory, held open since the lock (so its inode number
// cannot be reused by one made in its place), is compared with what the path names now; so are
// OUT/.lock (removed, the lock no longer keeps another job out: one started now creates and
// locks a new one and writes into OUT beside this one) and OUT/metrics.jsonl (removed or
// replaced, the records go to a file nobody sees). A stat and an fstat each, once a step,
// before the export and each sampled game. The directory gone: one warning naming it, then an
// error; a file gone: an error naming it. Either way the caller agrees it with every rank and
// the job stops, exit 1 (it saves nothing more: a resume continues from the last checkpoint,
// with the lock and the metrics file made anew). `after`: where the job is, for the message.
// dir_fd: OUT opened at the lock (-1: nothing is checked); lock_fd: OUT/.lock's (-1: no lock,
// a filesystem without locks); metrics_fd: OUT/metrics.jsonl's (-1: not open). 0 / -1.
int out_dir_watch(const char *out_dir, int dir_fd, int lock_fd, int metrics_fd, const char *after);
