// fsutil.h: directories and durable, atomic file writes for checkpoints and exports. Every
// function returns 0, or -1 with ft_error naming the path (fs_remove_tree: -1, no message).
#pragma once

#include <stddef.h>

// mkdir -p, then check that path is a writable directory.
int fs_mkdirs(const char *path);
// rm -rf (best effort: a missing path is success).
int fs_remove_tree(const char *path);
// rm -rf every entry of `dir` whose name starts with `prefix` (best effort, no message): the
// temporary directories of a writer killed before it renamed them into place.
void fs_remove_prefixed(const char *dir, const char *prefix);
// fsync a file or directory by path.
int fs_fsync_path(const char *path);
// Copy src to dst (created or truncated) and fsync dst.
int fs_copy_file(const char *src, const char *dst);
// Write `text` to `path` atomically: a temporary file, fsync, rename, fsync of the directory.
int fs_write_text_atomic(const char *path, const char *text);
// Move the finished temporary directory `tmp` to `dst` (fsync'ed first) and fsync the parent.
// An existing `dst` is replaced atomically (renameat2 RENAME_EXCHANGE; where the file system
// lacks it, moved aside as tmp + ".old" and put back on failure), then removed from under
// tmp's name: a kill at any point leaves `dst` whole (old or new) and at most a directory
// named after tmp, which the caller's cleanup of its temporary prefix removes.
int fs_publish_dir(const char *tmp, const char *dst);
// Hold `dir`/.lock exclusively (an fcntl write lock, released when the process ends or
// fs_unlock_dir closes it) so that two jobs never write one directory at once; the file holds
// "pid P on host H" of the holder. `dir` is created when missing (*created = 1: the caller may
// undo it with fs_unlock_dir). *fd = the lock's descriptor, or -1 when the file system has
// no locks (one warning on stderr, no error). A lock held by another process: -1 naming the
// file, the flag `what` and the holder. The lock counts only on the file still at `dir`/.lock
// (one its holder removed at exit between our open and our lock is opened again).
int fs_lock_dir(const char *dir, const char *what, int *fd, int *created);
// Release fs_lock_dir's lock (fd -1: none was taken) and remove the lock file (a killed job leaves
// it: harmless, the next job takes it over) when `dir`/.lock is still that file (not another
// job's, in a directory made in place of a removed one); `remove_dir`: also rmdir `dir` when it
// is empty (a job that created it and failed before writing anything).
void fs_unlock_dir(const char *dir, int fd, int remove_dir);
// Whether `path` still names the file or directory open as `fd` (the same st_dev and st_ino):
// 1 yes, or when that cannot be told (fstat fails, or stat fails otherwise than with ENOENT,
// ENOTDIR or ESTALE while the file is still linked); 0 when it was removed, renamed away or
// replaced by another, with a short reason ("is gone (No such file or directory)") in
// why[n]. No ft_error: the caller decides what it means.
int fs_still_at(int fd, const char *path, char *why, size_t n);

// The host memory this process may use at most: the smaller of the machine's MemTotal
// (<root>/proc/meminfo) and every memory limit of its cgroup and the cgroup's ancestors (v2:
// memory.max; v1: memory.limit_in_bytes; "max" and v1's near-2^63 value mean none), as a
// Slurm job's --mem sets one on its job's cgroup. Limits, not what is free now: ranks of one
// job checking at slightly different times must not see each other's allocations. `root`: ""
// for this machine (tests give a fake tree). *bytes, and in what[n] which bound it
// ("MemTotal", "cgroup /job_5: memory.max"). 0, or -1 naming the meminfo file when it cannot
// be read.
int fs_host_memory_limit(const char *root, double *bytes, char *what, size_t n);
