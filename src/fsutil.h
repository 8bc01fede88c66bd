// fsutil.h: directories and durable, atomic file writes for checkpoints and exports. Every
// function returns 0, or -1 with ft_error naming the path (fs_remove_tree: -1, no message).
#pragma once

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
// Move the finished temporary directory `tmp` to `dst` (fsync'ed first), replacing an
// existing `dst` (moved aside, then removed) and fsync'ing the parent.
int fs_publish_dir(const char *tmp, const char *dst);
