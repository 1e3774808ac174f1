/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_peers.c — peer access between the devices of one machine, on the
 * sim (every pool opens its own device; all share the address space):
 *   (a) without a grant, a copy or fill issued through another device's pool
 *       that touches a pool's memory is an "illegal address" (GM_BACKEND),
 *       and changes nothing; the owner's own copies work;
 *   (b) with peers = bit 1, device 1 reads and writes every byte of the
 *       pool, pages mapped later included, while device 2 is still refused
 *       and the grant is one-way;
 *   (c) gm_pool_device_info reports the devices granted (GM_PEERS_ALL: every
 *       other device; the pool's own bit ignored) and the device count;
 *   (d) a peer that does not exist (GM_NO_DEVICE), one outside the device's
 *       peer group (GPUMEM_SIM_PEER_GROUP: GM_NOT_SUPPORTED naming the
 *       pair), GM_PEERS_ALL under groups;
 *   (e) a device ordinal past the machine (GM_NO_DEVICE);
 *   (f) gm_config_from_env: GPUMEM_PEERS ("all", "none", lists, malformed
 *       values), GPUMEM_NCCL and GPUMEM_COMPRESSIBLE;
 *   (g) GM_POOL_COMPRESSIBLE (refused where the device cannot compress:
 *       GPUMEM_SIM_COMPRESSION=0) and GM_POOL_NCCL (fd handles, RDMA);
 *   (h) destroying one device's pool leaves another device's pool working,
 *       and a pool granting access to a destroyed pool's device is fine.
 * Sim only: 4 devices (GPUMEM_SIM_DEVICES=4).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gpumem.h"
#include "../test.h"
#include "multigpu_util.h"

#define MiB ((size_t)1 << 20)
#define CAP ((size_t)1 << 30)

/* gm_pool_create of a sim pool on `device` granting `peers`, with `flags`. */
static int create(int device, uint64_t peers, unsigned flags, gm_pool_t **pool)
{
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    cfg.backend = GM_BACKEND_SIM;
    cfg.sim_capacity = CAP;
    cfg.device = device;
    cfg.peers = peers;
    cfg.flags = flags;
    return gm_pool_create(&cfg, pool);
}

static gm_pool_t *mk(int device, uint64_t peers, unsigned flags)
{
    gm_pool_t *pool = NULL;
    if (create(device, peers, flags, &pool) != GM_OK) {
        fprintf(stderr, "pool on device %d: %s\n", device, gm_last_error());
        return NULL;
    }
    return pool;
}

/* The last error mentions every one of the (NULL-terminated) words. */
static int says(const char *w1, const char *w2)
{
    const char *m = gm_last_error();
    int ok = m && strstr(m, w1) && (!w2 || strstr(m, w2));
    if (!ok) fprintf(stderr, "  message \"%s\" lacks \"%s\"%s%s\n", m ? m : "(null)", w1,
                     w2 ? " or " : "", w2 ? w2 : "");
    return ok;
}

static gm_device_info_t info_of(gm_pool_t *pool)
{
    gm_device_info_t di = GM_DEVICE_INFO_INIT;
    CHECK_OK(gm_pool_device_info(pool, &di));
    return di;
}

/* The device info of a new pool on `device` granting `peers`, with `flags`,
 * destroyed once read: 1; 0, with a failed CHECK, when it cannot be made. */
static int new_pool_info(int device, uint64_t peers, unsigned flags, gm_device_info_t *di)
{
    gm_pool_t *p = mk(device, peers, flags);
    CHECK(p != NULL);
    if (!p) return 0;
    *di = info_of(p);
    gm_pool_destroy(p);
    return 1;
}

/* gm_config_from_env(cfg) with `var` set to `value` (left set). */
static int config_with(const char *var, const char *value, gm_pool_config_t *cfg)
{
    setenv(var, value, 1);
    return gm_config_from_env(cfg);
}

static void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
    lcg_bytes(p, n, seed * 2654435761u + 1);
}

static int same_pattern(const unsigned char *p, size_t n, unsigned seed)
{
    unsigned char *want = malloc(n);
    if (!want) return 0;
    fill_pattern(want, n, seed);
    int ok = memcmp(p, want, n) == 0;
    free(want);
    return ok;
}

/* Read n bytes at src through `via` into r (cleared first): do they hold
 * pattern `seed`?  The copy is a CHECK of its own. */
static int read_holds(gm_pool_t *via, unsigned char *r, const void *src, size_t n, unsigned seed)
{
    memset(r, 0, n);
    CHECK_OK(gm_memcpy(via, r, src, n, NULL));
    return same_pattern(r, n, seed);
}

/* (a) No grant: refused both ways, nothing changed; own copies work. */
static void test_refused(void)
{
    gm_pool_t *p0 = mk(0, 0, 0), *p1 = mk(1, 0, 0);
    if (!p0 || !p1) { CHECK(0); gm_pool_destroy(p0); gm_pool_destroy(p1); return; }
    const size_t n = 64 * 1024;
    void *a = NULL, *a2 = NULL, *b = NULL;
    CHECK_OK(gm_alloc(p0, n, NULL, &a));
    CHECK_OK(gm_alloc(p0, n, NULL, &a2));
    CHECK_OK(gm_alloc(p1, n, NULL, &b));
    if (!a || !a2 || !b) { CHECK(0); goto out; }
    unsigned char *h = malloc(n), *r = malloc(n);
    if (!h || !r) { CHECK(0); free(h); free(r); goto out; }
    fill_pattern(h, n, 1);
    CHECK_OK(gm_memcpy(p0, a, h, n, NULL));
    fill_pattern(h, n, 2);
    CHECK_OK(gm_memcpy(p1, b, h, n, NULL));

    /* Device 1 reads device 0's memory: refused. */
    CHECK_RC(gm_memcpy(p1, b, a, n, NULL), GM_BACKEND);
    CHECK(says("illegal address", "device 1"));
    /* Device 1 writes device 0's memory (from host memory and from its own). */
    CHECK_RC(gm_memcpy(p1, a, h, n, NULL), GM_BACKEND);
    CHECK(says("illegal address", NULL));
    CHECK_RC(gm_memcpy(p1, a, b, n, NULL), GM_BACKEND);
    CHECK(says("illegal address", NULL));
    /* A fill through device 1. */
    CHECK_RC(gm_memset(p1, a, 0xee, n, NULL), GM_BACKEND);
    CHECK(says("illegal address", NULL));
    /* A range that starts inside: refused too. */
    CHECK_RC(gm_memset(p1, (char *)a + n / 2, 0, 16, NULL), GM_BACKEND);
    /* And the other way: pool1 granted nothing either. */
    CHECK_RC(gm_memcpy(p0, a2, b, n, NULL), GM_BACKEND);
    CHECK(says("illegal address", "device 0"));

    /* Nothing was written by the refused work. */
    CHECK_OK(gm_memcpy(p0, r, a, n, NULL));
    CHECK(same_pattern(r, n, 1));
    CHECK_OK(gm_memcpy(p1, r, b, n, NULL));
    CHECK(same_pattern(r, n, 2));

    /* Device 0's own copy works, and the bytes are right. */
    CHECK_OK(gm_memcpy(p0, a2, a, n, NULL));
    CHECK(read_holds(p0, r, a2, n, 1));
    CHECK(info_of(p0).peers == 0 && info_of(p1).peers == 0);
    free(h);
    free(r);
out:
    CHECK_OK(gm_free(p0, a, NULL));
    CHECK_OK(gm_free(p0, a2, NULL));
    CHECK_OK(gm_free(p1, b, NULL));
    check_and_destroy_pools(p1, p0);
}

/* (b) peers = bit 1: device 1 in both directions, later pages included;
 * device 2 refused; one-way. */
static void test_granted(void)
{
    gm_pool_t *p0 = mk(0, (uint64_t)1 << 1, 0), *p1 = mk(1, 0, 0), *p2 = mk(2, 0, 0);
    if (!p0 || !p1 || !p2) {
        CHECK(0);
        gm_pool_destroy(p0); gm_pool_destroy(p1); gm_pool_destroy(p2);
        return;
    }
    CHECK(info_of(p0).peers == 0x2);
    const size_t n = 3 * MiB + 4096; /* spans pages */
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(gm_alloc(p0, n, NULL, &a));
    CHECK_OK(gm_alloc(p1, n, NULL, &b));
    CHECK_OK(gm_alloc(p2, n, NULL, &c));
    unsigned char *h = malloc(n), *r = malloc(n);
    if (!a || !b || !c || !h || !r) { CHECK(0); goto out; }

    /* Written through pool0, read by device 1 into its memory, then back to
     * the host through pool1. */
    fill_pattern(h, n, 3);
    CHECK_OK(gm_memcpy(p0, a, h, n, NULL));
    CHECK_OK(gm_memcpy(p1, b, a, n, NULL));
    CHECK(read_holds(p1, r, b, n, 3));
    /* Device 1 reads straight into host memory too. */
    CHECK(read_holds(p1, r, a, n, 3));

    /* Device 1 writes pool0's memory (from its own and from the host); read
     * back through pool0. */
    fill_pattern(h, n, 4);
    CHECK_OK(gm_memcpy(p1, b, h, n, NULL));
    CHECK_OK(gm_memcpy(p1, a, b, n, NULL));
    CHECK(read_holds(p0, r, a, n, 4));
    CHECK_OK(gm_memset(p1, (char *)a + 100, 0x3c, 1000, NULL));
    CHECK_OK(gm_memcpy(p0, r, a, 2000, NULL));
    int ok = 1;
    for (size_t i = 100; i < 1100; i++) ok &= r[i] == 0x3c;
    CHECK(ok && r[99] == h[99] && r[1100] == h[1100]);

    /* Device 2 is no peer; and pool1 granted device 0 nothing. */
    CHECK_RC(gm_memcpy(p2, c, a, n, NULL), GM_BACKEND);
    CHECK(says("illegal address", "device 2"));
    CHECK_RC(gm_memset(p2, a, 0, 256, NULL), GM_BACKEND);
    CHECK(says("illegal address", NULL));
    CHECK_RC(gm_memcpy(p0, a, b, n, NULL), GM_BACKEND);
    CHECK(says("illegal address", NULL));

    /* Growth: pages mapped after creation get the grant too. */
    gm_stats_t before = pool_stats_of(p0);
    enum { NG = 12 };
    void *g[NG] = {0};
    for (int i = 0; i < NG; i++) CHECK_OK(gm_alloc(p0, 6 * MiB + (size_t)i * 4096, NULL, &g[i]));
    gm_stats_t after = pool_stats_of(p0);
    CHECK(after.reserved >= before.reserved + 64 * MiB); /* new pages were mapped */
    for (int i = 0; i < NG; i += 3) {
        if (!g[i]) { CHECK(0); continue; }
        size_t m = 6 * MiB + (size_t)i * 4096;
        unsigned char *hh = malloc(m), *rr = malloc(m);
        if (!hh || !rr) { CHECK(0); free(hh); free(rr); continue; }
        fill_pattern(hh, m, 10 + (unsigned)i);
        CHECK_OK(gm_memcpy(p1, g[i], hh, m, NULL)); /* device 1 writes the new pages */
        memset(rr, 0, m);
        CHECK_OK(gm_memcpy(p0, rr, g[i], m, NULL));
        CHECK(same_pattern(rr, m, 10 + (unsigned)i));
        memset(rr, 0, m);
        CHECK_OK(gm_memcpy(p1, rr, g[i], m, NULL)); /* and reads them */
        CHECK(same_pattern(rr, m, 10 + (unsigned)i));
        CHECK_RC(gm_memcpy(p2, rr, g[i], 256, NULL), GM_BACKEND); /* device 2 still not */
        free(hh);
        free(rr);
    }
    /* Trim and remap: pages given back and mapped again keep the grant. */
    for (int i = 0; i < NG; i++) CHECK_OK(gm_free(p0, g[i], NULL));
    size_t released = 0;
    CHECK_OK(gm_trim(p0, 0, &released));
    CHECK(released > 0);
    void *again = NULL;
    CHECK_OK(gm_alloc(p0, 40 * MiB, NULL, &again));
    if (again) {
        CHECK_OK(gm_memset(p1, again, 0x71, 40 * MiB, NULL));
        unsigned char tail[64];
        CHECK_OK(gm_memcpy(p0, tail, (char *)again + 40 * MiB - 64, 64, NULL));
        ok = 1;
        for (int i = 0; i < 64; i++) ok &= tail[i] == 0x71;
        CHECK(ok);
        CHECK_OK(gm_free(p0, again, NULL));
    }
out:
    free(h);
    free(r);
    CHECK_OK(gm_free(p0, a, NULL));
    CHECK_OK(gm_free(p1, b, NULL));
    CHECK_OK(gm_free(p2, c, NULL));
    CHECK_OK(gm_pool_check(p0));
    gm_pool_destroy(p2);
    gm_pool_destroy(p1);
    gm_pool_destroy(p0);
}

/* (c) What gm_pool_device_info reports. */
static void test_info(void)
{
    gm_device_info_t di;
    if (new_pool_info(0, GM_PEERS_ALL, 0, &di)) {
        CHECK(di.version == GM_DEVICE_INFO_VERSION);
        CHECK(di.device == 0 && di.device_count == 4);
        CHECK(di.peers == 0xe);
    }
    if (new_pool_info(2, GM_PEERS_ALL, 0, &di)) {
        CHECK(di.device == 2 && di.device_count == 4 && di.peers == 0xb);
    }
    /* The pool's own bit is ignored. */
    if (new_pool_info(0, 0x3, 0, &di)) CHECK(di.peers == 0x2);
    if (new_pool_info(3, 0x9, 0, &di)) {
        CHECK(di.device == 3 && di.peers == 0x1);
    }
    if (new_pool_info(1, 0, 0, &di)) {
        CHECK(di.peers == 0 && di.device_count == 4 && di.compressible == 0);
        /* No GM_POOL_NCCL: the sim still makes fd-shareable pages, not RDMA ones. */
        CHECK(di.rdma_capable == 0);
    }
    /* An older, version-1-sized struct gets only its own fields. */
    gm_pool_t *p = mk(0, GM_PEERS_ALL, 0);
    if (p) {
        memset(&di, 0xab, sizeof di);
        di.size = offsetof(gm_device_info_t, device_count);
        di.version = 1;
        CHECK_OK(gm_pool_device_info(p, &di));
        CHECK(di.size == offsetof(gm_device_info_t, device_count));
        CHECK(di.granularity > 0);
        CHECK(di.peers == UINT64_C(0xabababababababab)); /* untouched */
        gm_pool_destroy(p);
    } else CHECK(0);
}

/* (d) Peers that do not exist or cannot reach the device; (e) devices past
 * the machine. */
static void test_unreachable(void)
{
    gm_device_info_t di;
    gm_pool_t *p = (gm_pool_t *)&p;
    CHECK_RC(create(0, (uint64_t)1 << 7, 0, &p), GM_NO_DEVICE);
    CHECK(p == NULL);
    CHECK(says("7", "device"));
    CHECK_RC(create(1, ((uint64_t)1 << 2) | ((uint64_t)1 << 40), 0, &p), GM_NO_DEVICE);
    CHECK(says("40", NULL));
    /* (e) */
    p = (gm_pool_t *)&p;
    CHECK_RC(create(4, 0, 0, &p), GM_NO_DEVICE);
    CHECK(p == NULL);
    CHECK(says("device 4", "GPUMEM_SIM_DEVICES"));
    CHECK_RC(create(31, 0, 0, &p), GM_NO_DEVICE);
    CHECK_RC(create(-1, 0, 0, &p), GM_INVALID_ARGUMENT);

    /* Groups of 2: {0,1} and {2,3}. */
    setenv("GPUMEM_SIM_PEER_GROUP", "2", 1);
    p = (gm_pool_t *)&p;
    CHECK_RC(create(0, (uint64_t)1 << 2, 0, &p), GM_NOT_SUPPORTED);
    CHECK(p == NULL);
    CHECK(says("device 2", "device 0"));
    CHECK_RC(create(0, 0x6, 0, &p), GM_NOT_SUPPORTED);
    CHECK_RC(create(3, 0x1, 0, &p), GM_NOT_SUPPORTED);
    CHECK(says("device 0", "device 3"));
    CHECK_RC(create(0, GM_PEERS_ALL, 0, &p), GM_NOT_SUPPORTED);
    if (new_pool_info(0, (uint64_t)1 << 1, 0, &di)) CHECK(di.peers == 0x2);
    if (new_pool_info(3, (uint64_t)1 << 2, 0, &di)) CHECK(di.peers == 0x4);
    /* No peers asked: groups do not matter. */
    p = mk(2, 0, 0);
    CHECK(p != NULL);
    gm_pool_destroy(p);
    /* A group larger than the machine: everyone reaches everyone. */
    setenv("GPUMEM_SIM_PEER_GROUP", "8", 1);
    if (new_pool_info(0, GM_PEERS_ALL, 0, &di)) CHECK(di.peers == 0xe);
    /* A malformed value fails the creation. */
    setenv("GPUMEM_SIM_PEER_GROUP", "two", 1);
    CHECK_RC(create(0, 0, 0, &p), GM_INVALID_ARGUMENT);
    CHECK(says("GPUMEM_SIM_PEER_GROUP", NULL));
    unsetenv("GPUMEM_SIM_PEER_GROUP");
    p = mk(0, GM_PEERS_ALL, 0);
    CHECK(p != NULL);
    gm_pool_destroy(p);

    /* The machine's size is read at each creation. */
    setenv("GPUMEM_SIM_DEVICES", "2", 1);
    CHECK_RC(create(2, 0, 0, &p), GM_NO_DEVICE);
    CHECK_RC(create(0, (uint64_t)1 << 2, 0, &p), GM_NO_DEVICE);
    if (new_pool_info(0, GM_PEERS_ALL, 0, &di)) {
        CHECK(di.device_count == 2 && di.peers == 0x2);
    }
    /* (GPUMEM_SIM_DEVICES=0 is taken as "unset", 32 devices: not checked.) */
    setenv("GPUMEM_SIM_DEVICES", "33", 1);
    CHECK_RC(create(0, 0, 0, &p), GM_INVALID_ARGUMENT);
    setenv("GPUMEM_SIM_DEVICES", "4", 1);
}

/* (f) The environment's settings. */
static void test_env(void)
{
    static const struct {
        const char *v;
        int rc;
        uint64_t mask;
    } cases[] = {
        {"all", GM_OK, GM_PEERS_ALL},   {"none", GM_OK, 0},
        {"0,1,3", GM_OK, 0xb},          {"2", GM_OK, 0x4},
        {"63", GM_OK, (uint64_t)1 << 63}, {"", GM_OK, 0},
        {"3,3", GM_OK, 0x8},            {"x", GM_INVALID_ARGUMENT, 0},
        {"64", GM_INVALID_ARGUMENT, 0}, {"1,", GM_INVALID_ARGUMENT, 0},
        {"1,,2", GM_INVALID_ARGUMENT, 0}, {",1", GM_INVALID_ARGUMENT, 0},
        {"-1", GM_INVALID_ARGUMENT, 0}, {"1 2", GM_INVALID_ARGUMENT, 0},
        {"ALL", GM_INVALID_ARGUMENT, 0}, {"100000000000000000000", GM_INVALID_ARGUMENT, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("GPUMEM_PEERS", cases[i].v, 1);
        gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
        cfg.peers = 0x5a5a; /* overwritten on success */
        int rc = gm_config_from_env(&cfg);
        if (rc != cases[i].rc || (rc == GM_OK && cfg.peers != cases[i].mask)) {
            fprintf(stderr, "  GPUMEM_PEERS=\"%s\": rc %d peers %#llx, want %d %#llx (%s)\n",
                    cases[i].v, rc, (unsigned long long)cfg.peers, cases[i].rc,
                    (unsigned long long)cases[i].mask, gm_last_error());
            CHECK(0);
        } else {
            CHECK(1);
        }
        if (rc != GM_OK) CHECK(says("GPUMEM_PEERS", NULL));
    }
    unsetenv("GPUMEM_PEERS");
    gm_pool_config_t cfg = GM_POOL_CONFIG_INIT;
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK(cfg.peers == 0 && !(cfg.flags & (GM_POOL_NCCL | GM_POOL_COMPRESSIBLE)));

    /* A pool made from the environment (cfg NULL) takes the peers. */
    setenv("GPUMEM_PEERS", "2,3", 1);
    setenv("GPUMEM_BACKEND", "sim", 1);
    setenv("GPUMEM_SIM_CAPACITY", "256MiB", 1);
    gm_pool_t *p = NULL;
    CHECK_OK(gm_pool_create(NULL, &p));
    if (p) {
        gm_device_info_t di = info_of(p);
        CHECK(di.backend == GM_BACKEND_SIM && di.device == 0 && di.peers == 0xc);
        gm_pool_destroy(p);
    }
    unsetenv("GPUMEM_PEERS");
    unsetenv("GPUMEM_BACKEND");
    unsetenv("GPUMEM_SIM_CAPACITY");

    CHECK_OK(config_with("GPUMEM_NCCL", "1", &cfg));
    CHECK((cfg.flags & GM_POOL_NCCL) && !(cfg.flags & GM_POOL_COMPRESSIBLE));
    CHECK_OK(config_with("GPUMEM_NCCL", "0", &cfg));
    CHECK(!(cfg.flags & GM_POOL_NCCL));
    CHECK_RC(config_with("GPUMEM_NCCL", "yes", &cfg), GM_INVALID_ARGUMENT);
    CHECK(says("GPUMEM_NCCL", NULL));
    unsetenv("GPUMEM_NCCL");

    CHECK_OK(config_with("GPUMEM_COMPRESSIBLE", "1", &cfg));
    CHECK((cfg.flags & GM_POOL_COMPRESSIBLE) && !(cfg.flags & GM_POOL_NCCL));
    CHECK_OK(config_with("GPUMEM_NCCL", "1", &cfg));
    CHECK((cfg.flags & (GM_POOL_COMPRESSIBLE | GM_POOL_NCCL)) ==
          (GM_POOL_COMPRESSIBLE | GM_POOL_NCCL));
    CHECK_RC(config_with("GPUMEM_COMPRESSIBLE", "2", &cfg), GM_INVALID_ARGUMENT);
    unsetenv("GPUMEM_COMPRESSIBLE");
    unsetenv("GPUMEM_NCCL");
    CHECK_OK(gm_config_from_env(&cfg));
    CHECK(!(cfg.flags & (GM_POOL_NCCL | GM_POOL_COMPRESSIBLE)));
}

/* (g) Compressible and NCCL pages. */
static void test_page_kinds(void)
{
    gm_pool_t *p = mk(1, 0, GM_POOL_COMPRESSIBLE);
    if (p) {
        gm_device_info_t di = info_of(p);
        CHECK(di.compressible == 1 && di.compression_supported == 1);
        /* The pages work as any. */
        void *a = NULL;
        CHECK_OK(gm_alloc(p, 5 * MiB, NULL, &a));
        CHECK_OK(gm_memset(p, a, 0x42, 5 * MiB, NULL));
        unsigned char c = 0;
        CHECK_OK(gm_memcpy(p, &c, (char *)a + 5 * MiB - 1, 1, NULL));
        CHECK(c == 0x42);
        void *s = NULL;
        CHECK_OK(gm_alloc_registrable(p, 3 * MiB, NULL, &s));
        CHECK_OK(gm_memset(p, s, 0x43, 3 * MiB, NULL));
        CHECK_OK(gm_free(p, s, NULL));
        CHECK_OK(gm_free(p, a, NULL));
        gm_pool_destroy(p);
    } else CHECK(0);
    gm_device_info_t di;
    if (new_pool_info(1, 0, 0, &di)) {
        CHECK(di.compressible == 0 && di.compression_supported == 1);
    }

    setenv("GPUMEM_SIM_COMPRESSION", "0", 1);
    p = (gm_pool_t *)&p;
    CHECK_RC(create(1, 0, GM_POOL_COMPRESSIBLE, &p), GM_NOT_SUPPORTED);
    CHECK(p == NULL);
    CHECK(says("compress", "device 1"));
    /* A device that cannot compress still makes plain pages. */
    if (new_pool_info(1, 0, 0, &di)) {
        CHECK(di.compression_supported == 0 && di.compressible == 0);
    }
    unsetenv("GPUMEM_SIM_COMPRESSION");
    p = mk(1, 0, GM_POOL_COMPRESSIBLE);
    CHECK(p != NULL);
    gm_pool_destroy(p);

    if (new_pool_info(0, GM_PEERS_ALL, GM_POOL_NCCL, &di)) {
        CHECK((di.handle_types & GM_HANDLE_POSIX_FD) != 0);
        CHECK(di.rdma_capable == 1);
        CHECK(di.compressible == 0);
        CHECK(di.peers == 0xe);
    }
    if (new_pool_info(0, 0, GM_POOL_NCCL | GM_POOL_COMPRESSIBLE, &di)) {
        CHECK(di.rdma_capable == 1 && di.compressible == 1);
    }
    /* Unknown flags are still refused. */
    CHECK_RC(create(0, 0, 0x100, &p), GM_INVALID_ARGUMENT);
}

/* (h) Destroying one device's pool leaves the others alone. */
static void test_destroy_one(void)
{
    gm_pool_t *p0 = mk(0, GM_PEERS_ALL, 0), *p1 = mk(1, GM_PEERS_ALL, 0);
    if (!p0 || !p1) { CHECK(0); gm_pool_destroy(p0); gm_pool_destroy(p1); return; }
    void *a = NULL, *b = NULL;
    CHECK_OK(gm_alloc(p0, 4 * MiB, NULL, &a));
    CHECK_OK(gm_alloc(p1, 4 * MiB, NULL, &b));
    CHECK_OK(gm_memset(p0, b, 0x11, 4 * MiB, NULL)); /* device 0 writes pool1's memory */
    CHECK_OK(gm_memcpy(p1, a, b, 4 * MiB, NULL));    /* device 1 copies into pool0's */
    CHECK_OK(gm_free(p0, a, NULL));
    gm_pool_destroy(p0);

    /* pool1 goes on: allocation, its own copies, growth, trim. */
    unsigned char *h = malloc(MiB), *r = malloc(MiB);
    if (!h || !r) { CHECK(0); free(h); free(r); gm_pool_destroy(p1); return; }
    fill_pattern(h, MiB, 77);
    CHECK_OK(gm_memcpy(p1, b, h, MiB, NULL));
    void *c = NULL;
    CHECK_OK(gm_alloc(p1, 20 * MiB, NULL, &c));
    CHECK_OK(gm_memcpy(p1, (char *)c + 19 * MiB, b, MiB, NULL));
    CHECK(read_holds(p1, r, (char *)c + 19 * MiB, MiB, 77));
    unsigned char one = 0;
    CHECK_OK(gm_memcpy(p1, &one, (char *)b + 2 * MiB, 1, NULL));
    CHECK(one == 0x11);
    CHECK_OK(gm_free(p1, c, NULL));
    CHECK_OK(gm_free(p1, b, NULL));
    CHECK_OK(gm_trim(p1, 0, NULL));
    CHECK(pool_stats_of(p1).reserved == 0);

    /* A new pool on the destroyed pool's device, granting device 1. */
    gm_pool_t *q0 = mk(0, 0x2, 0);
    if (q0) {
        void *x = NULL;
        CHECK_OK(gm_alloc(q0, MiB, NULL, &x));
        CHECK_OK(gm_memcpy(p1, x, h, MiB, NULL));
        CHECK(read_holds(q0, r, x, MiB, 77));
        CHECK_OK(gm_free(q0, x, NULL));
        gm_pool_destroy(q0);
    } else CHECK(0);
    CHECK_OK(gm_pool_check(p1));
    free(h);
    free(r);
    gm_pool_destroy(p1);
}

int main(void)
{
    setenv("GPUMEM_SIM_DEVICES", "4", 1);
    unsetenv("GPUMEM_SIM_PEER_GROUP");
    unsetenv("GPUMEM_SIM_COMPRESSION");
    unsetenv("GPUMEM_PEERS");
    test_refused();
    test_granted();
    test_info();
    test_unreachable();
    test_env();
    test_page_kinds();
    test_destroy_one();
    unsetenv("GPUMEM_SIM_DEVICES");
    return test_summary();
}
