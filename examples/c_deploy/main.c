/* Run a kiln package with no Python: dlopen model.so, load weights.bin, read inputs from .npy files, print outputs.
 *
 *     kiln compile kiln.models:mlp --target c -o mlp_pkg
 *     make && ./kiln_deploy mlp_pkg x=x.npy
 *
 * Built with -DKILN_STATIC_MODEL (and linked with a package's model.c, see `make sanitize`), it calls the linked
 * kiln_* functions directly instead of dlopen-ing model.so; it still reads manifest.json and weights.bin from
 * the package directory. Everything it allocates is freed before a successful exit, so LeakSanitizer stays quiet.
 *
 * Reads manifest.json (a small JSON reader below) for input/output dtypes, symbolic shapes and symbol ranges,
 * binds the symbols from the input shapes, checks every dim, allocates the outputs (but those whose size the run
 * reads from values, which kiln_run allocates: kiln_output_allocated) and calls kiln_run.
 * `--runs=N` runs it N times on the same inputs (a model that keeps state, such as a KV cache, carries it from run to
 * run) and prints the last run's outputs.
 * Prints, per output, a line `output NAME DTYPE [d0, d1, ...]` and then one value per line
 * (floats with enough digits to round-trip). Exit status: 0 ok, 1 usage, 2 a bad package or input, 3 run failure.
 */
#define _POSIX_C_SOURCE 200809L
#include <ctype.h>
#ifndef KILN_STATIC_MODEL
#include <dlfcn.h>
#endif
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln.h"

#define MAX_RANK 16
#define MAX_TENSORS 64
#define MAX_SYMBOLS 64

_Noreturn static void fail(int status, const char* fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    fprintf(stderr, "kiln_deploy: error: ");
    vfprintf(stderr, fmt, args);
    fprintf(stderr, "\n");
    va_end(args);
    exit(status);
}

static char* read_file(const char* path, size_t* size)
{
    FILE* f = fopen(path, "rb");
    if (!f) fail(2, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char* data = malloc((size_t)n + 1);
    if (!data || fread(data, 1, (size_t)n, f) != (size_t)n) fail(2, "cannot read %s", path);
    fclose(f);
    data[n] = 0;
    if (size) *size = (size_t)n;
    return data;
}

/* ---- a minimal JSON reader (objects, arrays, strings without \u escapes, numbers, literals) ---- */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;
typedef struct json {
    jtype type;
    double num;
    char* str;            /* J_STR value; for members of an object, `key` holds the name */
    char* key;
    struct json* child;   /* first element / member */
    struct json* next;
} json;

static const char* jp;

static void jskip(void) { while (isspace((unsigned char)*jp)) ++jp; }

static char* jstring(void)
{
    if (*jp != '"') fail(2, "manifest.json: expected a string");
    ++jp;
    size_t cap = 16, len = 0;
    char* out = malloc(cap);
    while (*jp && *jp != '"') {
        char c = *jp++;
        if (c == '\\') {
            c = *jp++;
            c = c == 'n' ? '\n' : c == 't' ? '\t' : c == 'r' ? '\r' : c == 'b' ? '\b' : c == 'f' ? '\f' : c;
            if (c == 'u') fail(2, "manifest.json: \\u escapes are not supported by this example");
        }
        if (len + 2 > cap) out = realloc(out, cap *= 2);
        out[len++] = c;
    }
    if (*jp != '"') fail(2, "manifest.json: unterminated string");
    ++jp;
    out[len] = 0;
    return out;
}

static json* jvalue(void)
{
    jskip();
    json* v = calloc(1, sizeof(json));
    if (*jp == '{' || *jp == '[') {
        char close = *jp == '{' ? '}' : ']';
        v->type = *jp == '{' ? J_OBJ : J_ARR;
        ++jp;
        json** tail = &v->child;
        jskip();
        while (*jp && *jp != close) {
            char* key = NULL;
            if (v->type == J_OBJ) {
                key = jstring();
                jskip();
                if (*jp++ != ':') fail(2, "manifest.json: expected ':'");
            }
            json* item = jvalue();
            item->key = key;
            *tail = item;
            tail = &item->next;
            jskip();
            if (*jp == ',') { ++jp; jskip(); }
        }
        if (*jp != close) fail(2, "manifest.json: unterminated %s", v->type == J_OBJ ? "object" : "array");
        ++jp;
    } else if (*jp == '"') {
        v->type = J_STR;
        v->str = jstring();
    } else if (!strncmp(jp, "null", 4)) { v->type = J_NULL; jp += 4; }
    else if (!strncmp(jp, "true", 4)) { v->type = J_BOOL; v->num = 1; jp += 4; }
    else if (!strncmp(jp, "false", 5)) { v->type = J_BOOL; jp += 5; }
    else {
        char* end;
        v->type = J_NUM;
        v->num = strtod(jp, &end);
        if (end == jp) fail(2, "manifest.json: unexpected character '%c'", *jp);
        jp = end;
    }
    return v;
}

static void jfree(json* v)
{
    while (v) {
        json* next = v->next;
        jfree(v->child);
        free(v->str);
        free(v->key);
        free(v);
        v = next;
    }
}

static json* jget(const json* obj, const char* key)
{
    for (json* m = obj ? obj->child : NULL; m; m = m->next)
        if (m->key && !strcmp(m->key, key)) return m;
    return NULL;
}

static const char* jget_str(const json* obj, const char* key)
{
    json* v = jget(obj, key);
    if (!v || v->type != J_STR) fail(2, "manifest.json: missing string \"%s\"", key);
    return v->str;
}

/* ---- symbolic dims: integers, symbol names, + - * // % ( ), floor(a/b), ceiling(a/b), Max, Min ---- */

typedef struct { int n; const char* names[MAX_SYMBOLS]; int64_t values[MAX_SYMBOLS]; int bound[MAX_SYMBOLS]; } symtab;

static const char* ep;
static const symtab* etab;
static int ediv_ceil; /* inside ceiling(...): '/' rounds up; elsewhere '/' rounds down */

static int64_t floordiv(int64_t a, int64_t b)
{
    if (b == 0) fail(2, "division by zero in a symbolic dim");
    int64_t q = a / b;
    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static int64_t eexpr(void);

static void eskip(void) { while (*ep == ' ') ++ep; }

static int64_t eatom(void)
{
    eskip();
    if (*ep == '-') { ++ep; return -eatom(); }
    if (*ep == '(') {
        ++ep;
        int64_t v = eexpr();
        eskip();
        if (*ep++ != ')') fail(2, "symbolic dim: expected ')'");
        return v;
    }
    if (isdigit((unsigned char)*ep)) return strtoll(ep, (char**)&ep, 10);
    if (isalpha((unsigned char)*ep) || *ep == '_') {
        const char* start = ep;
        while (isalnum((unsigned char)*ep) || *ep == '_') ++ep;
        size_t len = (size_t)(ep - start);
        eskip();
        if (*ep == '(') {
            ++ep;
            int saved = ediv_ceil;
            if (len == 5 && !strncmp(start, "floor", 5)) ediv_ceil = 0;
            if (len == 7 && !strncmp(start, "ceiling", 7)) ediv_ceil = 1;
            int64_t a = eexpr();
            eskip();
            if (*ep == ',') {
                ++ep;
                int64_t b = eexpr();
                eskip();
                if (len == 3 && !strncmp(start, "Max", 3)) a = a > b ? a : b;
                else if (len == 3 && !strncmp(start, "Min", 3)) a = a < b ? a : b;
                else if (len == 3 && !strncmp(start, "Mod", 3)) a = a - floordiv(a, b) * b;
                else fail(2, "symbolic dim: unsupported function %.*s", (int)len, start);
            } else if (len == 3 && !strncmp(start, "Abs", 3)) a = a < 0 ? -a : a;
            ediv_ceil = saved;
            if (*ep++ != ')') fail(2, "symbolic dim: expected ')'");
            return a;
        }
        for (int i = 0; i < etab->n; ++i)
            if (strlen(etab->names[i]) == len && !strncmp(etab->names[i], start, len)) {
                if (!etab->bound[i]) fail(2, "symbol %s is not bound by any input shape", etab->names[i]);
                return etab->values[i];
            }
        fail(2, "unknown symbol %.*s in a symbolic dim", (int)len, start);
    }
    fail(2, "cannot parse symbolic dim at '%s'", ep);
}

static int64_t eterm(void)
{
    int64_t v = eatom();
    for (;;) {
        eskip();
        if (ep[0] == '/' && ep[1] == '/') { ep += 2; v = floordiv(v, eatom()); }
        else if (*ep == '/') { ++ep; int64_t d = eatom(); v = ediv_ceil ? -floordiv(-v, d) : floordiv(v, d); }
        else if (*ep == '*') { ++ep; v *= eatom(); }
        else if (*ep == '%') { ++ep; int64_t d = eatom(); v -= floordiv(v, d) * d; }
        else return v;
    }
}

static int64_t eexpr(void)
{
    int64_t v = eterm();
    for (;;) {
        eskip();
        if (*ep == '+') { ++ep; v += eterm(); }
        else if (*ep == '-') { ++ep; v -= eterm(); }
        else return v;
    }
}

static int64_t eval_dim(const char* text, const symtab* tab)
{
    ep = text; etab = tab; ediv_ceil = 0;
    int64_t v = eexpr();
    eskip();
    if (*ep) fail(2, "cannot parse symbolic dim '%s'", text);
    return v;
}

/* ---- dtypes and .npy files ---- */

typedef struct { const char* name; const char* descr; size_t size; } dtype_info;
static const dtype_info DTYPES[] = {
    {"float32", "<f4", 4}, {"float64", "<f8", 8}, {"float16", "<f2", 2}, {"int64", "<i8", 8}, {"int32", "<i4", 4},
    {"int16", "<i2", 2}, {"int8", "|i1", 1}, {"uint8", "|u1", 1}, {"bool", "|b1", 1},
};

static const dtype_info* dtype_of(const char* name)
{
    for (size_t i = 0; i < sizeof DTYPES / sizeof DTYPES[0]; ++i)
        if (!strcmp(DTYPES[i].name, name)) return &DTYPES[i];
    fail(2, "unsupported dtype %s", name);
}

typedef struct { int rank; int64_t shape[MAX_RANK]; char descr[8]; void* data; size_t nbytes; } npy;

static npy read_npy(const char* path)
{
    size_t size;
    char* raw = read_file(path, &size);
    npy out = {0};
    if (size < 10 || memcmp(raw, "\x93NUMPY", 6)) fail(2, "%s is not an .npy file", path);
    size_t header_len, start;
    if (raw[6] == 1) { header_len = (unsigned char)raw[8] | (size_t)(unsigned char)raw[9] << 8; start = 10; }
    else {
        header_len = (unsigned char)raw[8] | (size_t)(unsigned char)raw[9] << 8 |
                     (size_t)(unsigned char)raw[10] << 16 | (size_t)(unsigned char)raw[11] << 24;
        start = 12;
    }
    if (start + header_len > size) fail(2, "%s: truncated header", path);
    char* header = strndup(raw + start, header_len);
    char* d = strstr(header, "'descr':");
    char* f = strstr(header, "'fortran_order':");
    char* s = strstr(header, "'shape':");
    if (!d || !f || !s) fail(2, "%s: malformed header", path);
    if (sscanf(d + 8, " '%7[^']'", out.descr) != 1) fail(2, "%s: malformed descr", path);
    if (!strncmp(f + 16, " True", 5)) fail(2, "%s: Fortran-order arrays are not supported", path);
    char* p = strchr(s, '(');
    if (!p) fail(2, "%s: malformed shape", path);
    ++p;
    while (*p && *p != ')') {
        while (*p == ' ' || *p == ',') ++p;
        if (*p == ')') break;
        if (out.rank == MAX_RANK) fail(2, "%s: rank above %d", path, MAX_RANK);
        out.shape[out.rank++] = strtoll(p, &p, 10);
    }
    out.nbytes = size - start - header_len;
    out.data = malloc(out.nbytes ? out.nbytes : 1);
    memcpy(out.data, raw + start + header_len, out.nbytes);
    free(header);
    free(raw);
    return out;
}

static void print_value(const char* dtype, const void* data, int64_t i)
{
    if (!strcmp(dtype, "float32")) printf("%.9g\n", (double)((const float*)data)[i]);
    else if (!strcmp(dtype, "float64")) printf("%.17g\n", ((const double*)data)[i]);
    else if (!strcmp(dtype, "int64")) printf("%" PRId64 "\n", ((const int64_t*)data)[i]);
    else if (!strcmp(dtype, "int32")) printf("%" PRId32 "\n", ((const int32_t*)data)[i]);
    else if (!strcmp(dtype, "bool") || !strcmp(dtype, "uint8")) printf("%d\n", ((const uint8_t*)data)[i]);
    else if (!strcmp(dtype, "int8")) printf("%d\n", ((const int8_t*)data)[i]);
    else if (!strcmp(dtype, "int16")) printf("%d\n", ((const int16_t*)data)[i]);
    else printf("?\n");
}

#ifndef KILN_STATIC_MODEL
static void* need(void* lib, const char* name)
{
    void* fn = dlsym(lib, name);
    if (!fn) fail(2, "model.so has no symbol %s", name);
    return fn;
}
#endif

int main(int argc, char** argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s PACKAGE_DIR [NAME=FILE.npy ...] [--runs=N]\n", argv[0]);
        return 1;
    }
    const char* pkg = argv[1];
    long runs = 1;
    for (int a = 2; a < argc; ++a)
        if (!strncmp(argv[a], "--runs=", 7)) {
            char* end = NULL;
            runs = strtol(argv[a] + 7, &end, 10);
            if (!end || *end || runs < 1) fail(1, "--runs takes a positive count, got '%s'", argv[a] + 7);
        }
    char path[4096];
    snprintf(path, sizeof path, "%s/manifest.json", pkg);
    char* text = read_file(path, NULL);
    jp = text;
    json* manifest = jvalue();
    json* abi = jget(manifest, "abi_version");
    if (!abi || (int)abi->num != KILN_ABI_VERSION)
        fail(2, "%s has ABI version %d, this program reads %d", pkg, abi ? (int)abi->num : -1, KILN_ABI_VERSION);

#ifdef KILN_STATIC_MODEL
    /* the model is linked in: call its kiln_* functions directly */
    kiln_abi_version_fn abi_version = kiln_abi_version;
    kiln_build_id_fn build_id = kiln_build_id;
    kiln_create_from_file_fn create_from_file = kiln_create_from_file;
    kiln_run_fn run = kiln_run;
    kiln_error_fn error = kiln_error;
    kiln_destroy_fn destroy = kiln_destroy;
    kiln_count_fn num_inputs = kiln_num_inputs;
    kiln_count_fn num_outputs = kiln_num_outputs;
    kiln_output_allocated_fn output_allocated = kiln_output_allocated;
    kiln_free_fn free_output = kiln_free;
    if (abi_version() != KILN_ABI_VERSION) fail(2, "the linked model has ABI version %d", abi_version());
#else
    /* load the library; check its ABI matches the manifest */
    snprintf(path, sizeof path, "%s/%s", pkg, jget_str(manifest, "library"));
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) fail(2, "dlopen %s: %s", path, dlerror());
    kiln_abi_version_fn abi_version = (kiln_abi_version_fn)need(lib, "kiln_abi_version");
    kiln_build_id_fn build_id = (kiln_build_id_fn)need(lib, "kiln_build_id");
    kiln_create_from_file_fn create_from_file = (kiln_create_from_file_fn)need(lib, "kiln_create_from_file");
    kiln_run_fn run = (kiln_run_fn)need(lib, "kiln_run");
    kiln_error_fn error = (kiln_error_fn)need(lib, "kiln_error");
    kiln_destroy_fn destroy = (kiln_destroy_fn)need(lib, "kiln_destroy");
    kiln_count_fn num_inputs = (kiln_count_fn)need(lib, "kiln_num_inputs");
    kiln_count_fn num_outputs = (kiln_count_fn)need(lib, "kiln_num_outputs");
    kiln_output_allocated_fn output_allocated = (kiln_output_allocated_fn)need(lib, "kiln_output_allocated");
    kiln_free_fn free_output = (kiln_free_fn)need(lib, "kiln_free");
    if (abi_version() != KILN_ABI_VERSION) fail(2, "model.so has ABI version %d", abi_version());
#endif
    if (strcmp(build_id(), jget_str(manifest, "build_id")))
        fail(2, "%s: the model code was not built from this package's model.c (build ids differ)", pkg);

    /* symbols, in kiln_run's order, with their ranges */
    symtab tab = {0};
    int64_t lower[MAX_SYMBOLS], upper[MAX_SYMBOLS];
    for (json* s = jget(manifest, "symbols")->child; s; s = s->next) {
        if (tab.n == MAX_SYMBOLS) fail(2, "too many symbols");
        json* lo = jget(s, "lower"), * hi = jget(s, "upper");
        tab.names[tab.n] = jget_str(s, "name");
        lower[tab.n] = lo && lo->type == J_NUM ? (int64_t)lo->num : 0;
        upper[tab.n] = hi && hi->type == J_NUM ? (int64_t)hi->num : INT64_MAX;
        ++tab.n;
    }

    /* inputs: read each NAME=FILE.npy, check dtype and rank, bind symbols from plain-symbol dims */
    json* inputs = jget(manifest, "inputs");
    int nin = 0;
    json* in_spec[MAX_TENSORS];
    for (json* i = inputs->child; i; i = i->next) {
        if (nin == MAX_TENSORS) fail(2, "too many inputs");
        in_spec[nin++] = i;
    }
    if (nin != num_inputs()) fail(2, "manifest.json and model.so disagree on the number of inputs");
    npy arrays[MAX_TENSORS];
    const void* in_ptrs[MAX_TENSORS];
    for (int k = 0; k < nin; ++k) {
        const char* name = jget_str(in_spec[k], "name");
        const char* file = NULL;
        for (int a = 2; a < argc; ++a) {
            size_t len = strlen(name);
            if (!strncmp(argv[a], name, len) && argv[a][len] == '=') file = argv[a] + len + 1;
        }
        if (!file) fail(1, "no input for '%s' (give %s=FILE.npy)", name, name);
        arrays[k] = read_npy(file);
        const char* dtype = jget_str(in_spec[k], "dtype");
        if (strcmp(arrays[k].descr, dtype_of(dtype)->descr))
            fail(2, "input '%s' must have dtype %s (%s), %s has %s", name, dtype, dtype_of(dtype)->descr, file,
                 arrays[k].descr);
        json* shape = jget(in_spec[k], "shape");
        int rank = 0;
        for (json* d = shape->child; d; d = d->next, ++rank) {
            if (rank >= arrays[k].rank) continue;
            for (int s = 0; s < tab.n; ++s)
                if (!strcmp(d->str, tab.names[s])) {
                    int64_t v = arrays[k].shape[rank];
                    if (tab.bound[s] && tab.values[s] != v)
                        fail(2, "input '%s' dim %d is %" PRId64 " but %s = %" PRId64, name, rank, v, tab.names[s],
                             tab.values[s]);
                    tab.values[s] = v;
                    tab.bound[s] = 1;
                }
        }
        if (rank != arrays[k].rank) fail(2, "input '%s' must have rank %d, %s has rank %d", name, rank, file,
                                         arrays[k].rank);
        in_ptrs[k] = arrays[k].data;
    }
    for (int s = 0; s < tab.n; ++s) {
        if (!tab.bound[s]) fail(2, "symbol %s is not a dim of any input", tab.names[s]);
        if (tab.values[s] < lower[s] || tab.values[s] > upper[s])
            fail(2, "%s = %" PRId64 " is outside its range [%" PRId64 ", %" PRId64 "]", tab.names[s], tab.values[s],
                 lower[s], upper[s]);
    }
    /* every input dim (static, or an expression of the symbols) must match, and the data must fill it */
    for (int k = 0; k < nin; ++k) {
        int64_t numel = 1;
        int rank = 0;
        for (json* d = jget(in_spec[k], "shape")->child; d; d = d->next, ++rank) {
            int64_t want = eval_dim(d->str, &tab);
            if (arrays[k].shape[rank] != want)
                fail(2, "input '%s' dim %d must be %s = %" PRId64 ", got %" PRId64, jget_str(in_spec[k], "name"),
                     rank, d->str, want, arrays[k].shape[rank]);
            numel *= want;
        }
        if ((size_t)numel * dtype_of(jget_str(in_spec[k], "dtype"))->size != arrays[k].nbytes)
            fail(2, "input '%s': the .npy data has the wrong size", jget_str(in_spec[k], "name"));
    }

    /* outputs: shapes from the manifest, evaluated at the bound symbols; an output whose size the run reads from
       values ("data_dependent") is allocated by kiln_run, which says its shape */
    int nout = 0;
    json* out_spec[MAX_TENSORS];
    int64_t out_numel[MAX_TENSORS];
    void* out_ptrs[MAX_TENSORS];
    kiln_allocated_output allocated[MAX_TENSORS];
    for (json* o = jget(manifest, "outputs")->child; o; o = o->next) {
        if (nout == MAX_TENSORS) fail(2, "too many outputs");
        out_spec[nout] = o;
        if (output_allocated(nout)) {
            out_ptrs[nout] = &allocated[nout];
            ++nout;
            continue;
        }
        int64_t numel = 1;
        for (json* d = jget(o, "shape")->child; d; d = d->next) numel *= eval_dim(d->str, &tab);
        out_numel[nout] = numel;
        out_ptrs[nout] = calloc((size_t)(numel ? numel : 1), dtype_of(jget_str(o, "dtype"))->size);
        ++nout;
    }
    if (nout != num_outputs()) fail(2, "manifest.json and model.so disagree on the number of outputs");

    snprintf(path, sizeof path, "%s/%s", pkg, jget_str(manifest, "weights_file"));
    kiln_model* model = create_from_file(path);
    if (!model) fail(2, "kiln_create_from_file(%s) failed", path);
    for (long r = 0; r < runs; ++r) {
        if (r > 0)  /* the outputs kiln_run allocated in the run before: only the last run's are printed */
            for (int k = 0; k < nout; ++k) if (output_allocated(k)) free_output(allocated[k].data);
        if (run(model, tab.values, in_ptrs, out_ptrs) != 0) fail(3, "kiln_run failed: %s", error(model));
    }

    for (int k = 0; k < nout; ++k) {
        const char* dtype = jget_str(out_spec[k], "dtype");
        const int mine = output_allocated(k);
        const void* data = mine ? allocated[k].data : out_ptrs[k];
        printf("output %s %s [", jget_str(out_spec[k], "name"), dtype);
        int first = 1, rank = 0;
        out_numel[k] = 1;
        for (json* d = jget(out_spec[k], "shape")->child; d; d = d->next, first = 0, ++rank) {
            int64_t size = mine ? allocated[k].shape[rank] : eval_dim(d->str, &tab);
            out_numel[k] *= size;
            printf("%s%" PRId64, first ? "" : ", ", size);
        }
        printf("]\n");
        for (int64_t i = 0; i < out_numel[k]; ++i) print_value(dtype, data, i);
    }
    destroy(model);
    for (int k = 0; k < nout; ++k) {
        if (output_allocated(k)) free_output(allocated[k].data);
        else free(out_ptrs[k]);
    }
    for (int k = 0; k < nin; ++k) free(arrays[k].data);
    jfree(manifest);
    free(text);
    /* No dlclose: unloading a library whose OpenMP worker threads are still parked can crash at exit. */
    return 0;
}
