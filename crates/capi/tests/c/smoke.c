/* The C ABI as a C user sees it, on the simulated device: twice the HBM cap of data moved by
 * acquire/release and page-out, every byte verified, every error a status with a message that
 * names the call. Run by tests/c_program.rs; exits non-zero at the first failed check. */

#include "tiermem.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define COUNT 4
#define SIZE (4 * MIB)

#define CHECK(call)                                                                              \
    do {                                                                                         \
        TiermemStatus status_ = (call);                                                          \
        if (status_ != TIERMEM_STATUS_OK) {                                                      \
            fprintf(stderr, "line %d: %s returned %d: %s\n", __LINE__, #call, (int)status_,      \
                    tiermem_last_error());                                                       \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

/* `call` fails with `expected`, and the thread's message names `name`. */
#define EXPECT_FAILS(call, expected, name)                                                       \
    do {                                                                                         \
        TiermemStatus status_ = (call);                                                          \
        const char *message_ = tiermem_last_error();                                             \
        if (status_ != (expected) || message_ == NULL || strstr(message_, name) != message_) {   \
            fprintf(stderr, "line %d: %s returned %d (expected %d): %s\n", __LINE__, #call,      \
                    (int)status_, (int)(expected), message_ ? message_ : "(no message)");        \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

#define EXPECT(condition)                                                                        \
    do {                                                                                         \
        if (!(condition)) {                                                                      \
            fprintf(stderr, "line %d: expected %s\n", __LINE__, #condition);                     \
            return 1;                                                                            \
        }                                                                                        \
    } while (0)

static void fill(unsigned char *bytes, size_t len, unsigned seed) {
    for (size_t i = 0; i < len; i++) bytes[i] = (unsigned char)(i * 31u + seed * 7u + (i >> 12));
}

int main(void) {
    TiermemConfig config = tiermem_config_default();
    config.backend = "sim";
    config.hbm_limit = 8 * MIB;
    config.sim_hbm = 16 * MIB;
    config.host_limit = 64 * MIB;
    CHECK(tiermem_init(&config));
    EXPECT_FAILS(tiermem_init(&config), TIERMEM_STATUS_INVALID_ARGUMENT, "tiermem_init: ");

    unsigned char *expected = malloc(SIZE), *back = malloc(SIZE);
    EXPECT(expected != NULL && back != NULL);
    uint64_t ptrs[COUNT];
    TiermemAllocOptions options = {.name = "c-smoke", .priority = 0, .read_only = false, .in_place = true};
    for (unsigned i = 0; i < COUNT; i++) {
        CHECK(tiermem_alloc(SIZE, &options, &ptrs[i]));
        fill(expected, SIZE, i);
        CHECK(tiermem_write(ptrs[i], expected, SIZE));
    }
    /* Twice the HBM cap cycles through it: the first round dirties every chunk. */
    for (int round = 0; round < 2; round++) {
        for (unsigned i = 0; i < COUNT; i++) {
            CHECK(tiermem_acquire(ptrs[i], SIZE, round == 0, NULL));
            CHECK(tiermem_release(ptrs[i], SIZE, NULL));
        }
    }
    /* The schedule recorder: the first pass is recorded, the next ones find their steps. */
    for (int pass = 0; pass < 3; pass++) {
        CHECK(tiermem_pass_begins());
        for (unsigned i = 0; i < COUNT; i++) {
            int64_t step = -2;
            CHECK(tiermem_step_enters(100 + i, &ptrs[i], 1, 2 * MIB, &step));
            EXPECT(step == (pass == 0 ? -1 : (int64_t)i));
            CHECK(tiermem_acquire(ptrs[i], SIZE, false, NULL));
            CHECK(tiermem_release(ptrs[i], SIZE, NULL));
        }
    }
    /* Half a buffer, named by a pointer into its middle. */
    CHECK(tiermem_acquire(ptrs[1] + SIZE / 2, SIZE / 2, false, NULL));
    CHECK(tiermem_release(ptrs[1] + SIZE / 2, SIZE / 2, NULL));
    CHECK(tiermem_page_out(0));
    CHECK(tiermem_page_in(ptrs[3]));
    for (unsigned i = 0; i < COUNT; i++) {
        memset(back, 0, SIZE);
        CHECK(tiermem_read(ptrs[i], back, SIZE));
        fill(expected, SIZE, i);
        EXPECT(memcmp(back, expected, SIZE) == 0);
    }

    /* Bytes no longer wanted: discarded, whole chunks read as zeros; the others keep theirs. */
    CHECK(tiermem_discard(ptrs[3], SIZE));
    CHECK(tiermem_read(ptrs[3], back, SIZE));
    for (size_t b = 0; b < SIZE; b++) EXPECT(back[b] == 0);
    fill(expected, SIZE, 2);
    CHECK(tiermem_read(ptrs[2], back, SIZE));
    EXPECT(memcmp(back, expected, SIZE) == 0);
    EXPECT_FAILS(tiermem_discard(ptrs[3], 2 * SIZE), TIERMEM_STATUS_INVALID_ARGUMENT, "tiermem_discard: ");

    uint64_t start = 0;
    size_t size = 0;
    CHECK(tiermem_lookup(ptrs[2] + 12345, &start, &size));
    EXPECT(start == ptrs[2] && size == SIZE);

    /* The statistics as JSON: ask for the size, then fill a buffer of it. */
    size_t needed = 0;
    CHECK(tiermem_stats_json(NULL, 0, &needed));
    char *json = malloc(needed);
    EXPECT(json != NULL);
    EXPECT_FAILS(tiermem_stats_json(json, needed - 1, &needed), TIERMEM_STATUS_INVALID_ARGUMENT,
                 "tiermem_stats_json: ");
    CHECK(tiermem_stats_json(json, needed, &needed));
    EXPECT(strlen(json) + 1 == needed && strstr(json, "\"name\":\"c-smoke\"") != NULL);
    EXPECT(strstr(json, "\"policy\":\"lru\"") != NULL);
    free(json);

    /* Errors are statuses with a message naming the call; none changes anything. */
    EXPECT_FAILS(tiermem_acquire(ptrs[0], SIZE + 1, false, NULL), TIERMEM_STATUS_INVALID_ARGUMENT,
                 "tiermem_acquire: ");
    EXPECT_FAILS(tiermem_release(ptrs[0], SIZE, NULL), TIERMEM_STATUS_BUFFER_STATE, "tiermem_release: ");
    EXPECT_FAILS(tiermem_free(ptrs[0] + 1), TIERMEM_STATUS_INVALID_ARGUMENT, "tiermem_free: ");
    EXPECT_FAILS(tiermem_alloc(SIZE, NULL, NULL), TIERMEM_STATUS_INVALID_ARGUMENT, "tiermem_alloc: ");
    EXPECT_FAILS(tiermem_read(ptrs[0], NULL, 1), TIERMEM_STATUS_INVALID_ARGUMENT, "tiermem_read: ");
    EXPECT_FAILS(tiermem_lookup(12345, NULL, NULL), TIERMEM_STATUS_INVALID_ARGUMENT, "tiermem_lookup: ");
    EXPECT_FAILS(tiermem_step_enters(1, NULL, 1, 0, NULL), TIERMEM_STATUS_INVALID_ARGUMENT, "tiermem_step_enters: ");
    uint64_t huge = 0;
    CHECK(tiermem_alloc(16 * MIB, NULL, &huge));
    EXPECT_FAILS(tiermem_acquire(huge, 16 * MIB, false, NULL), TIERMEM_STATUS_WOULD_NEVER_FIT, "tiermem_acquire: ");
    CHECK(tiermem_free(huge));
    EXPECT_FAILS(tiermem_shutdown(), TIERMEM_STATUS_BUFFER_STATE, "tiermem_shutdown: ");

    /* The PyTorch allocator's pair: a resident allocation, freed only by its own free. */
    void *tensor = tiermem_torch_malloc((intptr_t)SIZE, 0, NULL);
    EXPECT(tensor != NULL);
    EXPECT(tiermem_live_allocations() == COUNT + 1);
    EXPECT_FAILS(tiermem_free((uint64_t)(uintptr_t)tensor), TIERMEM_STATUS_INVALID_ARGUMENT, "tiermem_free: ");
    EXPECT(tiermem_torch_malloc(-1, 0, NULL) == NULL);
    EXPECT(strstr(tiermem_last_error(), "size -1 is negative") != NULL);
    tiermem_torch_free(tensor, (intptr_t)SIZE, 0, NULL);

    for (unsigned i = 0; i < COUNT; i++) CHECK(tiermem_free(ptrs[i]));
    EXPECT(tiermem_live_allocations() == 0);
    CHECK(tiermem_shutdown());
    EXPECT_FAILS(tiermem_alloc(SIZE, NULL, &huge), TIERMEM_STATUS_NOT_INITIALIZED, "tiermem_alloc: ");
    free(expected);
    free(back);
    puts("tiermem C ABI: all checks passed");
    return 0;
}
