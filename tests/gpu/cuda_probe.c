// cuda_probe: is there a GPU here? Prints "N device(s)" and exits 0, or prints why not
// (no driver, no device) and exits 3. tests/gpu/test_gpu.sh uses it to run or skip.
#include <stdio.h>

#include "backend_cuda.h"
#include "common.h"

int main(void) {
    int n = 0;
    if (backend_cuda_device_count(&n) != 0) {
        printf("%s\n", ft_error_message());
        return 3;
    }
    printf("%d device(s)\n", n);
    return 0;
}
