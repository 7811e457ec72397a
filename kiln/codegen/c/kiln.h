/* kiln.h: the C ABI of a package built by `kiln compile --target c` (ABI version 6).
 *
 * A package directory holds manifest.json (signature, symbols, dtypes and symbolic shapes), weights.bin
 * (raw little-endian weights, 64-byte aligned), model.c and model.so. model.so exports the functions below.
 * Link against it directly (cc app.c path/to/model.so) or load it with dlopen and the *_fn typedefs;
 * see examples/c_deploy/main.c.
 *
 * Threading: kiln_run keeps its per-call state on the call's stack/heap, so one model may be run from
 * several threads at once, unless it keeps state (kiln_num_states() > 0): then runs must take turns. A model keeps its temporaries' arena between runs for the next run that finds it free
 * (a concurrent run allocates its own); kiln_destroy frees it. Each call runs its kernels in one OpenMP parallel region of kiln_set_num_threads
 * threads (default: OpenMP's, i.e. OMP_NUM_THREADS or the CPU count), fewer while the CPUs are busy with other
 * processes (kiln_last_run_threads). kiln_error returns the message of the last failed kiln_run on that model.
 *
 * Version 2 added kiln_set_num_threads, profiling, and weight panels packed by kiln_create (it may now fail for memory).
 * Version 3 added kiln_build_id: a hash of model.c, recorded as build_id in manifest.json.
 * Version 4 added kiln_last_run_threads: runs use fewer threads while other processes keep the CPUs busy.
 * Version 5 added outputs kiln_run allocates (kiln_output_allocated, kiln_allocated_output, kiln_free): those whose
 * size the run reads from values, such as nonzero's rows or the rows a boolean mask picks.
 * Version 6 added state: the buffers the program mutates (a static KV cache) live in the model, from run to run
 * (kiln_num_states, kiln_state_name, kiln_state_nbytes, kiln_state_data, kiln_reset_state); they are no longer outputs.
 */
#ifndef KILN_H
#define KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_ABI_VERSION 6
#define KILN_MAX_RANK 8  /* the most dims of an output kiln_run allocates */

typedef struct kiln_model kiln_model;

/* An output whose size depends on values the run reads (manifest.json marks it "data_dependent": true, and its
 * shape names sizes of "data_dependent_symbols"): the caller passes a pointer to one of these in its outputs slot,
 * and a kiln_run that succeeds fills `data` (the caller frees it with kiln_free) and the first rank dims of `shape`. */
typedef struct { void* data; int64_t shape[KILN_MAX_RANK]; } kiln_allocated_output;

/* Metadata: counts and names, in the order kiln_run takes them (NULL for an index out of range). */
int kiln_abi_version(void);
/* A hash of the model.c this library was built from; manifest.json's build_id names the same. */
const char* kiln_build_id(void);
int kiln_num_inputs(void);
int kiln_num_outputs(void);
int kiln_num_symbols(void);
const char* kiln_input_name(int i);
const char* kiln_output_name(int i);
const char* kiln_symbol_name(int i);
/* 1 for an output kiln_run allocates (see kiln_allocated_output), 0 for one the caller allocates. */
int kiln_output_allocated(int i);
/* Frees what kiln_run allocated for an output. */
void kiln_free(void* data);

/* Create a model on the weights blob (e.g. an mmap of weights.bin): it must outlive the model. NULL on failure. */
kiln_model* kiln_create(const void* weights, size_t size);
/* Create a model that reads (and owns) a copy of the weights file at `path`. NULL on failure. */
kiln_model* kiln_create_from_file(const char* path);
void kiln_destroy(kiln_model* m);
/* Threads for each kiln_run on this model; 0 restores OpenMP's default. */
void kiln_set_num_threads(kiln_model* m, int num_threads);
/* The team size of the model's latest kiln_run (1: it ran on the calling thread alone). A run measures the CPUs its
 * team had; while other processes keep them busy, runs use as many threads as found CPUs, and one tries the full
 * team again after 0.25 s (doubling while the machine stays busy, up to 4 s). 0 before the first run. */
int kiln_last_run_threads(const kiln_model* m);

/* Profiling: with it on, kiln_run adds each kernel's wall time (as seen by OpenMP thread 0) to a per-model
 * total; turning it on or off clears the totals. Meant for one caller at a time (concurrent runs race on them). */
int kiln_num_kernels(void);
const char* kiln_kernel_name(int i);
void kiln_set_profiling(kiln_model* m, int on);
double kiln_kernel_seconds(const kiln_model* m, int i);
int64_t kiln_profiled_runs(const kiln_model* m);

/* State: the buffers the program mutates (manifest.json's "state": names, dtypes, static shapes). kiln_create starts
 * them at their exported values; a successful kiln_run replaces them with their new values, a failed one leaves them.
 * kiln_state_data is the current values (contiguous): read or write them between runs, never during one. */
int kiln_num_states(void);
const char* kiln_state_name(int i);
size_t kiln_state_nbytes(int i);
void* kiln_state_data(kiln_model* m, int i);
void kiln_reset_state(kiln_model* m);

/* Run once. symbols: one value per kiln_symbol_name (the dynamic dims, bound from the input shapes);
 * inputs, outputs: contiguous row-major arrays in signature order (dtypes and shapes in manifest.json; a float16 or
 * bfloat16 element is its 2 bytes of IEEE binary16 or bfloat16 bits),
 * outputs allocated by the caller, but those kiln_output_allocated names (a kiln_allocated_output* each). Returns 0 on success, else nonzero and kiln_error(m) says why.
 * kiln_run does not validate shapes: the caller checks them against manifest.json (Python's
 * kiln.runtime.load does). */
int kiln_run(kiln_model* m, const int64_t* symbols, const void* const* inputs, void* const* outputs);
const char* kiln_error(const kiln_model* m);

/* Function pointer types, for dlsym. */
typedef int (*kiln_abi_version_fn)(void);
typedef const char* (*kiln_build_id_fn)(void);
typedef int (*kiln_count_fn)(void);
typedef const char* (*kiln_name_fn)(int i);
typedef int (*kiln_output_allocated_fn)(int i);
typedef void (*kiln_free_fn)(void* data);
typedef kiln_model* (*kiln_create_fn)(const void* weights, size_t size);
typedef kiln_model* (*kiln_create_from_file_fn)(const char* path);
typedef void (*kiln_destroy_fn)(kiln_model* m);
typedef void (*kiln_set_num_threads_fn)(kiln_model* m, int num_threads);
typedef int (*kiln_last_run_threads_fn)(const kiln_model* m);
typedef int (*kiln_run_fn)(kiln_model* m, const int64_t* symbols, const void* const* inputs, void* const* outputs);
typedef const char* (*kiln_error_fn)(const kiln_model* m);
typedef void* (*kiln_state_data_fn)(kiln_model* m, int i);
typedef void (*kiln_reset_state_fn)(kiln_model* m);

#ifdef __cplusplus
}
#endif

#endif /* KILN_H */
