// test_fsutil.c: the --out_dir lock of src/fsutil.c (fs_lock_dir / fs_unlock_dir).
//   A lock taken, then refused to a second process (fork) naming the holder, then released
//   (the lock file removed). The race of a job that opened OUT/.lock just before its holder
//   removed it at exit (fs_unlock_dir unlinks the file, then closes it): its lock lands on the
//   unlinked file, and a third job creating a fresh OUT/.lock would run beside it. Simulated
//   here by this binary's fcntl, which removes the lock file just before the first lock call
//   goes through: fs_lock_dir must end up holding the file that is at OUT/.lock. Without a
//   lock (a file system without them: fd -1), fs_unlock_dir still removes the empty directory
//   a failed job created. fs_still_at, the check a running job makes on its --out_dir: the
//   same directory, then one renamed away, one removed (rm -rf) with another made at its path
//   (held open, its inode number cannot be reused: told apart even on a file system that would
//   reuse it), and one removed outright; and fs_unlock_dir leaves alone a .lock at OUT that is
//   not its own (another job's, in a directory made in place of the removed one).
//   fs_host_memory_limit on a table of fake /proc + /sys/fs/cgroup trees: MemTotal alone,
//   cgroup v2 limits (the job's, with usage not counted; nested ones either way round; one
//   above the machine's memory; the namespace root's), v1's limit and its "no limit" value,
//   and a meminfo without MemTotal or missing refused.
// Runtime: well under a second.
#define _GNU_SOURCE
#include <fcntl.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common.h"
#include "fsutil.h"
#include "test.h"

// fsutil.c's fcntl resolves to this one (defined in the executable): when g_unlink_before_lock
// is set, the next F_SETLK first removes that path, as a holder exiting between the caller's
// open and its lock would.
static const char *g_unlink_before_lock;
int fcntl(int fd, int cmd, ...) {
    va_list ap;
    va_start(ap, cmd);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    if (cmd == F_SETLK && g_unlink_before_lock) {
        unlink(g_unlink_before_lock);
        g_unlink_before_lock = NULL;
    }
    return (int)syscall(SYS_fcntl, fd, cmd, arg);
}

// The lock descriptor `fd` holds the file now at `path`.
static int holds_file_at(int fd, const char *path) {
    struct stat a, b;
    return fd >= 0 && fstat(fd, &a) == 0 && stat(path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// In a child process: fs_lock_dir on dir is refused (exit 0) or not (exit 1).
static int refused_in_child(const char *dir) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) {
        int fd, created;
        const int rc = fs_lock_dir(dir, "--out_dir", &fd, &created);
        _exit(rc != 0 && strstr(ft_error_message(), "is in use by another finetune job") ? 0 : 1);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

// ----------------------------------------------------------------------------
// fs_host_memory_limit on fake /proc and /sys/fs/cgroup trees

#define GIB 1073741824.0
typedef struct {
    const char *name;
    const char *files[8];   // "relative/path=content" pairs, NULL-terminated
    double want_gib;        // -1: an error is expected
    const char *want_what;  // a substring of what[]
} memory_case;

static const memory_case memory_cases[] = {
    {"MemTotal alone (no cgroup file)", {"proc/meminfo=MemTotal: 16777216 kB\nMemAvailable: 1048576 kB\n"}, 16, "MemTotal"},
    {"v2: the job's memory.max (a step below without a limit; usage does not count)",
     {"proc/meminfo=MemTotal: 16777216 kB\n", "proc/self/cgroup=0::/job_1/step_0\n",
      "sys/fs/cgroup/job_1/memory.max=4294967296\n", "sys/fs/cgroup/job_1/memory.current=3221225472\n",
      "sys/fs/cgroup/job_1/step_0/memory.max=max\n"}, 4, "cgroup /job_1: memory.max"},
    {"v2: the tighter of two nested limits",
     {"proc/meminfo=MemTotal: 16777216 kB\n", "proc/self/cgroup=0::/a/b\n", "sys/fs/cgroup/a/memory.max=6442450944\n",
      "sys/fs/cgroup/a/b/memory.max=2147483648\n"}, 2, "cgroup /a/b"},
    {"v2: the outer limit tighter than the inner one",
     {"proc/meminfo=MemTotal: 16777216 kB\n", "proc/self/cgroup=0::/a/b\n", "sys/fs/cgroup/a/memory.max=1073741824\n",
      "sys/fs/cgroup/a/b/memory.max=2147483648\n"}, 1, "cgroup /a: memory.max"},
    {"v2: a limit above the machine's memory leaves MemTotal",
     {"proc/meminfo=MemTotal: 1048576 kB\n", "proc/self/cgroup=0::/j\n", "sys/fs/cgroup/j/memory.max=8589934592\n"}, 1,
     "MemTotal"},
    {"v2: the namespace root's own limit (cgroup /)",
     {"proc/meminfo=MemTotal: 16777216 kB\n", "proc/self/cgroup=0::/\n", "sys/fs/cgroup/memory.max=2147483648\n"}, 2,
     "cgroup /: memory.max"},
    {"v1: the memory controller's limit (other controllers' lines skipped)",
     {"proc/meminfo=MemTotal: 16777216 kB\n", "proc/self/cgroup=12:cpu,cpuacct:/slurm\n5:memory:/slurm/job_9\n",
      "sys/fs/cgroup/memory/slurm/job_9/memory.limit_in_bytes=3221225472\n",
      "sys/fs/cgroup/memory/slurm/memory.limit_in_bytes=9223372036854771712\n"}, 3, "memory.limit_in_bytes"},
    {"v1: no limit (the near-2^63 default)",
     {"proc/meminfo=MemTotal: 4194304 kB\n", "proc/self/cgroup=5:memory:/\n",
      "sys/fs/cgroup/memory/memory.limit_in_bytes=9223372036854771712\n"}, 4, "MemTotal"},
    {"no MemTotal line: an error", {"proc/meminfo=MemAvailable: 1 kB\n"}, -1, "no MemTotal"},
    {"no meminfo: an error", {NULL}, -1, "proc/meminfo"},
};

// Write each "path=content" of c under root (directories made as needed).
static void write_tree(const char *root, const memory_case *c) {
    for (int i = 0; c->files[i]; i++) {
        char path[512], dir[512];
        const char *eq = strchr(c->files[i], '=');
        snprintf(path, sizeof path, "%s/%.*s", root, (int)(eq - c->files[i]), c->files[i]);
        snprintf(dir, sizeof dir, "%s", path);
        *strrchr(dir, '/') = '\0';
        EXPECT(fs_mkdirs(dir) == 0, "mkdir -p %s: %s", dir, ft_error_message());
        FILE *f = fopen(path, "w");
        EXPECT(f && fputs(eq + 1, f) >= 0 && fclose(f) == 0, "write %s", path);
    }
}

static void test_host_memory(const char *base) {
    for (size_t k = 0; k < sizeof memory_cases / sizeof *memory_cases; k++) {
        const memory_case *c = &memory_cases[k];
        char root[300], what[256] = "";
        snprintf(root, sizeof root, "%s/mem%zu", base, k);
        write_tree(root, c);
        double got = -2;
        ft_error_clear();
        const int rc = fs_host_memory_limit(root, &got, what, sizeof what);
        if (c->want_gib < 0)
            EXPECT(rc == -1 && strstr(ft_error_message(), c->want_what), "%s: rc %d, '%s'", c->name, rc, ft_error_message());
        else
            EXPECT(rc == 0 && fabs(got / GIB - c->want_gib) < 1e-9 && strstr(what, c->want_what),
                   "%s: rc %d, %.6f GiB (want %g) from '%s' (want '%s'): %s", c->name, rc, got / GIB, c->want_gib, what,
                   c->want_what, ft_error_message());
        EXPECT(fs_remove_tree(root) == 0 && access(root, F_OK) != 0, "rm -rf %s", root);
    }
    ft_error_clear();
    double here = 0;
    char what[256];
    EXPECT(fs_host_memory_limit("", &here, what, sizeof what) == 0 && here > 0, "this machine: %.2f GiB (%s) %s",
           here / GIB, what, ft_error_message());
}

int main(void) {
    char tmpl[] = "/tmp/test_fsutil.XXXXXX";
    const char *base = mkdtemp(tmpl);
    if (!base) { perror("mkdtemp"); return 1; }
    char dir[256], lock[300];
    snprintf(dir, sizeof dir, "%s/out", base);
    snprintf(lock, sizeof lock, "%s/.lock", dir);

    // taken, refused to another process, released
    int fd = -1, created = 0;
    EXPECT(fs_lock_dir(dir, "--out_dir", &fd, &created) == 0 && fd >= 0 && created == 1, "lock: %s", ft_error_message());
    EXPECT(holds_file_at(fd, lock), "the lock is held on %s", lock);
    EXPECT(refused_in_child(dir), "a second job is refused while the lock is held");
    fs_unlock_dir(dir, fd, 0);
    EXPECT(access(lock, F_OK) != 0, "%s removed on release", lock);

    // the lock file removed between the open and the lock: the lock must end up on the file
    // at OUT/.lock (else the next job creates a new one and runs beside this one)
    g_unlink_before_lock = lock;
    fd = -1;
    EXPECT(fs_lock_dir(dir, "--out_dir", &fd, &created) == 0 && fd >= 0, "lock after a removal: %s", ft_error_message());
    EXPECT(g_unlink_before_lock == NULL, "the removal was simulated");
    EXPECT(holds_file_at(fd, lock), "the lock is held on the file at %s, not on a removed one", lock);
    EXPECT(refused_in_child(dir), "after the removal race, a second job is still refused");
    fs_unlock_dir(dir, fd, 1);
    EXPECT(access(dir, F_OK) != 0, "an empty directory the job created is removed with remove_dir");

    // a file system without locks (fd -1): the failed job's empty directory still goes
    EXPECT(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    fs_unlock_dir(dir, -1, 1);
    EXPECT(access(dir, F_OK) != 0, "without a lock (fd -1), remove_dir still removes the empty directory");

    // fs_still_at: the directory a job opened, later renamed away, removed and replaced, removed
    char why[160] = "", moved[300];
    snprintf(moved, sizeof moved, "%s/moved", base);
    EXPECT(fs_lock_dir(dir, "--out_dir", &fd, &created) == 0 && fd >= 0, "lock: %s", ft_error_message());
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    EXPECT(dfd >= 0 && fs_still_at(dfd, dir, why, sizeof why) == 1, "fs_still_at: the same directory");
    EXPECT(rename(dir, moved) == 0 && mkdir(dir, 0755) == 0, "rename %s away, mkdir in its place", dir);
    EXPECT(fs_still_at(dfd, dir, why, sizeof why) == 0 && strstr(why, "renamed away"), "renamed: '%s'", why);
    fs_unlock_dir(dir, fd, 0);   // the lock file moved with its directory: stays there, and the new dir too
    EXPECT(access(moved, F_OK) == 0 && access(dir, F_OK) == 0, "unlock after a rename leaves both directories");
    close(dfd);
    rmdir(dir);
    EXPECT(rename(moved, dir) == 0, "rename back");
    unlink(lock);
    EXPECT(fs_lock_dir(dir, "--out_dir", &fd, &created) == 0 && fd >= 0, "lock: %s", ft_error_message());
    dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    EXPECT(dfd >= 0 && unlink(lock) == 0 && rmdir(dir) == 0 && mkdir(dir, 0755) == 0, "rm -rf %s; mkdir", dir);
    EXPECT(fs_still_at(dfd, dir, why, sizeof why) == 0 && strstr(why, "removed and another"), "replaced: '%s'", why);
    FILE *other = fopen(lock, "w");   // another job's lock in the new directory
    EXPECT(other && fputs("pid 1 on host other\n", other) >= 0 && fclose(other) == 0, "write %s", lock);
    fs_unlock_dir(dir, fd, 0);
    EXPECT(access(lock, F_OK) == 0, "fs_unlock_dir leaves another job's %s alone", lock);
    unlink(lock);
    EXPECT(rmdir(dir) == 0 && fs_still_at(dfd, dir, why, sizeof why) == 0 && strstr(why, "is gone"),
           "removed: '%s'", why);
    close(dfd);
    test_host_memory(base);
    rmdir(base);
    TEST_SUMMARY("test_fsutil");
}
