// wheel_lib.c: shared libraries of pip wheels, found from the file system (see wheel_lib.h).
#include "wheel_lib.h"

#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common.h"

// 1 when `file` exists and is readable (a library: dlopen decides the rest)
static int readable(const char *file) { return access(file, R_OK) == 0; }

// `pattern` (a glob ending in site-packages) matched newest first (glob sorts: python3.9
// after python3.12 as text, so the numeric minor version decides); the first match holding
// rel goes to out. 1 / 0.
static int first_in(const char *pattern, const char *rel, char *out, size_t n) {
    glob_t g;
    if (glob(pattern, GLOB_BRACE, NULL, &g) != 0) return 0;
    int best = -1, best_minor = -1;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        char file[FT_PATH_MAX];
        const int w = snprintf(file, sizeof file, "%s/%s", g.gl_pathv[i], rel);
        if (w < 0 || (size_t)w >= sizeof file || !readable(file)) continue;
        const char *v = strstr(g.gl_pathv[i], "/python3.");
        const int minor = v ? atoi(v + strlen("/python3.")) : 0;
        if (minor > best_minor) {
            best_minor = minor;
            best = (int)i;
        }
    }
    int found = 0;
    if (best >= 0) {
        const int w = snprintf(out, n, "%s/%s", g.gl_pathv[best], rel);
        found = w > 0 && (size_t)w < n;
    }
    globfree(&g);
    return found;
}

// The Python installation whose bin folder is `dir` (dir/python3 or dir/python executable):
// its site-packages holding rel. 1 / 0.
static int from_bin_dir(const char *dir, const char *rel, char *out, size_t n, char *python, size_t python_n) {
    static const char *const names[] = {"python3", "python"};
    static const char *const libs[] = {"lib", "lib64"};
    for (int k = 0; k < 2; k++) {
        char exe[FT_PATH_MAX];
        const int w = snprintf(exe, sizeof exe, "%s/%s", dir, names[k]);
        if (w < 0 || (size_t)w >= sizeof exe || access(exe, X_OK) != 0) continue;
        for (int l = 0; l < 2; l++) {
            char pattern[FT_PATH_MAX];
            const int m = snprintf(pattern, sizeof pattern, "%s/../%s/python3.*/{site,dist}-packages", dir, libs[l]);
            if (m < 0 || (size_t)m >= sizeof pattern || !first_in(pattern, rel, out, n)) continue;
            if (python) snprintf(python, python_n, "%s", exe);
            return 1;
        }
        return 0;   // (python3 and python of one folder share their site-packages)
    }
    return 0;
}

// Ask the first python3 of `path_env` where its site-packages are (site.getsitepackages() and
// the user site; a pyenv or conda shim runs the interpreter it stands for), and look for rel
// there. 1 / 0.
static int from_python(const char *path_env, const char *rel, char *out, size_t n, char *python, size_t python_n) {
    char exe[FT_PATH_MAX] = "";
    for (const char *p = path_env; p && *p && !exe[0];) {
        const char *end = strchr(p, ':');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len > 0 && len + 9 < sizeof exe) {
            snprintf(exe, sizeof exe, "%.*s/python3", (int)len, p);
            if (access(exe, X_OK) != 0) exe[0] = 0;
        }
        p = end ? end + 1 : NULL;
    }
    if (!exe[0] || strchr(exe, '\'')) return 0;
    char cmd[FT_PATH_MAX + 200];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import site; print(\"\\n\".join(site.getsitepackages() + "
             "[site.getusersitepackages()]))' 2>/dev/null", exe);
    FILE *f = popen(cmd, "r");
    if (!f) return 0;
    char line[FT_PATH_MAX];
    int found = 0;
    while (!found && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        const int w = snprintf(out, n, "%s/%s", line, rel);
        found = line[0] == '/' && w > 0 && (size_t)w < n && readable(out);
    }
    pclose(f);
    if (found && python) snprintf(python, python_n, "%s", exe);
    return found;
}

int wheel_lib_find(const char *rel, const char *path_env, const char *home, char *out, size_t n, char *python,
                   size_t python_n) {
    for (const char *p = path_env && *path_env ? path_env : NULL; p;) {
        const char *end = strchr(p, ':');
        const size_t len = end ? (size_t)(end - p) : strlen(p);
        char dir[FT_PATH_MAX];
        if (len > 0 && len < sizeof dir) {
            memcpy(dir, p, len);
            dir[len] = 0;
            if (from_bin_dir(dir, rel, out, n, python, python_n)) return 1;
        }
        p = end ? end + 1 : NULL;
    }
    if (home && *home) {
        char pattern[FT_PATH_MAX];
        const int m = snprintf(pattern, sizeof pattern, "%s/.local/lib/python3.*/site-packages", home);
        if (m > 0 && (size_t)m < sizeof pattern && first_in(pattern, rel, out, n)) {
            if (python) snprintf(python, python_n, "pip install --user (%s/.local)", home);
            return 1;
        }
    }
    return from_python(path_env, rel, out, n, python, python_n);
}
