/* kite info: what this build contains and what it finds on this machine. */
#include <stdio.h>
#include <string.h>

#include "backend/backend.h"
#include "commands.h"
#include "kite.h"

int cmd_info(int argc, char **argv) {
    if (argc > 1) {
        fprintf(stderr, "usage: kite info\n");
        return 2;
    }
    printf("kite %s\n", KITE_VERSION_STRING);
    printf("commit: %s\n", KITE_GIT_COMMIT);
    printf("backends built: cpu%s\n", kite_built_with_cuda() ? ", cuda (sm_90a)" : "");
    char reason[256] = "";
    if (cuda_backend_available(reason, sizeof reason))
        printf("cuda: available: %s\n", reason);
    else
        printf("cuda: not available: %s\n", reason);
    return 0;
}
