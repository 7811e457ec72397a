/* An LD_PRELOAD library that makes a process see an AVX2-only x86-64 CPU (as an AMD EPYC Zen 2/3): CPUID stops
 * reporting AVX-512, AVX-VNNI and AMX, so every library that picks kernels by CPUID (onnxruntime's MLAS, torch's
 * cpuinfo and oneDNN, numpy) runs its AVX2 ones. benchmarks/as_avx2_cpu.py builds and uses it.
 *
 * How: Linux's CPUID faulting (arch_prctl ARCH_SET_CPUID, /proc/cpuinfo flag cpuid_fault) turns every CPUID
 * instruction of this process into a SIGSEGV. The handler runs the real CPUID with faulting briefly off, clears the
 * hidden feature bits, writes the registers back and steps over the instruction. Faulting is per thread, inherited
 * by the threads a process starts, and reset by execve, so compilers the process runs see the real CPU.
 * Handlers that others install for SIGSEGV later (Python's faulthandler) are kept and called for real faults. */
#define _GNU_SOURCE
#include <asm/prctl.h>
#include <cpuid.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

typedef int (*sigaction_fn)(int, const struct sigaction *, struct sigaction *);
typedef sighandler_t (*signal_fn)(int, sighandler_t);

static sigaction_fn real_sigaction;
static signal_fn real_signal;
static struct sigaction next_segv; /* the SIGSEGV handler the process asked for, called for real faults */

/* CPUID leaf 7 subleaf 0, EBX: AVX512F, DQ, IFMA, PF, ER, CD, BW, VL */
#define LEAF7_EBX_HIDDEN ((1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) | \
                          (1u << 30) | (1u << 31))
/* ECX: AVX512_VBMI, VBMI2, VNNI, BITALG, VPOPCNTDQ */
#define LEAF7_ECX_HIDDEN ((1u << 1) | (1u << 6) | (1u << 11) | (1u << 12) | (1u << 14))
/* EDX: AVX512_4VNNIW, 4FMAPS, VP2INTERSECT, AMX_BF16, AVX512_FP16, AMX_TILE, AMX_INT8 */
#define LEAF7_EDX_HIDDEN ((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25))
/* leaf 7 subleaf 1, EAX: AVX_VNNI, AVX512_BF16, AMX_FP16, AVX_IFMA */
#define LEAF7_1_EAX_HIDDEN ((1u << 4) | (1u << 5) | (1u << 21) | (1u << 23))

static long set_cpuid_enabled(int enabled) { return syscall(SYS_arch_prctl, ARCH_SET_CPUID, enabled); }

static void masked_cpuid(uint32_t leaf, uint32_t subleaf, uint32_t regs[4]) {
    set_cpuid_enabled(1);
    __cpuid_count(leaf, subleaf, regs[0], regs[1], regs[2], regs[3]);
    set_cpuid_enabled(0);
    if (leaf == 7 && subleaf == 0) {
        regs[1] &= ~LEAF7_EBX_HIDDEN;
        regs[2] &= ~LEAF7_ECX_HIDDEN;
        regs[3] &= ~LEAF7_EDX_HIDDEN;
    } else if (leaf == 7 && subleaf == 1) {
        regs[0] &= ~LEAF7_1_EAX_HIDDEN;
    }
}

static void on_segv(int signal, siginfo_t *info, void *context) {
    ucontext_t *uc = context;
    greg_t *gregs = uc->uc_mcontext.gregs;
    const uint8_t *pc = (const uint8_t *)gregs[REG_RIP];
    if (info->si_code == SI_KERNEL && pc[0] == 0x0f && pc[1] == 0xa2) {
        uint32_t regs[4];
        masked_cpuid((uint32_t)gregs[REG_RAX], (uint32_t)gregs[REG_RCX], regs);
        gregs[REG_RAX] = regs[0];
        gregs[REG_RBX] = regs[1];
        gregs[REG_RCX] = regs[2];
        gregs[REG_RDX] = regs[3];
        gregs[REG_RIP] += 2;
        return;
    }
    /* a real fault: the process's own handler, or the default action (the fault repeats and kills it) */
    if (next_segv.sa_flags & SA_SIGINFO) {
        next_segv.sa_sigaction(signal, info, context);
    } else if (next_segv.sa_handler != SIG_DFL && next_segv.sa_handler != SIG_IGN) {
        next_segv.sa_handler(signal);
    } else {
        struct sigaction fallback = {.sa_handler = SIG_DFL};
        real_sigaction(SIGSEGV, &fallback, NULL);
    }
}

static void resolve_real_functions(void) {
    if (!real_sigaction) real_sigaction = (sigaction_fn)dlsym(RTLD_NEXT, "sigaction");
    if (!real_signal) real_signal = (signal_fn)dlsym(RTLD_NEXT, "signal");
}

/* Keep on_segv installed: record what the process installs for SIGSEGV, and report that back. */
int sigaction(int signum, const struct sigaction *action, struct sigaction *old) {
    resolve_real_functions();
    if (signum != SIGSEGV) return real_sigaction(signum, action, old);
    if (old) *old = next_segv;
    if (action) next_segv = *action;
    return 0;
}

sighandler_t signal(int signum, sighandler_t handler) {
    resolve_real_functions();
    if (signum != SIGSEGV) return real_signal(signum, handler);
    sighandler_t old = next_segv.sa_handler;
    memset(&next_segv, 0, sizeof next_segv);
    next_segv.sa_handler = handler;
    return old;
}

__attribute__((constructor)) static void hide_avx512(void) {
    resolve_real_functions();
    struct sigaction action = {.sa_sigaction = on_segv, .sa_flags = SA_SIGINFO | SA_NODEFER};
    sigemptyset(&action.sa_mask);
    if (real_sigaction(SIGSEGV, &action, NULL) != 0 || set_cpuid_enabled(0) != 0) {
        fprintf(stderr, "avx2_cpuid: this CPU or kernel has no CPUID faulting (cpuid_fault); cannot hide AVX-512\n");
        _exit(3);
    }
}
