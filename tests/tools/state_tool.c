/*
 * state_tool: reseals a trainer_state.json after a test edited it, so the
 * test reaches the checks behind the checksum (a model setting the family
 * does not know, one an older file lacks).
 *
 *   state_tool seal FILE   rewrites the 16 hex digits after {"checksum":"
 *                          with XXH3-64 of the file read with them as zeros
 *                          (io/checkpoint.h's rule)
 *
 * Exit status: 0, or 2 with a message on stderr.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

int main(int argc, char **argv)
{
    if (argc != 3 || strcmp(argv[1], "seal") != 0) {
        fprintf(stderr, "usage: state_tool seal FILE\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "state_tool: cannot open %s\n", argv[2]);
        return 2;
    }
    static char buf[1 << 24];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    const char *prefix = "{\"checksum\":\"";
    const size_t k = strlen(prefix);
    if (n < k + 16 || memcmp(buf, prefix, k) != 0) {
        fprintf(stderr, "state_tool: %s does not start with %s\n", argv[2], prefix);
        return 2;
    }
    memset(buf + k, '0', 16);
    char hex[17];
    snprintf(hex, sizeof hex, "%016" PRIx64, (uint64_t)XXH3_64bits(buf, n));
    memcpy(buf + k, hex, 16);
    f = fopen(argv[2], "wb");
    if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "state_tool: cannot write %s\n", argv[2]);
        return 2;
    }
    return 0;
}
