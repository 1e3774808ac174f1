/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_version.c — gm_version() is GM_VERSION_STRING, and that string is
 * GM_VERSION_MAJOR.GM_VERSION_MINOR.GM_VERSION_PATCH (the header defines the
 * version once; tests/install/version_test.sh checks the build, the CLI, the
 * SONAME and python/ against it).
 */
#include <stdio.h>
#include <string.h>

#include "gpumem.h"
#include "test.h"

int main(void)
{
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", GM_VERSION_MAJOR, GM_VERSION_MINOR, GM_VERSION_PATCH);
    CHECK(strcmp(GM_VERSION_STRING, want) == 0);
    CHECK(gm_version() != NULL && strcmp(gm_version(), GM_VERSION_STRING) == 0);
    printf("gm_version() = %s\n", gm_version());
    return test_summary();
}
