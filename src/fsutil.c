// fsutil.c: directories and durable, atomic file writes (see fsutil.h).
#define _GNU_SOURCE   // renameat2
#include "fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common.h"
#include "safetensors.h"   // st_fsync_parent_dir

int fs_mkdirs(const char *path) {
    char buf[FT_PATH_MAX];
    TRY(ft_path(buf, sizeof buf, "%s", path));
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return ft_error("%s: cannot create directory: %s", buf, strerror(errno));
            *p = c;
            if (c == '\0') break;
        }
    }
    struct stat sb;   // mkdir's EEXIST also covers a file of that name
    if (stat(path, &sb) != 0) return ft_error("%s: cannot create directory: %s", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ft_error("%s: exists and is not a directory", path);
    if (access(path, W_OK) != 0) return ft_error("%s: directory is not writable: %s", path, strerror(errno));
    return 0;
}

int fs_remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return unlink(path) == 0 || errno == ENOENT ? 0 : -1;
    struct dirent *e;
    char sub[FT_PATH_MAX];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (ft_path(sub, sizeof sub, "%s/%s", path, e->d_name) == 0) fs_remove_tree(sub);
    }
    closedir(d);
    return rmdir(path);
}

void fs_remove_prefixed(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    if (!d) return;
    const size_t n = strlen(prefix);
    struct dirent *e;
    char sub[FT_PATH_MAX];
    while ((e = readdir(d)) != NULL)
        if (strncmp(e->d_name, prefix, n) == 0 && ft_path(sub, sizeof sub, "%s/%s", dir, e->d_name) == 0)
            fs_remove_tree(sub);
    closedir(d);
}

int fs_fsync_path(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ft_error("%s: cannot open to fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    close(fd);
    return rc == 0 ? 0 : ft_error("%s: fsync failed: %s", path, strerror(errno));
}

int fs_copy_file(const char *src, const char *dst) {
    FILE *in = fopen(src, "rb");
    if (!in) return ft_error("%s: cannot read: %s", src, strerror(errno));
    FILE *out = fopen(dst, "wb");
    if (!out) { fclose(in); return ft_error("%s: cannot create: %s", dst, strerror(errno)); }
    char buf[65536];
    size_t n;
    int rc = 0;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0)
        if (fwrite(buf, 1, n, out) != n) { rc = ft_error("%s: write failed: %s", dst, strerror(errno)); break; }
    if (ferror(in)) rc = ft_error("%s: read failed", src);
    fclose(in);
    if (fflush(out) != 0 || fsync(fileno(out)) != 0) rc = rc ? rc : ft_error("%s: flush failed: %s", dst, strerror(errno));
    fclose(out);
    return rc;
}

int fs_write_text_atomic(const char *path, const char *text) {
    char tmp[FT_PATH_MAX];
    TRY(ft_path(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()));
    FILE *f = fopen(tmp, "w");
    if (!f) return ft_error("%s: cannot create: %s", tmp, strerror(errno));
    int ok = fputs(text, f) >= 0 && fflush(f) == 0 && fsync(fileno(f)) == 0;
    ok &= fclose(f) == 0;
    if (!ok || rename(tmp, path) != 0) {
        unlink(tmp);
        return ft_error("%s: cannot write: %s", path, strerror(errno));
    }
    return st_fsync_parent_dir(path);
}

// TEST-ONLY: FT_TEST_PUBLISH_KILL=1 ends the process (exit 9) right after the swap that
// replaces an existing dst, before the old copy is removed: a kill at the worst moment
// (tests/test_train.sh shows the checkpoint it replaced is never missing and the leftover goes)
static void test_kill_after_swap(void) {
    const char *k = ft_getenv("FT_TEST_PUBLISH_KILL");
    if (k && strcmp(k, "1") == 0) _exit(9);
}

int fs_publish_dir(const char *tmp, const char *dst) {
    TRY(fs_fsync_path(tmp));
    struct stat sb;
    if (stat(dst, &sb) != 0) {   // nothing to replace
        if (rename(tmp, dst) != 0) return ft_error("%s: cannot rename %s into place: %s", dst, tmp, strerror(errno));
        return st_fsync_parent_dir(dst);
    }
    // replace: swap the two names in one step (Linux 3.15+), so dst is at every moment either
    // the old or the new directory; tmp then names the old one until it is removed (a kill
    // before that leaves it under tmp's name, which the caller's next cleanup of temporary
    // names removes)
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_EXCHANGE) == 0) {
        test_kill_after_swap();
        TRY(st_fsync_parent_dir(dst));
        fs_remove_tree(tmp);
        return 0;
    }
    if (errno != EINVAL && errno != ENOSYS)
        return ft_error("%s: cannot swap %s into place: %s", dst, tmp, strerror(errno));
    // a file system without the swap: move dst aside (under tmp's name plus ".old", so the
    // same cleanup finds it), rename tmp into place, then remove the old; a failure puts it back
    char old[FT_PATH_MAX];
    TRY(ft_path(old, sizeof old, "%s.old", tmp));
    if (rename(dst, old) != 0) return ft_error("%s: cannot move aside: %s", dst, strerror(errno));
    if (rename(tmp, dst) != 0) {
        const int e = errno;
        (void)rename(old, dst);
        return ft_error("%s: cannot rename %s into place: %s", dst, tmp, strerror(e));
    }
    TRY(st_fsync_parent_dir(dst));
    fs_remove_tree(old);
    return 0;
}

int fs_lock_dir(const char *dir, const char *what, int *fd, int *created) {
    *fd = -1;
    *created = 0;
    struct stat sb;
    if (stat(dir, &sb) != 0) *created = 1;
    TRY(fs_mkdirs(dir));
    char p[FT_PATH_MAX];
    TRY(ft_path(p, sizeof p, "%s/.lock", dir));
    int f = -1, e = 0;   // e: fcntl's errno when the lock was not taken
    // A holder removes the file at exit while still holding it (fs_unlock_dir): a lock taken
    // on a file opened just before that removal is on a file no longer at p, and the next job
    // would create and lock a new one beside it. So the lock counts only on the file still at
    // p; else open p again (a few times: each retry needs another job's exit in between).
    for (int attempt = 0;; attempt++) {
        f = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (f < 0) return ft_error("%s: cannot create (%s's lock): %s", p, what, strerror(errno));
        struct flock fl;
        memset(&fl, 0, sizeof fl);
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        if (fcntl(f, F_SETLK, &fl) != 0) {   // held by another job, or no locks: below
            e = errno;
            break;
        }
        struct stat held, now;
        if (fstat(f, &held) == 0 && stat(p, &now) == 0 && held.st_dev == now.st_dev && held.st_ino == now.st_ino) break;
        close(f);
        if (attempt == 8) return ft_error("%s: %s's lock file keeps being replaced; is another job starting?", p, what);
    }
    if (e != 0) {
        if (e == EACCES || e == EAGAIN) {
            char holder[256] = "";
            const ssize_t n = pread(f, holder, sizeof holder - 1, 0);
            holder[n > 0 ? n : 0] = '\0';
            holder[strcspn(holder, "\r\n")] = '\0';
            close(f);
            return ft_error("%s: %s %s is in use by another finetune job (%s); two jobs writing one directory would "
                            "overwrite each other's checkpoints and metrics: wait for that job to end, or choose another %s",
                            p, what, dir, holder[0] ? holder : "holder unknown", what);
        }
        close(f);   // a file system without locks (e.g. Lustre mounted without flock): go on unguarded
        fprintf(stderr, "finetune: warning: %s: cannot lock (%s): nothing stops two jobs from writing %s %s at once\n",
                p, strerror(e), what, dir);
        return 0;
    }
    char host[128], text[256];
    ft_hostname(host, sizeof host);
    const int len = snprintf(text, sizeof text, "pid %d on host %s\n", (int)getpid(), host);
    // (fsync: the other ranks compare the file with rank 0's, out_dir.c out_dir_check_shared; on
    // NFS they see what reached the server)
    const int written = ftruncate(f, 0) == 0 && pwrite(f, text, (size_t)len, 0) == len && fsync(f) == 0;
    (void)written;   // the holder's name is informative (and a failed write shows as a mismatch)
    *fd = f;
    return 0;
}

int fs_still_at(int fd, const char *path, char *why, size_t n) {
    struct stat held, now;
    if (fstat(fd, &held) != 0) return 1;
    const char *r;
    char buf[96];
    if (stat(path, &now) != 0) {
        const int e = errno;
        if (e != ENOENT && e != ENOTDIR && e != ESTALE && held.st_nlink > 0) return 1;
        snprintf(buf, sizeof buf, "is gone (%s)", strerror(e));
        r = buf;
    } else if (held.st_dev == now.st_dev && held.st_ino == now.st_ino) return 1;
    else r = held.st_nlink == 0 ? "was removed and another was made in its place"
                                : "was renamed away and another now has its name";
    if (why && n) snprintf(why, n, "%s", r);
    return 0;
}

void fs_unlock_dir(const char *dir, int fd, int remove_dir) {
    char p[FT_PATH_MAX];   // unlinked while still held: a job refused by it has gone already
    if (fd >= 0 && ft_path(p, sizeof p, "%s/.lock", dir) == 0 && fs_still_at(fd, p, NULL, 0)) unlink(p);
    if (remove_dir) rmdir(dir);   // only when empty (also without a lock: a file system without locks)
    if (fd >= 0) close(fd);
}


// ----------------------------------------------------------------------------
// host memory

// The first number in the file at path (a cgroup value), or -1 when it is missing, says
// "max", or holds no number.
static double read_number(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    double v = -1;
    if (fscanf(f, "%lf", &v) != 1) v = -1;
    fclose(f);
    return v;
}

// Lower *limit to the memory limits (file `max_file`) of cgroup `cg` (a path in the hierarchy
// mounted at dir) and of its ancestors, naming the tightest in what[n].
static void cgroup_limit(const char *dir, const char *cg, const char *max_file, double *limit, char *what, size_t n) {
    char path[2 * FT_PATH_MAX + 32], q[FT_PATH_MAX];   // (room for dir + q + the file: no truncation)
    snprintf(q, sizeof q, "%s", cg);
    for (;;) {
        snprintf(path, sizeof path, "%s%s/%s", dir, strcmp(q, "/") == 0 ? "" : q, max_file);
        const double max = read_number(path);
        if (max >= 0 && max < 0x1p60 && max < *limit) {   // (v1 writes about 2^63 for "no limit")
            *limit = max;
            snprintf(what, n, "cgroup %s: %s", q, max_file);
        }
        char *slash = strrchr(q, '/');
        if (!slash || strcmp(q, "/") == 0) return;
        if (slash == q) snprintf(q, sizeof q, "/");
        else *slash = '\0';
    }
}

int fs_host_memory_limit(const char *root, double *bytes, char *what, size_t n) {
    char path[FT_PATH_MAX], line[FT_PATH_MAX];
    snprintf(path, sizeof path, "%s/proc/meminfo", root);
    FILE *f = fopen(path, "r");
    if (!f) return ft_error("%s: %s", path, strerror(errno));
    double total_kb = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lf kB", &total_kb) == 1) break;
    fclose(f);
    if (total_kb < 0) return ft_error("%s: no MemTotal line", path);
    *bytes = total_kb * 1024;
    snprintf(what, n, "MemTotal");
    snprintf(path, sizeof path, "%s/proc/self/cgroup", root);
    if (!(f = fopen(path, "r"))) return 0;   // no cgroups: the machine's memory alone
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = '\0';
        char dir[FT_PATH_MAX];
        if (strncmp(line, "0::", 3) == 0) {   // v2: "0::/path"
            snprintf(dir, sizeof dir, "%s/sys/fs/cgroup", root);
            cgroup_limit(dir, line + 3, "memory.max", bytes, what, n);
        } else {   // v1: "N:controllers:/path", the memory controller's hierarchy
            char *c = strchr(line, ':'), *p = c ? strchr(c + 1, ':') : NULL;
            if (!p) continue;
            *p = '\0';
            if (strcmp(c + 1, "memory") != 0 && !strstr(c + 1, "memory,") && !strstr(c + 1, ",memory")) continue;
            snprintf(dir, sizeof dir, "%s/sys/fs/cgroup/memory", root);
            cgroup_limit(dir, p + 1, "memory.limit_in_bytes", bytes, what, n);
        }
    }
    fclose(f);
    return 0;
}
