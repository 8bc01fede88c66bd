// test_wheel_lib.c: src/wheel_lib.c finds a wheel's library from the file system alone, in
// fake Python installations under a temporary folder (no Python is run): a virtual
// environment's python3 on PATH, the newest python3.* of several, PATH's order, a folder
// without a python3 skipped, pip's --user site, and nothing found when nothing matches.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"
#include "wheel_lib.h"

static char root[256];

// create `rel` below root (parents too), as an executable file when exec
static void make_file(const char *rel, int exec) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *s = path + strlen(root) + 1; (s = strchr(s, '/')); s++) {
        *s = 0;
        mkdir(path, 0755);
        *s = '/';
    }
    FILE *f = fopen(path, "w");
    EXPECT(f != NULL, "%s", "f != NULL");
    if (f) fclose(f);
    if (exec) chmod(path, 0755);
}

static const char *under(const char *rel) {
    static char buf[4][1024];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", root, rel);
    return buf[k];
}

static const char *REL = "nvidia/nccl/lib/libnccl.so.2";

int main(void) {
    snprintf(root, sizeof root, "/tmp/test_wheel_lib.XXXXXX");
    EXPECT(mkdtemp(root) != NULL, "%s", "mkdtemp(root) != NULL");
    char out[1024], py[1024], path_env[4096];

    // nothing installed: not found
    make_file("sys/bin/python3", 1);
    snprintf(path_env, sizeof path_env, "%s", under("sys/bin"));
    EXPECT(wheel_lib_find(REL, path_env, under("home"), out, sizeof out, py, sizeof py) == 0, "%s", "wheel_lib_find(REL, path_env, under(\"home\"), out, sizeof out, py, sizeof py) == 0");

    // a venv on PATH after a folder without python3, with the wheel in its python3.11
    make_file("venv/bin/python3", 1);
    make_file("venv/lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2", 0);
    make_file("nopy/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2", 0);   // no bin/python3: skipped
    make_file("nopy/bin/other", 1);
    snprintf(path_env, sizeof path_env, "%s::%s:%s", under("nopy/bin"), under("venv/bin"), under("sys/bin"));
    EXPECT(wheel_lib_find(REL, path_env, NULL, out, sizeof out, py, sizeof py) == 1, "%s", "wheel_lib_find(REL, path_env, NULL, out, sizeof out, py, sizeof py) == 1");
    EXPECT(strcmp(out, under("venv/bin/../lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2")) == 0, "%s", "strcmp(out, under(\"venv/bin/../lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2\")) == 0");
    EXPECT(strcmp(py, under("venv/bin/python3")) == 0, "%s", "strcmp(py, under(\"venv/bin/python3\")) == 0");

    // the newest python3.* of one installation wins (3.12 over 3.9, not text order)
    make_file("venv/lib/python3.9/site-packages/nvidia/nccl/lib/libnccl.so.2", 0);
    make_file("venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2", 0);
    EXPECT(wheel_lib_find(REL, path_env, NULL, out, sizeof out, NULL, 0) == 1, "%s", "wheel_lib_find(REL, path_env, NULL, out, sizeof out, NULL, 0) == 1");
    EXPECT(strstr(out, "/python3.12/site-packages/") != NULL, "%s", "strstr(out, \"/python3.12/site-packages/\") != NULL");

    // PATH order: the system python3 first now, its lib64 site-packages holds the wheel
    make_file("sys/lib64/python3.10/site-packages/nvidia/nccl/lib/libnccl.so.2", 0);
    snprintf(path_env, sizeof path_env, "%s:%s", under("sys/bin"), under("venv/bin"));
    EXPECT(wheel_lib_find(REL, path_env, NULL, out, sizeof out, py, sizeof py) == 1, "%s", "wheel_lib_find(REL, path_env, NULL, out, sizeof out, py, sizeof py) == 1");
    EXPECT(strcmp(out, under("sys/bin/../lib64/python3.10/site-packages/nvidia/nccl/lib/libnccl.so.2")) == 0, "%s", "strcmp(out, under(\"sys/bin/../lib64/python3.10/site-packages/nvidia/nccl/lib/libnccl.so.2\")) == 0");

    // another library (cuDNN's) is not there; the user site has it
    const char *cudnn = "nvidia/cudnn/lib/libcudnn.so.9";
    EXPECT(wheel_lib_find(cudnn, path_env, under("home"), out, sizeof out, py, sizeof py) == 0, "%s", "wheel_lib_find(cudnn, path_env, under(\"home\"), out, sizeof out, py, sizeof py) == 0");
    make_file("home/.local/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9", 0);
    EXPECT(wheel_lib_find(cudnn, path_env, under("home"), out, sizeof out, py, sizeof py) == 1, "%s", "wheel_lib_find(cudnn, path_env, under(\"home\"), out, sizeof out, py, sizeof py) == 1");
    EXPECT(strcmp(out, under("home/.local/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9")) == 0, "%s", "strcmp(out, under(\"home/.local/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9\")) == 0");
    EXPECT(strstr(py, "--user") != NULL, "%s", "strstr(py, \"--user\") != NULL");
    // a shim (pyenv's): no site-packages beside it; run, it names them
    make_file("shims/python3", 1);
    make_file("pyenv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9", 0);
    {
        char script[1024];
        snprintf(script, sizeof script, "%s/shims/python3", root);
        FILE *f = fopen(script, "w");
        EXPECT(f != NULL, "shim");
        if (f) {
            fprintf(f, "#!/bin/sh\necho /nonexistent/site-packages\necho %s/pyenv/lib/python3.11/site-packages\n", root);
            fclose(f);
        }
    }
    snprintf(path_env, sizeof path_env, "%s:%s", under("shims"), under("sys/bin"));
    EXPECT(wheel_lib_find(cudnn, path_env, NULL, out, sizeof out, py, sizeof py) == 1, "shim: found");
    EXPECT(strcmp(out, under("pyenv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9")) == 0, "shim: %s", out);
    EXPECT(strcmp(py, under("shims/python3")) == 0, "shim python: %s", py);
    // a Debian system python: dist-packages
    make_file("deb/bin/python3", 1);
    make_file("deb/lib/python3.12/dist-packages/nvidia/nccl/lib/libnccl.so.2", 0);
    snprintf(path_env, sizeof path_env, "%s", under("deb/bin"));
    EXPECT(wheel_lib_find(REL, path_env, NULL, out, sizeof out, py, sizeof py) == 1, "dist-packages");
    EXPECT(strstr(out, "/python3.12/dist-packages/nvidia/nccl/") != NULL, "dist-packages: %s", out);

    // no PATH and no home: nothing
    EXPECT(wheel_lib_find(REL, NULL, NULL, out, sizeof out, py, sizeof py) == 0, "%s", "wheel_lib_find(REL, NULL, NULL, out, sizeof out, py, sizeof py) == 0");
    // a result that does not fit `out`: not found rather than truncated
    char tiny[16];
    EXPECT(wheel_lib_find(REL, path_env, NULL, tiny, sizeof tiny, NULL, 0) == 0, "%s", "wheel_lib_find(REL, path_env, NULL, tiny, sizeof tiny, NULL, 0) == 0");

    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    EXPECT(system(cmd) == 0, "%s", "system(cmd) == 0");
    TEST_SUMMARY("test_wheel_lib");
}
