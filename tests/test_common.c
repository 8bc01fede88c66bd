// test_common.c: the error record and checked path formatting of src/common.c.
//   ft_path: a path that fits is written whole; one byte too long is -1 with one
//   "path too long" line naming the path's start, and the message of an earlier error wins.
// Runtime: well under a second.
#include "common.h"
#include "test.h"

int main(void) {
    char buf[16];
    ft_error_clear();
    EXPECT(ft_path(buf, sizeof buf, "%s/%s", "dir", "name") == 0 && !strcmp(buf, "dir/name"),
           "ft_path of a short path: got '%s'", buf);
    EXPECT(ft_path(buf, sizeof buf, "%s/%s", "0123456", "0123456") == 0 && strlen(buf) == 15,
           "15 characters fit a 16-byte buffer: got '%s'", buf);
    EXPECT(!ft_error_message()[0], "no error recorded for paths that fit: %s", ft_error_message());

    EXPECT(ft_path(buf, sizeof buf, "%s/%s", "0123456", "01234567") == -1, "16 characters in 16 bytes: -1");
    const char *m = ft_error_message();
    EXPECT(strstr(m, "path too long") && strstr(m, "16 bytes") && strstr(m, "0123456/") && !strchr(m, '\n'),
           "one line naming the problem, the length and the path's start: '%s'", m);

    ft_error_clear();
    ft_error("first");
    EXPECT(ft_path(buf, sizeof buf, "%s", "a path much longer than sixteen bytes") == -1 &&
               !strcmp(ft_error_message(), "first"),
           "the first error wins: '%s'", ft_error_message());
    ft_error_clear();
    TEST_SUMMARY("test_common");
}
