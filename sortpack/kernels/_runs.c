/* The run copy of sortpack.kernels.runs, compiled into the same _ckernels library (a source file of
 * its own, as _media.c: new symbols only, so the other kernels' file and its ABI number stay as
 * they are; a stale library without these symbols fails to load as a whole and the numpy
 * fallbacks run).
 *
 * sp_copy_runs copies runs of integers scattered over a few buffers (an export's samples in plan
 * order, gathered from a mapped Megatron .bin or a plan's stored Arrow column) one after another
 * into one destination, converting each to the destination's integer type on the way, and
 * measures the values' range in the same pass. The runs of a sorted plan lie at random places of
 * the source: the copy is bound by the latency of each run's first cache lines, so the runs a few
 * ahead are prefetched while one is copied.
 *
 * sp_write_runs does the same through a small buffer that it writes to a file whenever it is full
 * (pwrite): the buffer stays in the core's cache, so the tokens cross memory twice, as a plain
 * write of them in order does (read once, written once into the page cache).
 *
 * Plain C arrays and int64 counts, no Python objects (called through ctypes, the GIL released).
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#if !defined(_WIN32)
#include <unistd.h>
#endif

#if defined(_WIN32)
#define SP_RUNS_API __declspec(dllexport)
#else
#define SP_RUNS_API __attribute__((visibility("default")))
#endif

/* A prefetch has no side effect a compiler sees: a function doing nothing else is "const", and
 * its calls are deleted. The helpers that prefetch are therefore inlined before that analysis. */
#if defined(__GNUC__) || defined(__clang__)
#define SP_PREFETCH(p) __builtin_prefetch(p)
#define SP_INLINE static inline __attribute__((always_inline))
#else
#define SP_PREFETCH(p) ((void)(p))
#define SP_INLINE static inline
#endif

/* The conversion loops also built for AVX2 (16-bit and 32-bit min, max and narrowing in one
 * instruction each; SSE2, the baseline, has none of them), picked at load time where the CPU has
 * it: the library stays portable, as the build flags require. */
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define SP_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SP_CLONES
#endif

enum { PREFETCH_AHEAD = 16, LINE = 64 };

/* The range of the values read so far: low and high as int64, and whether a uint64 value above
 * INT64_MAX was seen (it fits no Megatron dtype; the caller says so). */
typedef struct {
    int64_t low, high, over;
} range_t;

static void widen_signed(range_t *r, int64_t lo, int64_t hi) {
    if (lo < r->low) r->low = lo;
    if (hi > r->high) r->high = hi;
}

static void widen_unsigned(range_t *r, uint64_t lo, uint64_t hi) {
    if (hi > (uint64_t)INT64_MAX) {
        r->over = 1;
        hi = (uint64_t)INT64_MAX;
        if (lo > hi) lo = hi;
    }
    widen_signed(r, (int64_t)lo, (int64_t)hi);
}

typedef void (*run_fn)(const void *src, int64_t n, void *dst, range_t *r);

/* One run of n values of type S converted to D (as a C cast: modulo 2^bits, as numpy's unsafe
 * cast), its range measured; dst NULL measures only. */
#define SP_RUN(S, D, WIDEN)                                                               \
    SP_CLONES static void run_##S##_##D(const void *src, int64_t n, void *dst, range_t *r) { \
        const S *s = (const S *)src;                                                      \
        S lo = s[0], hi = s[0];                                                           \
        if (dst != NULL) {                                                                \
            D *d = (D *)dst;                                                              \
            for (int64_t j = 0; j < n; j++) {                                             \
                S v = s[j];                                                               \
                lo = v < lo ? v : lo;                                                     \
                hi = v > hi ? v : hi;                                                     \
                d[j] = (D)v;                                                              \
            }                                                                             \
        } else {                                                                          \
            for (int64_t j = 0; j < n; j++) {                                             \
                S v = s[j];                                                               \
                lo = v < lo ? v : lo;                                                     \
                hi = v > hi ? v : hi;                                                     \
            }                                                                             \
        }                                                                                 \
        WIDEN(r, lo, hi);                                                                 \
    }

#define SP_RUNS_TO(D)                        \
    SP_RUN(uint8_t, D, widen_unsigned)       \
    SP_RUN(uint16_t, D, widen_unsigned)      \
    SP_RUN(uint32_t, D, widen_unsigned)      \
    SP_RUN(uint64_t, D, widen_unsigned)      \
    SP_RUN(int8_t, D, widen_signed)          \
    SP_RUN(int16_t, D, widen_signed)         \
    SP_RUN(int32_t, D, widen_signed)         \
    SP_RUN(int64_t, D, widen_signed)

SP_RUNS_TO(uint8_t)
SP_RUNS_TO(uint16_t)
SP_RUNS_TO(uint32_t)
SP_RUNS_TO(uint64_t)
SP_RUNS_TO(int8_t)
SP_RUNS_TO(int16_t)
SP_RUNS_TO(int32_t)
SP_RUNS_TO(int64_t)

#define SP_ROW(D)                                                                          \
    {run_uint8_t_##D, run_uint16_t_##D, run_uint32_t_##D, run_uint64_t_##D, run_int8_t_##D, \
     run_int16_t_##D, run_int32_t_##D, run_int64_t_##D}

/* RUNS[destination][source], in the order of type_slot */
static const run_fn RUNS[8][8] = {SP_ROW(uint8_t), SP_ROW(uint16_t), SP_ROW(uint32_t), SP_ROW(uint64_t),
                                  SP_ROW(int8_t),  SP_ROW(int16_t),  SP_ROW(int32_t),  SP_ROW(int64_t)};

/* A type code (the item size, negative for a signed type: 1, 2, 4, 8, -1, -2, -4, -8) as its slot
 * in RUNS, or -1. */
static int type_slot(int64_t code) {
    switch (code) {
        case 1: return 0;
        case 2: return 1;
        case 4: return 2;
        case 8: return 3;
        case -1: return 4;
        case -2: return 5;
        case -4: return 6;
        case -8: return 7;
        default: return -1;
    }
}

/* The first cache lines of a run (up to 8: the hardware prefetcher follows a longer one), written
 * out: a loop whose only effect is prefetching is deleted as well. */
SP_INLINE void prefetch_run(const uint8_t *p, int64_t bytes) {
    SP_PREFETCH(p);
    if (bytes > 1 * LINE) SP_PREFETCH(p + 1 * LINE);
    if (bytes > 2 * LINE) SP_PREFETCH(p + 2 * LINE);
    if (bytes > 3 * LINE) SP_PREFETCH(p + 3 * LINE);
    if (bytes > 4 * LINE) SP_PREFETCH(p + 4 * LINE);
    if (bytes > 5 * LINE) SP_PREFETCH(p + 5 * LINE);
    if (bytes > 6 * LINE) SP_PREFETCH(p + 6 * LINE);
    if (bytes > 7 * LINE) SP_PREFETCH(p + 7 * LINE);
}

/* The runs to copy: run i is counts[i] values at byte starts[i] of buffer bases[piece[i]] (piece
 * NULL: buffer 0), whose type is codes[piece[i]]. */
typedef struct {
    const uint64_t *bases;
    const int64_t *codes;
    int64_t nbases;
    const int64_t *piece;
    const int64_t *starts;
    const int64_t *counts;
    int64_t m;
} runs_t;

static int64_t code_size(int64_t code) { return code < 0 ? -code : code; }

/* 0 when every piece and type code is valid, else -1 (a piece) or -2 (a code). */
static int64_t check_runs(const runs_t *rs, int64_t dst_code) {
    if (type_slot(dst_code) < 0) return -2;
    for (int64_t k = 0; k < rs->nbases; k++)
        if (type_slot(rs->codes[k]) < 0) return -2;
    if (rs->piece != NULL)
        for (int64_t i = 0; i < rs->m; i++)
            if (rs->piece[i] < 0 || rs->piece[i] >= rs->nbases) return -1;
    if (rs->piece == NULL && rs->m > 0 && rs->nbases < 1) return -1;
    return 0;
}

SP_INLINE void prefetch_ahead(const runs_t *rs, int64_t i) {
    int64_t a = i + PREFETCH_AHEAD;
    if (a >= rs->m) return;
    int64_t k = rs->piece == NULL ? 0 : rs->piece[a];
    prefetch_run((const uint8_t *)(uintptr_t)rs->bases[k] + rs->starts[a], rs->counts[a] * code_size(rs->codes[k]));
}

/* n values of run i from its value j into dst (NULL: measured only), as type dst_code; measured
 * into r unless r is NULL (then a run of dst's own type is copied as bytes). */
static void copy_part(const runs_t *rs, int64_t i, int64_t j, int64_t n, void *dst, int64_t dst_code, range_t *r) {
    int64_t k = rs->piece == NULL ? 0 : rs->piece[i];
    int64_t code = rs->codes[k];
    const uint8_t *src = (const uint8_t *)(uintptr_t)rs->bases[k] + rs->starts[i] + j * code_size(code);
    range_t ignored = {INT64_MAX, INT64_MIN, 0};
    if (r == NULL && code == dst_code && dst != NULL)
        memcpy(dst, src, (size_t)(n * code_size(code)));
    else
        RUNS[type_slot(dst_code)][type_slot(code)](src, n, dst, r == NULL ? &ignored : r);
}

static void load_range(range_t *r, const int64_t *range) {
    r->low = range == NULL ? INT64_MAX : range[0];
    r->high = range == NULL ? INT64_MIN : range[1];
    r->over = range == NULL ? 0 : range[2];
}

static void store_range(const range_t *r, int64_t *range) {
    if (range == NULL) return;
    range[0] = r->low;
    range[1] = r->high;
    range[2] = r->over;
}

/* Copies runs [0, m) (runs_t says where they lie) one after another into dst, as values of type
 * dst_code. dst NULL: nothing is copied. range (int64[3], may be NULL when dst is given): its low,
 * high and over are widened by the values read; NULL: runs of dst's type are copied as bytes.
 * Returns the values copied, -1 for a piece out of [0, nbases), -2 for an unknown type code. */
SP_RUNS_API int64_t sp_copy_runs(const uint64_t *bases, const int64_t *codes, int64_t nbases, const int64_t *piece,
                                 const int64_t *starts, const int64_t *counts, int64_t m, void *dst,
                                 int64_t dst_code, int64_t *range) {
    runs_t rs = {bases, codes, nbases, piece, starts, counts, m};
    int64_t bad = check_runs(&rs, dst_code);
    if (bad < 0) return bad;
    range_t r;
    load_range(&r, range);
    int64_t dsize = code_size(dst_code), done = 0;
    for (int64_t i = 0; i < m; i++) {
        prefetch_ahead(&rs, i);
        if (counts[i] <= 0) continue;
        copy_part(&rs, i, 0, counts[i], dst == NULL ? NULL : (uint8_t *)dst + done * dsize, dst_code,
                  range == NULL ? NULL : &r);
        done += counts[i];
    }
    store_range(&r, range);
    return done;
}

#if !defined(_WIN32)
/* Writes n bytes at offset of fd, whatever pwrite writes at once; 0, or -errno. */
static int64_t write_all(int fd, const uint8_t *p, int64_t n, int64_t offset) {
    while (n > 0) {
        ssize_t w = pwrite(fd, p, (size_t)n, (off_t)offset);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -(int64_t)errno;
        }
        if (w == 0) return -(int64_t)EIO;
        p += w;
        n -= w;
        offset += w;
    }
    return 0;
}

/* As sp_copy_runs, but into buf (cap bytes, at least one value of dst_code), written to file fd at
 * byte offset and on each time buf is full (the first time at the next multiple of cap in the file):
 * the runs' values land one after another from offset.
 * Returns the values written, -1 (a piece), -2 (a code), -3 (buf holds no value), or
 * -1000 - errno when a write failed. */
SP_RUNS_API int64_t sp_write_runs(const uint64_t *bases, const int64_t *codes, int64_t nbases, const int64_t *piece,
                                  const int64_t *starts, const int64_t *counts, int64_t m, int64_t fd,
                                  int64_t offset, uint8_t *buf, int64_t cap, int64_t dst_code, int64_t *range) {
    runs_t rs = {bases, codes, nbases, piece, starts, counts, m};
    int64_t bad = check_runs(&rs, dst_code);
    if (bad < 0) return bad;
    int64_t dsize = code_size(dst_code), held = 0, done = 0;
    cap -= cap % dsize;
    if (cap < dsize) return -3;
    /* the first write ends where the file holds a multiple of cap bytes, and every later one is
     * cap bytes there: the page cache takes aligned writes into large folios, and unaligned
     * ones page by page */
    int64_t room = offset % cap == 0 || (cap - offset % cap) % dsize ? cap / dsize : (cap - offset % cap) / dsize;
    int dslot = type_slot(dst_code);
    range_t r, ignored = {INT64_MAX, INT64_MIN, 0};
    load_range(&r, range);
    for (int64_t i = 0; i < m; i++) {
        prefetch_ahead(&rs, i);
        int64_t k = piece == NULL ? 0 : piece[i];
        const uint8_t *src = (const uint8_t *)(uintptr_t)bases[k] + starts[i];
        int64_t ssize = code_size(codes[k]);
        for (int64_t j = 0; j < counts[i];) {
            int64_t n = counts[i] - j < room - held ? counts[i] - j : room - held;
            if (range == NULL && codes[k] == dst_code)
                memcpy(buf + held * dsize, src + j * ssize, (size_t)(n * dsize));
            else
                RUNS[dslot][type_slot(codes[k])](src + j * ssize, n, buf + held * dsize, range == NULL ? &ignored : &r);
            held += n;
            j += n;
            if (held == room) {
                int64_t err = write_all((int)fd, buf, held * dsize, offset + done * dsize);
                if (err < 0) return -1000 + err;
                done += held;
                held = 0;
                room = cap / dsize;
            }
        }
    }
    if (held > 0) {
        int64_t err = write_all((int)fd, buf, held * dsize, offset + done * dsize);
        if (err < 0) return -1000 + err;
        done += held;
    }
    store_range(&r, range);
    return done;
}
#else
/* no pwrite: the caller writes through Python (the numpy fallback's path) */
SP_RUNS_API int64_t sp_write_runs(const uint64_t *bases, const int64_t *codes, int64_t nbases, const int64_t *piece,
                                  const int64_t *starts, const int64_t *counts, int64_t m, int64_t fd,
                                  int64_t offset, uint8_t *buf, int64_t cap, int64_t dst_code, int64_t *range) {
    return -4;
}
#endif
