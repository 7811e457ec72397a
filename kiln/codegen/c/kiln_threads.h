/* kiln_threads.h: the team size on a machine shared with other busy processes, pasted into every generated model.c.
 *
 * Each kernel ends on a barrier, and a worker the OS has descheduled holds every other thread there until it gets a
 * time slice back. With one CPU-bound process beside a 2-thread run on 2 cores, MobileNetV2 went from 3.7 ms to
 * 8-80 ms a run (medians of runs in one 3 s window), where one thread alone takes 6.3 ms. So a run measures how
 * many CPUs its team actually had: the CPU time its threads used in the parallel regions over the regions' wall
 * time (a thread spinning at a barrier counts as running; one waiting for a CPU does not), over a window of runs
 * of at least 20 ms. A single run is no evidence: on the quiet 2-vCPU VM, about one 0.5 ms run in a thousand found
 * its worker away for half of it, and deciding on one run put a small CNN on one thread for a quarter of the time.
 * When the window's CPUs round below the team size, the next runs use that many threads, and later runs try the full
 * team again: after 0.25 s, doubling each time the machine is still busy, up to 4 s. Results do not depend on the
 * team size (every output element is summed in the same order whatever the split), so this changes only the speed.
 *
 * A run whose workers were asleep is no evidence either: the model's first run on a team, and one that starts more
 * than 5 ms after the last one ended (OpenMP's workers stop spinning and sleep; waking them is the OS's and the
 * hypervisor's business, not a sign of another process). On the 2-vCPU VM the first run after a 50 ms pause found
 * its worker 1.3-2.6 ms late and took 10 ms where later ones took 0.16 ms: half a window alone, and a benchmark
 * that pauses between peers' batches kept the int8 MLP at batch 1 on one thread (0.37 ms a run against 0.24 ms).
 * So a model that only runs after pauses keeps its full team.
 *
 * KILN_ADAPTIVE_THREADS=0 in the environment when a model is created keeps its runs on the full team (tests of the
 * kernels' work splits, and measurements of them, want that). Runs on one model may be concurrent: the state is read and written with relaxed atomics, and a lost update only
 * delays the next adjustment by a run. The policy takes the time as an argument so that it can be tested alone.
 */
#ifndef KILN_THREADS_H
#define KILN_THREADS_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define KILN_TEAM_FIRST_HOLD_NS INT64_C(250000000)  /* a reduced team's first hold before the full team is tried */
#define KILN_TEAM_LONGEST_HOLD_NS INT64_C(4000000000)
#define KILN_TEAM_WINDOW_NS INT64_C(20000000)  /* the parallel regions' wall time a decision needs */
#define KILN_TEAM_IDLE_NS INT64_C(5000000)  /* a pause after which a team's workers were asleep */

typedef struct {
    int fixed;              /* KILN_ADAPTIVE_THREADS=0: every run gets the full team */
    int limit;              /* threads the last window's runs had CPUs for (0: no limit) */
    int last_threads;       /* the team size of the latest run */
    int window_threads;     /* the team size of the runs in the window */
    int64_t window_cpu_ns;  /* their CPU time, all threads together */
    int64_t window_wall_ns; /* their parallel regions' wall time */
    int64_t retry_ns;       /* when a run next tries the full team (kiln_clock_ns(CLOCK_MONOTONIC)) */
    int64_t hold_ns;        /* how long the current limit holds: doubles with each try that finds the machine busy */
    int64_t team_end_ns;    /* when the last run on two threads or more ended (0: none yet) */
} kiln_team;

static inline int64_t kiln_clock_ns(clockid_t clock)
{
    struct timespec t;
    if (clock_gettime(clock, &t) != 0) return 0;
    return (int64_t)t.tv_sec * INT64_C(1000000000) + t.tv_nsec;
}

static void kiln_team_init(kiln_team* team)
{
    const char* adaptive = getenv("KILN_ADAPTIVE_THREADS");
    team->fixed = adaptive != NULL && strcmp(adaptive, "0") == 0;
}

/* Threads for a run that wants `wanted`, at time `now_ns`: the limit while it holds, the full team after (until a
 * window of full-team runs decides again). */
static int kiln_team_size(kiln_team* team, int wanted, int64_t now_ns)
{
    const int limit = __atomic_load_n(&team->limit, __ATOMIC_RELAXED);
    if (team->fixed || limit <= 0 || limit >= wanted || now_ns >= __atomic_load_n(&team->retry_ns, __ATOMIC_RELAXED))
        return wanted;
    return limit;
}

/* After a run of `threads` threads (of `wanted`), from `start_ns` to `now_ns`, whose parallel regions took `wall_ns`
 * and used `cpu_ns` of CPU time on all threads together. A window of full-team runs that had a CPU per thread lifts
 * the limit. */
static void kiln_team_record(kiln_team* team, int threads, int wanted, int64_t cpu_ns, int64_t wall_ns,
                             int64_t start_ns, int64_t now_ns)
{
    __atomic_store_n(&team->last_threads, threads, __ATOMIC_RELAXED);
    if (threads < 2 || wall_ns <= 0) return;
    const int64_t previous_end = __atomic_exchange_n(&team->team_end_ns, now_ns, __ATOMIC_RELAXED);
    if (previous_end == 0 || start_ns - previous_end > KILN_TEAM_IDLE_NS) return; /* its workers were asleep */
    if (__atomic_exchange_n(&team->window_threads, threads, __ATOMIC_RELAXED) != threads) {
        __atomic_store_n(&team->window_cpu_ns, 0, __ATOMIC_RELAXED);  /* a window holds one team size */
        __atomic_store_n(&team->window_wall_ns, 0, __ATOMIC_RELAXED);
    }
    cpu_ns = __atomic_add_fetch(&team->window_cpu_ns, cpu_ns, __ATOMIC_RELAXED);
    wall_ns = __atomic_add_fetch(&team->window_wall_ns, wall_ns, __ATOMIC_RELAXED);
    if (wall_ns < KILN_TEAM_WINDOW_NS) return;
    __atomic_store_n(&team->window_cpu_ns, 0, __ATOMIC_RELAXED);  /* this run closes the window */
    __atomic_store_n(&team->window_wall_ns, 0, __ATOMIC_RELAXED);
    const int had = (int)((double)cpu_ns / (double)wall_ns + 0.5);  /* CPUs the team had, on average */
    if (had >= threads) {
        if (threads >= wanted) {
            __atomic_store_n(&team->limit, 0, __ATOMIC_RELAXED);
            __atomic_store_n(&team->hold_ns, 0, __ATOMIC_RELAXED);
        }
        return;
    }
    /* A full team that found the machine still busy holds its limit twice as long as the last time. */
    int64_t hold = __atomic_load_n(&team->hold_ns, __ATOMIC_RELAXED);
    if (hold <= 0)
        hold = KILN_TEAM_FIRST_HOLD_NS;
    else if (threads >= wanted)
        hold = hold >= KILN_TEAM_LONGEST_HOLD_NS / 2 ? KILN_TEAM_LONGEST_HOLD_NS : 2 * hold;
    __atomic_store_n(&team->hold_ns, hold, __ATOMIC_RELAXED);
    __atomic_store_n(&team->retry_ns, now_ns + hold, __ATOMIC_RELAXED);
    __atomic_store_n(&team->limit, had < 1 ? 1 : had, __ATOMIC_RELAXED);
}

#endif /* KILN_THREADS_H */
