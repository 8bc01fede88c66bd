// wheel_lib.h: find a shared library that a pip wheel installed for the Python on PATH
// (nvidia-nccl-cu12/cu13: nvidia/nccl/lib/libnccl.so.2; nvidia-cudnn-cu12/cu13:
// nvidia/cudnn/lib/libcudnn.so.9), for a machine whose system has no such library but whose
// PyTorch environment does. Nothing is imported or run: the site-packages folders are
// where a Python installation keeps them, found from the file system, and only when that
// fails the first python3 on PATH is asked (a pyenv or conda shim, a Debian layout).
#pragma once
#include <stddef.h>

// Look for `rel` (a path below site-packages, "nvidia/nccl/lib/libnccl.so.2") in, in order:
//   1. for each folder D of `path_env` (PATH's syntax) that holds an executable python3 or
//      python: D/../lib/python3.*/site-packages/rel and D/../lib64/python3.*/site-packages/rel
//      (dist-packages too: a virtual environment's, conda's, the system's), the newest
//      python3.* first;
//   2. `home`/.local/lib/python3.*/site-packages/rel (pip install --user);
//   3. the folders the first python3 of `path_env` names when run with
//      -c 'import site; print(site.getsitepackages() + [site.getusersitepackages()])'
//      (nothing else is imported).
// `path_env` or `home` NULL or empty: that source is skipped. On a find, out (n bytes) holds
// the file's path, and `python` (python_n bytes; may be NULL) the Python it belongs to.
// Returns 1 when found, 0 when not (or when a path would not fit).
int wheel_lib_find(const char *rel, const char *path_env, const char *home, char *out, size_t n, char *python,
                   size_t python_n);
