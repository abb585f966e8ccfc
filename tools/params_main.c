/* nccl-erdma-params: prints the plugin's environment parameters (README's table). */
#include "params.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "--markdown")) {
        fprintf(stderr, "usage: %s [--markdown]\n", argv[0]);
        return 2;
    }
    params_write_markdown(stdout);
    return 0;
}
