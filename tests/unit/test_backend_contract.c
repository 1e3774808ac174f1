/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_backend_contract.c — one test for every backend: it checks the
 * promises of src/backend/backend.h through the ops table alone, so the sim (in CI)
 * and the CUDA driver (on the GPU machine) are held to the same contract.
 *
 * GPUMEM_TEST_BACKEND picks the backend: "sim" (default), "cuda" or "auto".
 * With "cuda" and no usable GPU the test fails loudly rather than skipping:
 * only the device script sets it, and there a missing GPU is a failure.
 * GPUMEM_DEVICE picks the device ordinal (default 0).
 *
 * What it checks: sane device info; reservations aligned as asked; data
 * written through the backend's memset/memcpy reads back; a handle unmapped
 * and mapped again elsewhere still holds its bytes; two handles side by side
 * form one range with one set_access ("stitching") and a copy across the
 * seam lands in both; unmapping part of one map call is refused and leaves
 * the mapping intact; events record/query/sync; fd export/import sees the
 * same memory (where supported); clean release;
 * and a probe of a device that does not exist answers GM_NO_DEVICE.
 */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "base/internal.h"
#include "../test.h"

typedef struct fixture {
    const gm__backend_ops_t *ops;
    void *ctx;
    size_t g; /* granularity */
} fixture_t;

static uint8_t pattern_byte(size_t i, unsigned seed)
{
    return (uint8_t)(i * 31u + seed * 7u + (i >> 9) + 1u);
}

static void fill_pattern(uint8_t *buf, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++) buf[i] = pattern_byte(i, seed);
}

/* CHECK that got == want, naming the first differing offset. */
static void check_bytes(const char *what, const uint8_t *got, const uint8_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (got[i] != want[i]) {
            fprintf(stderr, "  %s: byte %zu is %#x, want %#x\n", what, i, got[i], want[i]);
            CHECK(!"device bytes match the expected image");
            return;
        }
    }
    CHECK(1);
}

/* Copy n device bytes at va into host buf and wait for them. */
static int read_back(fixture_t *f, uint8_t *buf, uintptr_t va, size_t n)
{
    memset(buf, 0xEE, n);
    int rc = f->ops->memcpy(f->ctx, (uintptr_t)buf, va, n, NULL);
    if (rc == GM_OK) rc = f->ops->stream_sync(f->ctx, NULL);
    return rc;
}

static int is_pow2(size_t x)
{
    return x && (x & (x - 1)) == 0;
}

static gm_backend_kind_t kind_from_env(const char **name)
{
    const char *s = getenv("GPUMEM_TEST_BACKEND");
    if (!s || !*s) s = "sim";
    *name = s;
    if (strcmp(s, "sim") == 0) return GM_BACKEND_SIM;
    if (strcmp(s, "cuda") == 0) return GM_BACKEND_CUDA;
    if (strcmp(s, "auto") == 0) return GM_BACKEND_AUTO;
    return (gm_backend_kind_t)-1;
}

/* ---- the VMM part of the contract ----------------------------------------- */

/* Layout inside one reservation, in granules from its base:
 *   0   first map of h1          4   h1 remapped
 *   8-9 h1|h2 stitched            12  h2 alone again
 *   16-17 h3 (one 2-granule map)  20  imported copy of h1 */
static void test_vmm(fixture_t *f)
{
    const gm__backend_ops_t *o = f->ops;
    const size_t g = f->g;
    size_t reserve = (size_t)64 << 20;
    if (reserve < 24 * g) reserve = 24 * g;

    uint8_t *img = malloc(2 * g), *buf = malloc(2 * g), *pat = malloc(g);
    if (!img || !buf || !pat) {
        CHECK(!"host buffers");
        free(img), free(buf), free(pat);
        return;
    }

    /* Reservations come back aligned as asked. */
    uintptr_t va = 0, va2 = 0;
    CHECK_OK(o->va_reserve(f->ctx, reserve, g, &va));
    CHECK(va != 0 && va % g == 0);
    CHECK_OK(o->va_reserve(f->ctx, 4 * g, 8 * g, &va2));
    CHECK(va2 != 0 && va2 % (8 * g) == 0);
    if (va2) CHECK_OK(o->va_free(f->ctx, va2, 4 * g));
    if (!va) goto out;

    /* Write through memset and memcpy, read back. */
    gm__phys_t h1 = 0, h2 = 0, h3 = 0;
    CHECK_OK(o->phys_create(f->ctx, g, &h1));
    CHECK_OK(o->map(f->ctx, va, g, h1));
    CHECK_OK(o->set_access(f->ctx, va, g, 0));
    const size_t pat_off = 4096, pat_len = g < 128 * 1024 ? g / 2 : 64 * 1024;
    fill_pattern(pat, pat_len, 1);
    CHECK_OK(o->memset(f->ctx, va, 0xA5, g, NULL));
    CHECK_OK(o->memcpy(f->ctx, va + pat_off, (uintptr_t)pat, pat_len, NULL));
    memset(img, 0xA5, g);
    memcpy(img + pat_off, pat, pat_len);
    CHECK_OK(read_back(f, buf, va, g));
    check_bytes("memset+memcpy", buf, img, g);

    /* The data lives in the handle, not the address: remap elsewhere. */
    CHECK_OK(o->unmap(f->ctx, va, g));
    CHECK_OK(o->map(f->ctx, va + 4 * g, g, h1));
    CHECK_OK(o->set_access(f->ctx, va + 4 * g, g, 0));
    CHECK_OK(read_back(f, buf, va + 4 * g, g));
    check_bytes("after remap", buf, img, g);
    CHECK_OK(o->unmap(f->ctx, va + 4 * g, g));

    /* Stitching: h1|h2 as one range, one set_access, a copy across the seam. */
    const uintptr_t s = va + 8 * g;
    const size_t half = pat_len / 2;
    CHECK_OK(o->phys_create(f->ctx, g, &h2));
    CHECK_OK(o->map(f->ctx, s, g, h1));
    CHECK_OK(o->map(f->ctx, s + g, g, h2));
    CHECK_OK(o->set_access(f->ctx, s, 2 * g, 0));
    CHECK_OK(o->memset(f->ctx, s + g, 0x3C, g, NULL));
    fill_pattern(pat, pat_len, 2);
    CHECK_OK(o->memcpy(f->ctx, s + g - half, (uintptr_t)pat, pat_len, NULL));
    memset(img + g, 0x3C, g);
    memcpy(img + g - half, pat, pat_len);
    CHECK_OK(read_back(f, buf, s, 2 * g));
    check_bytes("stitched range", buf, img, 2 * g);

    /* Each side of the seam went to its own handle: h2 alone shows the tail. */
    CHECK_OK(o->unmap(f->ctx, s + g, g));
    CHECK_OK(o->map(f->ctx, va + 12 * g, g, h2));
    CHECK_OK(o->set_access(f->ctx, va + 12 * g, g, 0));
    CHECK_OK(read_back(f, buf, va + 12 * g, g));
    check_bytes("second handle alone", buf, img + g, g);
    CHECK_OK(o->unmap(f->ctx, va + 12 * g, g));
    CHECK_OK(o->unmap(f->ctx, s, g));

    /* Unmapping part of one map call is refused, with a message, and the
     * mapping stays whole.  Events ride on the work that proves it. */
    const uintptr_t p = va + 16 * g;
    CHECK_OK(o->phys_create(f->ctx, 2 * g, &h3));
    CHECK_OK(o->map(f->ctx, p, 2 * g, h3));
    CHECK_OK(o->set_access(f->ctx, p, 2 * g, 0));
    gm__clear_error();
    int partial = o->unmap(f->ctx, p, g);
    CHECK(partial != GM_OK);
    CHECK(gm_last_error()[0] != '\0');
    if (partial == GM_OK) {
        fprintf(stderr, "  partial unmap was accepted; unmapping the rest\n");
        CHECK_OK(o->unmap(f->ctx, p + g, g));
    } else {
        printf("partial unmap refused: %s: %s\n", gm_errname(partial), gm_last_error());
        gm__event_t ev = 0;
        CHECK_OK(o->event_create(f->ctx, &ev));
        CHECK_OK(o->memset(f->ctx, p, 0x11, 2 * g, NULL));
        CHECK_OK(o->event_record(f->ctx, ev, NULL));
        int q = o->event_query(f->ctx, ev);
        CHECK(q == GM_OK || q == GM_NOT_READY);
        CHECK_OK(o->event_sync(f->ctx, ev));
        CHECK_OK(o->event_query(f->ctx, ev));
        CHECK_OK(o->stream_sync(f->ctx, NULL));
        CHECK_OK(o->event_destroy(f->ctx, ev));
        memset(img, 0x11, 2 * g);
        CHECK_OK(read_back(f, buf, p, 2 * g));
        check_bytes("mapping intact after refused unmap", buf, img, 2 * g);
        CHECK_OK(o->unmap(f->ctx, p, 2 * g));
    }

    /* Sharing: an exported fd imports as a handle to the same memory. */
    int fd = -1;
    int rc = o->export_fd(f->ctx, h1, &fd);
    if (rc == GM_NOT_SUPPORTED) {
        printf("note: export_fd not supported here: %s\n", gm_last_error());
    } else {
        CHECK_OK(rc);
        CHECK(fd >= 0);
        gm__phys_t h1b = 0;
        if (rc == GM_OK && fd >= 0) {
            CHECK_OK(o->import_fd(f->ctx, fd, g, &h1b));
            close(fd);
            CHECK_OK(o->map(f->ctx, va + 20 * g, g, h1b));
            CHECK_OK(o->set_access(f->ctx, va + 20 * g, g, 0));
            /* h1 holds the first granule of the stitched image. */
            fill_pattern(pat, pat_len, 1);
            memset(img, 0xA5, g);
            memcpy(img + pat_off, pat, pat_len);
            fill_pattern(pat, pat_len, 2);
            memcpy(img + g - half, pat, half);
            CHECK_OK(read_back(f, buf, va + 20 * g, g));
            check_bytes("imported handle", buf, img, g);
            CHECK_OK(o->unmap(f->ctx, va + 20 * g, g));
            CHECK_OK(o->phys_release(f->ctx, h1b));
        }
    }

    if (h1) CHECK_OK(o->phys_release(f->ctx, h1));
    if (h2) CHECK_OK(o->phys_release(f->ctx, h2));
    if (h3) CHECK_OK(o->phys_release(f->ctx, h3));
    CHECK_OK(o->va_free(f->ctx, va, reserve));
out:
    free(img);
    free(buf);
    free(pat);
}

/* ---- a device that does not exist --------------------------------------------- */

static void test_missing_device(void)
{
    char why[256] = "";
    CHECK_RC(gm__backend_cuda.probe(9999, why, sizeof why), GM_NO_DEVICE);
    CHECK(why[0] != '\0');
    printf("cuda probe of device 9999: %s\n", why);

    const gm__backend_ops_t *ops = NULL;
    gm_backend_kind_t chosen = GM_BACKEND_AUTO;
    why[0] = '\0';
    CHECK_RC(gm__backend_select(GM_BACKEND_CUDA, 9999, &ops, &chosen, why, sizeof why),
             GM_NO_DEVICE);
    CHECK(why[0] != '\0');
}

int main(void)
{
    const char *want = NULL;
    gm_backend_kind_t kind = kind_from_env(&want);
    if ((int)kind < 0) {
        fprintf(stderr, "GPUMEM_TEST_BACKEND=%s: want sim, cuda or auto\n", want);
        REQUIRE(!"a known backend name");
    }
    const char *dev_env = getenv("GPUMEM_DEVICE");
    int device = dev_env && *dev_env ? atoi(dev_env) : 0;

    fixture_t f = {0};
    gm_backend_kind_t chosen = GM_BACKEND_AUTO;
    char why[256] = "";
    int rc = gm__backend_select(kind, device, &f.ops, &chosen, why, sizeof why);
    if (rc != GM_OK)
        fprintf(stderr, "backend %s, device %d is not usable: %s (%s)\n", want, device, why,
                gm_last_error());
    REQUIRE(rc == GM_OK && f.ops != NULL);
    printf("backend %s (asked for %s): %s\n", f.ops->name, want, why);

    gm__backend_config_t cfg = {.device = device, .sim_capacity = (size_t)4 << 30};
    CHECK_OK(f.ops->open(&cfg, &f.ctx));
    REQUIRE(f.ctx != NULL);

    gm__backend_info_t info;
    memset(&info, 0, sizeof info);
    CHECK_OK(f.ops->info(f.ctx, &info));
    printf("device \"%s\": driver %d, total %zu, free %zu, granularity %zu, vmm %d\n", info.name,
           info.driver_version, info.total_memory, info.free_memory, info.granularity,
           info.vmm_supported);
    CHECK(info.name[0] != '\0');
    CHECK(info.total_memory > 0);
    CHECK(info.free_memory <= info.total_memory);
    CHECK(is_pow2(info.granularity) && info.granularity >= ((size_t)64 << 10));
    CHECK(info.vmm_supported == 0 || info.vmm_supported == 1);
    f.g = info.granularity;

    if (info.vmm_supported && is_pow2(f.g))
        test_vmm(&f);
    else
        printf("note: no virtual memory management on this device: VMM checks skipped\n");

    f.ops->close(f.ctx);
    test_missing_device();
    return test_summary();
}
