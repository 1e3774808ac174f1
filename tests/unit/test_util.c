/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_util.c — the small helpers every layer relies on: size parsing and
 * byte formatting (util.c), status names and the per-thread last error
 * (error.c), call-kind names and backend selection (src/backend/select.c).
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "backend/backend.h"
#include "base/internal.h"
#include "../test.h"

static size_t parsed(const char *s)
{
    size_t v = (size_t)-1;
    int rc = gm__parse_size(s, &v);
    if (rc != GM_OK) {
        fprintf(stderr, "parse_size(\"%s\") failed: %s\n", s, gm_last_error());
        return (size_t)-2;
    }
    return v;
}

static void test_parse_size(void)
{
    const size_t K = 1024, M = K * 1024, G = M * 1024;
    CHECK(parsed("0") == 0);
    CHECK(parsed("123") == 123);
    CHECK(parsed("4k") == 4 * K);
    CHECK(parsed("4K") == 4 * K);
    CHECK(parsed("4kB") == 4 * K);
    CHECK(parsed("4KiB") == 4 * K);
    CHECK(parsed("2M") == 2 * M);
    CHECK(parsed("2MiB") == 2 * M);
    CHECK(parsed("2mib") == 2 * M);
    CHECK(parsed("1.5G") == 3 * G / 2);
    CHECK(parsed("80GiB") == 80 * G);
    CHECK(parsed("80GB") == 80 * G);
    CHECK(parsed("80 GiB") == 80 * G);
    CHECK(parsed(" 512 ") == 512);
    CHECK(parsed("512B") == 512);
    CHECK(parsed("1T") == 1024 * G);
    CHECK(parsed("0.5k") == 512);
    CHECK(parsed("0.1k") == 102); /* rounded down to whole bytes */
    CHECK(parsed("1.000000000000000000001G") == G);
    CHECK(parsed("15E") == (size_t)15 << 60);
    CHECK(parsed("18446744073709551615") == SIZE_MAX);

    static const char *const bad[] = {
        "", " ", "k", "abc", "-1", "+1", "1x", "1.5", "1.", ".5G", "1..5G", "1 2", "1GiBs",
        "1Gi", "0x10", "1.5B", "2 M B", "16E", "18446744073709551616", "99999999999999999999k",
        "17179869184G",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t v = 77;
        gm__clear_error();
        int rc = gm__parse_size(bad[i], &v);
        if (rc != GM_INVALID_ARGUMENT) fprintf(stderr, "accepted bad size \"%s\"\n", bad[i]);
        CHECK(rc == GM_INVALID_ARGUMENT);
        CHECK(v == 77);
        CHECK(strstr(gm_last_error(), "invalid size") != NULL);
    }
    size_t v;
    CHECK_RC(gm__parse_size(NULL, &v), GM_INVALID_ARGUMENT);
    CHECK_RC(gm__parse_size("1", NULL), GM_INVALID_ARGUMENT);
}

static int fmt_is(uint64_t bytes, const char *want)
{
    char buf[32];
    const char *got = gm__fmt_bytes(bytes, buf, sizeof buf);
    if (got != buf || strcmp(buf, want) != 0) {
        fprintf(stderr, "fmt_bytes(%llu) = \"%s\", want \"%s\"\n", (unsigned long long)bytes, buf,
                want);
        return 0;
    }
    return 1;
}

static void test_fmt_bytes(void)
{
    CHECK(fmt_is(0, "0 B"));
    CHECK(fmt_is(512, "512 B"));
    CHECK(fmt_is(1023, "1023 B"));
    CHECK(fmt_is(1024, "1.00 KiB"));
    CHECK(fmt_is(3072, "3.00 KiB"));
    CHECK(fmt_is(1048575, "1.00 MiB"));
    CHECK(fmt_is(2097152, "2.00 MiB"));
    CHECK(fmt_is(13590000000ull, "12.66 GiB"));
    CHECK(fmt_is((uint64_t)80 << 30, "80.00 GiB"));
    CHECK(fmt_is(UINT64_MAX, "16.00 EiB"));
    char small[4];
    gm__fmt_bytes(123456, small, sizeof small); /* truncated, still terminated */
    CHECK(strlen(small) == 3);
    CHECK(gm__fmt_bytes(1, NULL, 0) == NULL);
}

static void *other_thread(void *arg)
{
    (void)arg;
    /* A fresh thread starts with no message, and its message stays its own. */
    int empty = gm_last_error()[0] == '\0';
    gm__set_error(GM_IO, "thread message");
    return (void *)(intptr_t)empty;
}

static void test_errors(void)
{
    CHECK(strcmp(gm_strerror(GM_OK), "success") == 0);
    CHECK(strcmp(gm_strerror(GM_OUT_OF_MEMORY), "out of device memory") == 0);
    CHECK(strcmp(gm_errname(GM_OK), "GM_OK") == 0);
    CHECK(strcmp(gm_errname(GM_NOT_READY), "GM_NOT_READY") == 0);
    CHECK(strcmp(gm_errname(GM_INTERNAL), "GM_INTERNAL") == 0);
    for (int s = 0; s < GM_ERRNO_COUNT; s++) {
        CHECK(strncmp(gm_errname(s), "GM_", 3) == 0);
        CHECK(strcmp(gm_errname(s), "GM_UNKNOWN") != 0);
        CHECK(strcmp(gm_strerror(s), "unknown error") != 0);
    }
    CHECK(strcmp(gm_strerror(-1), "unknown error") == 0);
    CHECK(strcmp(gm_strerror(GM_ERRNO_COUNT), "unknown error") == 0);
    CHECK(strcmp(gm_errname(1000), "GM_UNKNOWN") == 0);

    gm__clear_error();
    CHECK(strcmp(gm_last_error(), "") == 0);
    CHECK(gm__set_error(GM_LIMIT, "limit %d of %s", 5, "bytes") == GM_LIMIT);
    CHECK(strcmp(gm_last_error(), "limit 5 of bytes") == 0);
    /* Wrapping the previous message in context is allowed. */
    gm__set_error(GM_LIMIT, "pool: %s", gm_last_error());
    CHECK(strcmp(gm_last_error(), "pool: limit 5 of bytes") == 0);
    /* Long messages are truncated, never overflow. */
    char big[5000]; /* longer than the message buffer */
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = '\0';
    gm__set_error(GM_IO, "%s", big);
    CHECK(strlen(gm_last_error()) > 100 && strlen(gm_last_error()) < sizeof big - 1);

    pthread_t t;
    void *res = NULL;
    gm__set_error(GM_PARSE, "main message");
    CHECK(pthread_create(&t, NULL, other_thread, NULL) == 0);
    CHECK(pthread_join(t, &res) == 0);
    CHECK(res == (void *)1);
    CHECK(strcmp(gm_last_error(), "main message") == 0);
    gm__clear_error();
    CHECK(gm_last_error()[0] == '\0');

    CHECK(strcmp(gm_version(), GM_VERSION_STRING) == 0);
}

static void test_call_names(void)
{
    CHECK(strcmp(gm_call_name(GM_CALL_va_reserve), "va_reserve") == 0);
    CHECK(strcmp(gm_call_name(GM_CALL_set_access), "set_access") == 0);
    CHECK(strcmp(gm_call_name(GM_CALL_memset), "memset") == 0);
    CHECK(gm_call_name(-1) == NULL);
    CHECK(gm_call_name(GM_CALL_COUNT) == NULL);
    for (int k = 0; k < GM_CALL_COUNT; k++) {
        const char *n = gm_call_name(k);
        CHECK(n != NULL && gm_call_from_name(n) == k);
    }
    CHECK(gm_call_from_name("nope") == -1);
    CHECK(gm_call_from_name("") == -1);
    CHECK(gm_call_from_name(NULL) == -1);
    CHECK(gm_call_from_name("MAP") == -1); /* names are exact */
}

static void test_backend_select(void)
{
    const gm__backend_ops_t *ops = NULL;
    gm_backend_kind_t chosen = GM_BACKEND_AUTO;
    char why[256];

    CHECK_OK(gm__backend_select(GM_BACKEND_SIM, 0, &ops, &chosen, why, sizeof why));
    CHECK(ops == &gm__backend_sim && chosen == GM_BACKEND_SIM);
    CHECK(strcmp(ops->name, "sim") == 0);

    char cuda_why[256] = "";
    int cuda_rc = gm__backend_cuda.probe ? gm__backend_cuda.probe(0, cuda_why, sizeof cuda_why)
                                         : GM_NO_DEVICE;
    ops = NULL;
    int rc = gm__backend_select(GM_BACKEND_CUDA, 0, &ops, &chosen, why, sizeof why);
    if (cuda_rc == GM_OK) {
        CHECK(rc == GM_OK && ops == &gm__backend_cuda && chosen == GM_BACKEND_CUDA);
    } else {
        CHECK(rc == GM_NO_DEVICE);
        CHECK(ops == NULL);
        CHECK(strncmp(why, "cuda: ", 6) == 0);
        CHECK(strstr(gm_last_error(), "cuda") != NULL);
    }

    rc = gm__backend_select(GM_BACKEND_AUTO, 0, &ops, &chosen, why, sizeof why);
    CHECK_OK(rc);
    if (cuda_rc == GM_OK) {
        CHECK(chosen == GM_BACKEND_CUDA && ops == &gm__backend_cuda);
    } else {
        CHECK(chosen == GM_BACKEND_SIM && ops == &gm__backend_sim);
        CHECK(strncmp(why, "cuda: ", 6) == 0);
        CHECK(strstr(why, "; using sim") != NULL);
        if (!strstr(why, "; using sim")) fprintf(stderr, "why: %s\n", why);
    }

    CHECK_RC(gm__backend_select((gm_backend_kind_t)7, 0, &ops, &chosen, why, sizeof why),
             GM_INVALID_ARGUMENT);
    CHECK_RC(gm__backend_select(GM_BACKEND_SIM, 0, NULL, &chosen, why, sizeof why),
             GM_INVALID_ARGUMENT);
    CHECK_RC(gm__backend_select(GM_BACKEND_SIM, -1, &ops, &chosen, why, sizeof why),
             GM_INVALID_ARGUMENT);
    CHECK_OK(gm__backend_select(GM_BACKEND_SIM, 0, &ops, &chosen, NULL, 0));
    char tiny[4];
    CHECK_OK(gm__backend_select(GM_BACKEND_AUTO, 0, &ops, &chosen, tiny, sizeof tiny));
    CHECK(strlen(tiny) < sizeof tiny);
}

int main(void)
{
    test_parse_size();
    test_fmt_bytes();
    test_errors();
    test_call_names();
    test_backend_select();
    return test_summary();
}
