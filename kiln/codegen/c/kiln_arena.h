/* kiln_arena.h: the temporaries' arena a model keeps between runs, pasted into every generated model.c.
 *
 * A run's temporaries live in one arena (kiln/codegen/memory.py plans their offsets). Allocated per run, an arena
 * above glibc's largest mmap threshold (32 MB) came from a fresh mmap every time, and the run paid a page fault for
 * each 4 KB page it touched: the zoo CNN at batch 128 (an 84 MB arena) took 20,481 faults a run. So a model keeps its
 * arena: a run takes it when no other run on the model holds it, and grows it when it is too small; a concurrent
 * run allocates its own, as before. kiln_destroy frees it, so a model holds the arena of its largest run meanwhile.
 */
#ifndef KILN_ARENA_H
#define KILN_ARENA_H

#include <stddef.h>
#include <stdlib.h>

typedef struct {
    unsigned char* memory;
    size_t bytes;
    int busy;  /* a run holds `memory` */
} kiln_arena;

/* At least `bytes` 64-byte-aligned bytes for one run, or NULL; *kept says whether they are the model's arena. */
static unsigned char* kiln_arena_take(kiln_arena* arena, size_t bytes, int* kept)
{
    bytes = (bytes + 63) / 64 * 64;  /* aligned_alloc wants a multiple of the alignment */
    *kept = __atomic_exchange_n(&arena->busy, 1, __ATOMIC_ACQUIRE) == 0;
    if (!*kept) return (unsigned char*)aligned_alloc(64, bytes);
    if (arena->bytes < bytes) {
        free(arena->memory);
        arena->memory = (unsigned char*)aligned_alloc(64, bytes);
        arena->bytes = arena->memory ? bytes : 0;
    }
    if (!arena->memory) {
        *kept = 0;
        __atomic_store_n(&arena->busy, 0, __ATOMIC_RELEASE);
    }
    return arena->memory;
}

/* The end of a run that took `memory` with kiln_arena_take. */
static void kiln_arena_give(kiln_arena* arena, unsigned char* memory, int kept)
{
    if (kept) __atomic_store_n(&arena->busy, 0, __ATOMIC_RELEASE);
    else free(memory);
}

#endif /* KILN_ARENA_H */
