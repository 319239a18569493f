/* Compiled numeric kernels for sortpack.kernels.
 *
 * This is built as a Python extension only so that setuptools compiles and installs it
 * next to the package; the module itself is empty and the functions below are called
 * through ctypes (see sortpack/kernels/__init__.py). Every function takes plain C arrays
 * and int64 counts, never touches Python objects and so runs with the GIL released.
 *
 * Floating-point code must reproduce the Python reference bit for bit: build without
 * -ffast-math and with -ffp-contract=off (an FMA would round differently).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define SP_API __declspec(dllexport)
#else
#define SP_API __attribute__((visibility("default")))
#endif

/* Bumped whenever a signature or a semantic changes, so that a stale in-place build is
 * detected by the Python side and ignored instead of being called with the wrong ABI. */
#define SP_ABI_VERSION 20

SP_API int64_t sp_abi_version(void) { return SP_ABI_VERSION; }

/* ------------------------------------------------------------------------------------ */
/* checked integer arithmetic: an overflowing cost can never fit an int64 budget         */

#if defined(__GNUC__) || defined(__clang__)
static inline int mul_ovf(int64_t a, int64_t b, int64_t *r) { return __builtin_mul_overflow(a, b, r); }
static inline int add_ovf(int64_t a, int64_t b, int64_t *r) { return __builtin_add_overflow(a, b, r); }
#define SP_LIKELY(x) __builtin_expect(!!(x), 1)
#define SP_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
/* operands here are non-negative (sizes, counts) */
static inline int mul_ovf(int64_t a, int64_t b, int64_t *r) {
    if (a != 0 && b > INT64_MAX / a) return 1;
    *r = a * b;
    return 0;
}
static inline int add_ovf(int64_t a, int64_t b, int64_t *r) {
    if (b > INT64_MAX - a) return 1;
    *r = a + b;
    return 0;
}
#define SP_LIKELY(x) (x)
#define SP_UNLIKELY(x) (x)
#endif

/* (double)(v*v) with Python's semantics: Python squares exactly (big int) and rounds once
 * to the nearest double. An int64 product is exact up to 3037000499, and the conversion
 * rounds to nearest-even like PyLong_AsDouble; beyond that square in 128 bits. */
static inline double sq_to_double(int64_t v) {
    uint64_t a = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    if (a <= 3037000499u) return (double)(int64_t)(a * a);
#if defined(__SIZEOF_INT128__)
    return (double)((unsigned __int128)a * a);
#else
    return (double)a * (double)a;
#endif
}

/* ------------------------------------------------------------------------------------ */
/* greedy packing                                                                          */

/* A micro-batch's cost, as kernels/budget.py's KernelCost.code gives it (the one table of the
 * budgets, read by the numpy fallback too): bit 0, its slots at the padded length (c * unit(L));
 * else its samples one by one (sum of unit(s)); bit 1, unit(s) = s + s*s/Q (else s). */
enum { C_PER_SLOT = 1, C_QUADRATIC = 2 };

typedef struct {
    int cost;             /* C_PER_SLOT | C_QUADRATIC */
    int64_t lim_i;        /* floor(max_tokens): int cost <= max_tokens  <=>  cost <= lim_i */
    double lim_d;         /* largest double <= max_tokens, same for float costs */
    int64_t max_samples;  /* <= 0: unlimited */
    int64_t multiple;     /* batch_multiple, >= 1 */
    double q;             /* quadratic_scale */
    int64_t pad;          /* pad_multiple (> 1) or 0 */
    const int64_t *shapes; /* strictly increasing "record" shapes, or NULL */
    int64_t nshapes;
    int64_t ncaps;         /* caps beside the budget (--size2/--max-size2, --cap), each a per-sample measure */
    const int64_t *caps;   /* ncaps x n: caps[k * n + i] is sample i's measure k */
    int64_t ncap_stride;   /* n, the stride of caps */
    const int64_t *lims;   /* the sum of measure k in a micro-batch stays <= lims[k] */
} gp_params;

#define SP_MAX_CAPS 16 /* caps beside the budget; PackOptions refuses more */

typedef struct {
    int64_t cnt, mx, rmx, sum;
    double fs; /* running float sum of the quadratic budget, added left to right */
    int64_t sums[SP_MAX_CAPS]; /* running sum of each cap's measure */
} gp_state;

static inline void gp_reset(gp_state *st) { memset(st, 0, sizeof(*st)); }

static inline int64_t round_len(const gp_params *p, int64_t x) {
    if (p->shapes) {
        /* first record >= x; a length above every shape stays as is, like the reference */
        int64_t lo = 0, hi = p->nshapes;
        while (lo < hi) {
            int64_t mid = lo + (hi - lo) / 2;
            if (p->shapes[mid] < x) lo = mid + 1; else hi = mid;
        }
        return lo < p->nshapes ? p->shapes[lo] : x;
    }
    if (p->pad > 1) return (x / p->pad + (x % p->pad != 0)) * p->pad;
    return x;
}

static inline int rounding(const gp_params *p) { return p->shapes != NULL || p->pad > 1; }

static inline double qterm(const gp_params *p, int64_t s) {
    return (double)s + sq_to_double(s) / p->q;
}

/* Would the current micro-batch plus a sample of size s (rounded r) whose cap measures are vals[0..ncaps)
 * still fit? Monotone: a sample no larger in size and in every measure fits whenever this one does. */
static inline int gp_fits(const gp_params *p, const gp_state *st, int64_t s, int64_t r, const int64_t *vals) {
    int64_t c1 = st->cnt + 1;
    if (p->max_samples > 0 && c1 > p->max_samples) return 0;
    for (int64_t k = 0; k < p->ncaps; k++) {
        int64_t t2;
        if (add_ovf(st->sums[k], vals[k], &t2) || t2 > p->lims[k]) return 0;
    }
    if ((p->cost & C_PER_SLOT) || rounding(p)) {
        int64_t L = rounding(p) ? (s > st->mx ? r : st->rmx) : (s > st->mx ? s : st->mx);
        if (p->cost & C_QUADRATIC) {
            double cost = (double)c1 * ((double)L + sq_to_double(L) / p->q);
            return cost <= p->lim_d;
        }
        int64_t cost;
        if (mul_ovf(c1, L, &cost)) return 0;
        return cost <= p->lim_i;
    }
    if (!(p->cost & C_QUADRATIC)) {
        int64_t t;
        if (add_ovf(st->sum, s, &t)) return 0;
        return t <= p->lim_i;
    }
    return st->fs + qterm(p, s) <= p->lim_d;
}

static inline void gp_add(const gp_params *p, gp_state *st, int64_t s, int64_t r, const int64_t *vals) {
    if (st->cnt == 0 || s > st->mx) {
        st->mx = s;
        st->rmx = r;
    }
    st->sum += s;
    for (int64_t k = 0; k < p->ncaps; k++) st->sums[k] += vals[k];
    if ((p->cost & C_QUADRATIC) && !(p->cost & C_PER_SLOT) && !rounding(p)) {
        st->fs += qterm(p, s);
    }
    st->cnt++;
}

/* The tokens cost (samples summed, linear) without rounding, batch_multiple or caps: its own loop, as
 * the padded cost has, since the general loop's per-sample tests for every option (a second size's
 * among them, since --size2) made it 1.2-1.7x slower. Returns the number of boundaries written, or -1
 * on a negative size. */
static int64_t greedy_tokens(const int64_t *sizes, int64_t n, int64_t lim, int64_t max_samples,
                             int64_t *bounds) {
    int64_t nb = 0;
    bounds[nb++] = 0;
    if (n == 0) return nb;
    if (sizes[0] < 0) return -1;
    int64_t ms = max_samples > 0 ? max_samples : INT64_MAX;
    int64_t cnt = 1, sum = sizes[0];
    for (int64_t i = 1; i < n; i++) {
        int64_t s = sizes[i];
        int64_t t;
        if (SP_UNLIKELY(s < 0)) return -1;
        int ovf = add_ovf(sum, s, &t);
        if (SP_LIKELY(!ovf && t <= lim && cnt < ms)) {
            cnt++;
            sum = t;
        } else {
            bounds[nb++] = i;
            cnt = 1;
            sum = s;
        }
    }
    bounds[nb++] = n;
    return nb;
}

/* The plain padded cost (per slot, linear) without rounding or batch_multiple: the hot path of `pack`.
 * Returns the number of boundaries written, or -1 on a negative size. */
static int64_t greedy_padded(const int64_t *sizes, int64_t n, int64_t lim, int64_t max_samples,
                             int64_t *bounds) {
    int64_t nb = 0;
    bounds[nb++] = 0;
    if (n == 0) return nb;
    int64_t ms = max_samples > 0 ? max_samples : INT64_MAX;
    int64_t cnt = 1, mx = sizes[0];
    int64_t neg = sizes[0];
    for (int64_t i = 1; i < n; i++) {
        int64_t s = sizes[i];
        int64_t m = s > mx ? s : mx;
        int64_t cost;
        neg |= s;
        int ovf = mul_ovf(cnt + 1, m, &cost);
        if (SP_LIKELY(!ovf && cost <= lim && cnt < ms)) {
            cnt++;
            mx = m;
        } else {
            bounds[nb++] = i;
            cnt = 1;
            mx = s;
        }
    }
    if (neg < 0) return -1;
    bounds[nb++] = n;
    return nb;
}

/* The measures of sample i under each cap, gathered into vals. */
static inline void gp_vals(const gp_params *p, int64_t i, int64_t *vals) {
    for (int64_t k = 0; k < p->ncaps; k++) vals[k] = p->caps[k * p->ncap_stride + i];
}

static inline int64_t gp_round(const gp_params *p, int64_t s) { return rounding(p) ? round_len(p, s) : s; }

/* The greedy's parameters from the kernel arguments (caps: ncaps x n measures, lims: their caps). */
static void gp_init(gp_params *p, int64_t n, int64_t cost, int64_t lim_i, double lim_d, int64_t max_samples,
                    int64_t multiple, double quadratic_scale, int64_t pad_multiple, const int64_t *shapes,
                    int64_t nshapes, const int64_t *caps, const int64_t *lims, int64_t ncaps) {
    p->cost = (int)cost;
    p->lim_i = lim_i;
    p->lim_d = lim_d;
    p->max_samples = max_samples;
    p->multiple = multiple < 1 ? 1 : multiple;
    p->q = quadratic_scale;
    p->pad = pad_multiple > 1 ? pad_multiple : 0;
    p->shapes = nshapes > 0 ? shapes : NULL;
    p->nshapes = nshapes > 0 ? nshapes : 0;
    p->ncaps = caps && ncaps > 0 ? ncaps : 0;
    p->caps = caps;
    p->ncap_stride = n;
    p->lims = lims;
}

/* Sequential greedy of greedy_pack_reference for every cost and option, with ncaps caps beside the
 * budget (caps: ncaps x n per-sample measures, NULL: none) whose sums in a micro-batch stay <= lims.
 * bounds must hold n + 1 values. Returns the number written, -1 on a negative size or measure,
 * -3 on more than SP_MAX_CAPS caps. */
SP_API int64_t sp_greedy_pack_caps(const int64_t *sizes, int64_t n, int64_t cost,
                                   int64_t lim_i, double lim_d, int64_t max_samples, int64_t multiple,
                                   double quadratic_scale, int64_t pad_multiple, const int64_t *shapes,
                                   int64_t nshapes, const int64_t *caps, const int64_t *lims, int64_t ncaps,
                                   int64_t *bounds) {
    if (ncaps > SP_MAX_CAPS) return -3;
    gp_params p;
    gp_init(&p, n, cost, lim_i, lim_d, max_samples, multiple, quadratic_scale, pad_multiple, shapes, nshapes,
            caps, lims, ncaps);

    if (p.cost == C_PER_SLOT && !rounding(&p) && p.multiple == 1 && p.ncaps == 0)
        return greedy_padded(sizes, n, lim_i, max_samples, bounds);

    int64_t nb = 0, start = 0;
    int64_t vals[SP_MAX_CAPS];
    gp_state st;
    gp_reset(&st);
    bounds[nb++] = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t s = sizes[i];
        if (SP_UNLIKELY(s < 0)) return -1;
        gp_vals(&p, i, vals);
        for (int64_t k = 0; k < p.ncaps; k++)
            if (SP_UNLIKELY(vals[k] < 0)) return -1;
        int64_t r = gp_round(&p, s);
        while (st.cnt > 0 && !gp_fits(&p, &st, s, r, vals)) {
            int64_t c = st.cnt;
            int64_t keep = c < p.multiple ? c : p.multiple * (c / p.multiple);
            start += keep;
            bounds[nb++] = start;
            /* the leftover (fewer than `multiple` samples) opens the next micro-batch; its
             * cost is recomputed from scratch, in order, exactly as the reference does */
            gp_reset(&st);
            int64_t v2[SP_MAX_CAPS];
            for (int64_t j = start; j < i; j++) {
                gp_vals(&p, j, v2);
                gp_add(&p, &st, sizes[j], gp_round(&p, sizes[j]), v2);
            }
        }
        gp_add(&p, &st, s, r, vals);
    }
    if (st.cnt > 0) bounds[nb++] = n;
    return nb;
}

/* sp_greedy_pack_caps without caps. */
SP_API int64_t sp_greedy_pack(const int64_t *sizes, int64_t n, int64_t cost,
                              int64_t lim_i, double lim_d, int64_t max_samples, int64_t multiple,
                              double quadratic_scale, int64_t pad_multiple, const int64_t *shapes,
                              int64_t nshapes, int64_t *bounds) {
    if (cost == 0 && pad_multiple <= 1 && nshapes <= 0 && multiple <= 1)  /* tokens, no rounding or multiple */
        return greedy_tokens(sizes, n, lim_i, max_samples, bounds);
    return sp_greedy_pack_caps(sizes, n, cost, lim_i, lim_d, max_samples, multiple, quadratic_scale,
                               pad_multiple, shapes, nshapes, NULL, NULL, 0, bounds);
}

/* ------------------------------------------------------------------------------------ */
/* best fit over every cap at once (bin-centric, window by window)                       */

/* A window's samples are given in visiting order (largest first). A micro-batch (or row) opens with
 * the first sample not yet placed and takes, again and again, the first unplaced sample of the
 * window that fits it under the budget and every cap, until none does: each bin takes the largest
 * sample that still fits it. A segment tree over the window holds, per node, the least size and
 * the least of each measure among its unplaced samples: a node none of whose samples can fit (the
 * budget and the caps are monotone, so its least values already fail) is skipped whole. */
typedef struct {
    const gp_params *p;
    const int64_t *sizes;  /* the window's sizes, visiting order */
    int64_t base;          /* the window's first sample in the call's arrays (for the caps) */
    int64_t T;             /* leaves: the least power of two >= the window's length */
    int64_t dims;          /* 1 + ncaps */
    int64_t *mins;         /* dims x 2T: mins[d * 2T + node] */
} fit_tree;

#define FIT_EMPTY INT64_MAX

static void ft_leaf(fit_tree *t, int64_t i, int placed) {
    int64_t T2 = 2 * t->T, node = t->T + i;
    t->mins[node] = placed ? FIT_EMPTY : t->sizes[i];
    for (int64_t k = 0; k < t->p->ncaps; k++)
        t->mins[(k + 1) * T2 + node] = placed ? FIT_EMPTY : t->p->caps[k * t->p->ncap_stride + t->base + i];
    for (node >>= 1; node >= 1; node >>= 1) {
        for (int64_t d = 0; d < t->dims; d++) {
            int64_t a = t->mins[d * T2 + 2 * node], b = t->mins[d * T2 + 2 * node + 1];
            t->mins[d * T2 + node] = a < b ? a : b;
        }
    }
}

static void ft_build(fit_tree *t, int64_t m) {
    int64_t T2 = 2 * t->T;
    for (int64_t d = 0; d < t->dims; d++)
        for (int64_t node = 0; node < T2; node++) t->mins[d * T2 + node] = FIT_EMPTY;
    for (int64_t i = 0; i < m; i++) {
        t->mins[t->T + i] = t->sizes[i];
        for (int64_t k = 0; k < t->p->ncaps; k++)
            t->mins[(k + 1) * T2 + t->T + i] = t->p->caps[k * t->p->ncap_stride + t->base + i];
    }
    for (int64_t node = t->T - 1; node >= 1; node--)
        for (int64_t d = 0; d < t->dims; d++) {
            int64_t a = t->mins[d * T2 + 2 * node], b = t->mins[d * T2 + 2 * node + 1];
            t->mins[d * T2 + node] = a < b ? a : b;
        }
}

/* May some unplaced sample under node fit st? (Exact at a leaf.) */
static inline int ft_may_fit(const fit_tree *t, const gp_state *st, int64_t node) {
    int64_t T2 = 2 * t->T, s = t->mins[node];
    if (s == FIT_EMPTY) return 0;
    int64_t vals[SP_MAX_CAPS];
    for (int64_t k = 0; k < t->p->ncaps; k++) vals[k] = t->mins[(k + 1) * T2 + node];
    return gp_fits(t->p, st, s, gp_round(t->p, s), vals);
}

/* The first unplaced sample (window position) that fits st, or -1. */
static int64_t ft_first_fit(const fit_tree *t, const gp_state *st) {
    int64_t node = 1;
    if (!ft_may_fit(t, st, 1)) return -1;
    for (;;) {
        if (node >= t->T) return node - t->T; /* a leaf: ft_may_fit was exact */
        if (ft_may_fit(t, st, 2 * node)) {
            node = 2 * node;
            continue;
        }
        if (ft_may_fit(t, st, 2 * node + 1)) {
            node = 2 * node + 1;
            continue;
        }
        /* neither child fits although their least values did together: climb to the next
         * right sibling of an ancestor that may fit */
        for (;;) {
            while (node & 1) node >>= 1; /* a right child: go up */
            if (node <= 1) return -1;
            node += 1; /* the right sibling */
            if (ft_may_fit(t, st, node)) break;
        }
    }
}

static void ft_add(const fit_tree *t, gp_state *st, int64_t i) {
    int64_t vals[SP_MAX_CAPS];
    gp_vals(t->p, t->base + i, vals);
    gp_add(t->p, st, t->sizes[i], gp_round(t->p, t->sizes[i]), vals);
}

/* Packs one window of m samples; appends the bins' members (window positions + base) to order and
 * their ends to bounds. members: m words of scratch. Returns the number of bins. */
static int64_t fit_window(fit_tree *t, int64_t m, int64_t *order, int64_t *bounds, int64_t *members) {
    const gp_params *p = t->p;
    int64_t nb = 0, first = 0, out = bounds[0];
    ft_build(t, m);
    for (;;) {
        while (first < m && t->mins[t->T + first] == FIT_EMPTY) first++;
        if (first >= m) break;
        gp_state st;
        gp_reset(&st);
        int64_t c = 0;
        for (int64_t j = first; j >= 0; j = ft_first_fit(t, &st)) {
            ft_add(t, &st, j);
            ft_leaf(t, j, 1);
            members[c++] = j;
        }
        /* --batch-multiple: the last samples taken beyond a multiple go back to the window */
        int64_t keep = c < p->multiple ? c : p->multiple * (c / p->multiple);
        for (int64_t q = keep; q < c; q++) ft_leaf(t, members[q], 0);
        for (int64_t q = 0; q < keep; q++) order[out++] = t->base + members[q];
        bounds[++nb] = out;
    }
    return nb;
}

/* Words of scratch memory sp_fit_pack needs for windows of at most wmax samples and ncaps caps. */
SP_API int64_t sp_fit_pack_scratch_words(int64_t wmax, int64_t ncaps) {
    int64_t T = 1;
    while (T < wmax) T <<= 1;
    return (1 + ncaps) * 2 * T + wmax + 1;
}

/* Best fit over the budget and every cap at once, window by window: windows are the ranges
 * [wins[w], wins[w + 1]) of the samples, each in visiting order (largest first); a bin never spans
 * two windows. order (n) receives the samples grouped by bin, in the order each bin took them,
 * bounds (n + 1) the bins' boundaries; scratch holds sp_fit_pack_scratch_words(the longest window,
 * ncaps). Returns the number of bins, -1 on a negative size or measure, -3 on too many caps. */
SP_API int64_t sp_fit_pack(const int64_t *sizes, int64_t n, int64_t cost, int64_t lim_i, double lim_d,
                           int64_t max_samples, int64_t multiple, double quadratic_scale, int64_t pad_multiple,
                           const int64_t *shapes, int64_t nshapes, const int64_t *caps, const int64_t *lims,
                           int64_t ncaps, const int64_t *wins, int64_t nwins, int64_t *order, int64_t *bounds,
                           int64_t *scratch) {
    if (ncaps > SP_MAX_CAPS) return -3;
    gp_params p;
    gp_init(&p, n, cost, lim_i, lim_d, max_samples, multiple, quadratic_scale, pad_multiple, shapes, nshapes,
            caps, lims, ncaps);
    for (int64_t i = 0; i < n; i++)
        if (sizes[i] < 0) return -1;
    for (int64_t i = 0; i < p.ncaps * n; i++)
        if (caps[i] < 0) return -1;
    int64_t wmax = 1;
    for (int64_t w = 0; w < nwins; w++)
        if (wins[w + 1] - wins[w] > wmax) wmax = wins[w + 1] - wins[w];
    fit_tree t;
    t.p = &p;
    t.dims = 1 + p.ncaps;
    t.T = 1;
    while (t.T < wmax) t.T <<= 1;
    t.mins = scratch;
    int64_t *members = scratch + t.dims * 2 * t.T;
    int64_t nb = 0;
    bounds[0] = 0;
    for (int64_t w = 0; w < nwins; w++) {
        int64_t a = wins[w], m = wins[w + 1] - a;
        if (m <= 0) continue;
        t.sizes = sizes + a;
        t.base = a;
        nb += fit_window(&t, m, order, bounds + nb, members);
    }
    return nb;
}

/* ------------------------------------------------------------------------------------ */
/* merging sorted runs                                                                     */

#if defined(__GNUC__) || defined(__clang__)
#define SP_INLINE static inline __attribute__((always_inline))
#else
#define SP_INLINE static inline
#endif

/* c ? x : y without a branch: gcc otherwise often emits a jump, mispredicted half the time
 * in a merge. */
SP_INLINE uint64_t sel_u(int64_t c, uint64_t x, uint64_t y) {
    uint64_t m = (uint64_t)0 - (uint64_t)c;
    return (x & m) | (y & ~m);
}
SP_INLINE int64_t sel_i(int64_t c, int64_t x, int64_t y) { return (int64_t)sel_u(c, (uint64_t)x, (uint64_t)y); }

/* Key order: the uint64 hi, then (pair) the uint64 lo. Written to compile to setcc/cmov. */
SP_INLINE int key_lt(uint64_t ah, uint64_t al, uint64_t bh, uint64_t bl, int pair) {
    if (!pair) return ah < bh;
#if defined(__SIZEOF_INT128__)
    return (((unsigned __int128)ah << 64) | al) < (((unsigned __int128)bh << 64) | bl);
#else
    return (ah < bh) | ((ah == bh) & (al < bl));
#endif
}

/* One pass step: stable merge of the adjacent runs [a, m) and [m, e) of (kh, kl, pay) into
 * positions [a, e) of (oh, ol, op). Without pay the payload is the index itself (the first
 * pass, reading the caller's keys); without outkeys only the payload is written (the last
 * pass of the pair merge). Ties take the left run: stable by run.
 *
 * A branchless merge is bound by the latency of its load-compare-advance chain, so the first
 * half of the output is merged from the front and the second half from the back in the same
 * loop: two independent chains. Indexes are global, which keeps the live values within
 * x86-64's 15 registers. Returns non-zero when an input run was not sorted. */
SP_INLINE int merge2_gen(const uint64_t *kh, const uint64_t *kl, const int64_t *pay, int64_t a,
                         int64_t m, int64_t e, uint64_t *oh, uint64_t *ol, int64_t *op, int pair,
                         int haspay, int outkeys, int outpos) {
    const int64_t h = a + (e - a) / 2;
    int64_t i = a, j = m, of = a;          /* front: next of each run, next output */
    int64_t ia = m - 1, jb = e - 1, ob = e - 1; /* back: the same, walking down */
    uint64_t fh = 0, fl = 0, bh = UINT64_MAX, bl = UINT64_MAX; /* last output each way */
    uint64_t bad = 0;
    for (;;) {
        /* steps that exhaust neither run from either end nor pass the middle */
        int64_t T = h - of;
        if (ob - h + 1 < T) T = ob - h + 1;
        if (m - i < T) T = m - i;
        if (e - j < T) T = e - j;
        if (ia - a + 1 < T) T = ia - a + 1;
        if (jb - m + 1 < T) T = jb - m + 1;
        if (T <= 0) break;
        const int64_t stop = of + T;
        do {
            uint64_t xh = kh[i], yh = kh[j], xl = pair ? kl[i] : 0, yl = pair ? kl[j] : 0;
            int64_t tb = key_lt(yh, yl, xh, xl, pair);
            uint64_t vh = sel_u(tb, yh, xh), vl = pair ? sel_u(tb, yl, xl) : 0;
            if (outpos) op[of] = haspay ? sel_i(tb, pay[j], pay[i]) : sel_i(tb, j, i);
            if (outkeys) oh[of] = vh;
            if (outkeys && pair) ol[of] = vl;
            bad |= key_lt(vh, vl, fh, fl, pair);
            fh = vh;
            fl = vl;
            of++;
            j += tb;
            i += 1 - tb;

            uint64_t uh = kh[ia], wh = kh[jb], ul = pair ? kl[ia] : 0, wl = pair ? kl[jb] : 0;
            int64_t ta = key_lt(wh, wl, uh, ul, pair); /* ties take the right run: it goes last */
            uint64_t zh = sel_u(ta, uh, wh), zl = pair ? sel_u(ta, ul, wl) : 0;
            if (outpos) op[ob] = haspay ? sel_i(ta, pay[ia], pay[jb]) : sel_i(ta, ia, jb);
            if (outkeys) oh[ob] = zh;
            if (outkeys && pair) ol[ob] = zl;
            bad |= key_lt(bh, bl, zh, zl, pair);
            bh = zh;
            bl = zl;
            ob--;
            ia -= ta;
            jb -= 1 - ta;
        } while (of < stop);
    }
    while (of < h) {
        int tb = i >= m || (j < e && key_lt(kh[j], pair ? kl[j] : 0, kh[i], pair ? kl[i] : 0, pair));
        int64_t q = tb ? j++ : i++;
        uint64_t vh = kh[q], vl = pair ? kl[q] : 0;
        if (outpos) op[of] = haspay ? pay[q] : q;
        if (outkeys) oh[of] = vh;
        if (outkeys && pair) ol[of] = vl;
        bad |= key_lt(vh, vl, fh, fl, pair);
        fh = vh;
        fl = vl;
        of++;
    }
    while (ob >= h) {
        int ta = jb < m || (ia >= a && key_lt(kh[jb], pair ? kl[jb] : 0, kh[ia], pair ? kl[ia] : 0, pair));
        int64_t q = ta ? ia-- : jb--;
        uint64_t zh = kh[q], zl = pair ? kl[q] : 0;
        if (outpos) op[ob] = haspay ? pay[q] : q;
        if (outkeys) oh[ob] = zh;
        if (outkeys && pair) ol[ob] = zl;
        bad |= key_lt(bh, bl, zh, zl, pair);
        bh = zh;
        bl = zl;
        ob--;
    }
    /* the halves must meet in order and, which only unsorted runs can break, must have
     * consumed each run exactly once between them */
    if (h > a && h < e) bad |= key_lt(bh, bl, fh, fl, pair);
    bad |= i != ia + 1;
    return bad != 0;
}

/* Copies run [a, e) through a pass unmerged (an odd run out), checking that it is sorted. */
SP_INLINE int copy_run(const uint64_t *kh, const uint64_t *kl, const int64_t *pay, int64_t a,
                       int64_t e, uint64_t *oh, uint64_t *ol, int64_t *op, int pair, int haspay,
                       int outkeys, int outpos) {
    uint64_t bad = 0;
    for (int64_t q = a; q < e; q++) {
        if (q > a) bad |= key_lt(kh[q], pair ? kl[q] : 0, kh[q - 1], pair ? kl[q - 1] : 0, pair);
        if (outpos) op[q] = haspay ? pay[q] : q;
        if (outkeys) oh[q] = kh[q];
        if (outkeys && pair) ol[q] = kl[q];
    }
    return bad != 0;
}

SP_INLINE int pass_step(int first, int last, int pair, const uint64_t *kh, const uint64_t *kl,
                        const int64_t *pay, int64_t a, int64_t m, int64_t e, uint64_t *oh,
                        uint64_t *ol, int64_t *op) {
    /* the flags become constants in each call below, so every variant is compiled lean */
    int outkeys = !(last && pair);
    if (!op) { /* keys only (single keys): no positions are read or written */
        if (m == e) return copy_run(kh, kl, pay, a, e, oh, ol, op, 0, 0, 1, 0);
        return merge2_gen(kh, kl, pay, a, m, e, oh, ol, op, 0, 0, 1, 0);
    }
    if (m == e) {
        if (first) return copy_run(kh, kl, pay, a, e, oh, ol, op, pair, 0, outkeys, 1);
        return copy_run(kh, kl, pay, a, e, oh, ol, op, pair, 1, outkeys, 1);
    }
    if (first && last) return merge2_gen(kh, kl, pay, a, m, e, oh, ol, op, pair, 0, outkeys, 1);
    if (first) return merge2_gen(kh, kl, pay, a, m, e, oh, ol, op, pair, 0, 1, 1);
    if (last) return merge2_gen(kh, kl, pay, a, m, e, oh, ol, op, pair, 1, outkeys, 1);
    return merge2_gen(kh, kl, pay, a, m, e, oh, ol, op, pair, 1, 1, 1);
}

static int merge_passes(int64_t k) {
    int passes = 0;
    while (((int64_t)1 << passes) < k) passes++;
    return passes;
}

/* Words of scratch memory the merge of n keys in k runs needs (0 for k <= 2). */
SP_API int64_t sp_merge_scratch_words(int64_t n, int64_t k, int64_t pair) {
    if (merge_passes(k) < 2) return 0;
    return (pair ? 5 : 2) * (n > 0 ? n : 1);
}

/* k-way merge as ceil(log2 k) passes of two-way merges of neighbouring runs. A loser tree
 * reads the data once, but its per-level compare is a serial chain (branchless) or a coin
 * flip (branchy); a two-way pass streams at ~2-3 ns per element, so for the k the sort
 * stage sees (ranks) the passes win, at the cost of a temporary copy of keys and payload.
 * The passes ping-pong between the caller's output arrays and the scratch, starting on the
 * side that makes the last pass land in the output. The scratch comes from the caller
 * (numpy), whose large allocations are backed by huge pages: first-touch page faults of a
 * plain malloc cost as much as a whole pass on some machines. */
SP_INLINE int64_t merge_cascade(const uint64_t *hi, const uint64_t *lo, const int64_t *offsets,
                                int64_t k, uint64_t *ok, int64_t *op, int pair, uint64_t *scratch) {
    const int64_t n = offsets[k];
    const int passes = merge_passes(k);
    if (passes == 0) return pass_step(1, 1, pair, hi, lo, NULL, 0, n, n, ok, NULL, op);
    if (passes == 1)
        return pass_step(1, 1, pair, hi, lo, NULL, 0, offsets[1], n, ok, NULL, op);
    int64_t *bnd = (int64_t *)malloc(sizeof(int64_t) * (size_t)(k + 1));
    if (!bnd) return -1;
    memcpy(bnd, offsets, sizeof(int64_t) * (size_t)(k + 1));
    /* side 0: the output keys (for pairs, scratch hi/lo) with the output positions;
     * side 1: scratch keys (and lo) and positions */
    const int64_t nn = n > 0 ? n : 1;
    uint64_t *t1h = scratch, *t1p = scratch + nn;
    uint64_t *t1l = pair ? scratch + 2 * nn : NULL;
    uint64_t *t0h = pair ? scratch + 3 * nn : ok, *t0l = pair ? scratch + 4 * nn : NULL;
    uint64_t *sh[2] = {t0h, t1h}, *sl[2] = {t0l, t1l};
    int64_t *sp[2] = {op, op ? (int64_t *)t1p : NULL}; /* no positions: keys only */
    int bad = 0;
    int64_t nr = k;
    const uint64_t *ch = hi, *cl = lo;
    const int64_t *cp = NULL;
    for (int p = 0; p < passes; p++) {
        int first = p == 0, last = p == passes - 1;
        int side = (passes - 1 - p) & 1;
        for (int64_t r = 0; r < nr; r += 2) {
            int64_t a = bnd[r], m = bnd[r + 1], e = r + 2 <= nr ? bnd[r + 2] : m;
            bad |= pass_step(first, last, pair, ch, cl, cp, a, m, e, sh[side], sl[side], sp[side]);
        }
        int64_t w = 0;
        for (int64_t r = 0; r <= nr; r += 2) bnd[w++] = bnd[r];
        if (nr & 1) bnd[w++] = bnd[nr];
        nr = (nr + 1) / 2;
        ch = sh[side];
        cl = sl[side];
        cp = sp[side];
    }
    free(bnd);
    return bad;
}

static int64_t runs_check(const int64_t *offsets, int64_t k) {
    if (k < 1 || offsets[0] != 0) return -2;
    for (int64_t r = 0; r < k; r++)
        if (offsets[r + 1] < offsets[r]) return -2;
    return 0;
}

/* Merges sorted runs keys[offsets[r]:offsets[r+1]] (r < k, offsets[0] == 0), stable by
 * run: merged keys to ok, source positions to op; scratch holds sp_merge_scratch_words.
 * Returns 0, 1 when some run was not sorted (outputs are then unspecified), -1 when out of
 * memory, -2 on bad offsets. */
SP_API int64_t sp_merge_runs_u64(const uint64_t *keys, const int64_t *offsets, int64_t k,
                                 uint64_t *ok, int64_t *op, uint64_t *scratch) {
    if (runs_check(offsets, k)) return -2;
    return merge_cascade(keys, NULL, offsets, k, ok, op, 0, scratch);
}

/* As sp_merge_runs_u64, merged keys only (no positions: less to write, half the scratch used). */
SP_API int64_t sp_merge_keys_u64(const uint64_t *keys, const int64_t *offsets, int64_t k, uint64_t *ok,
                                 uint64_t *scratch) {
    if (runs_check(offsets, k)) return -2;
    return merge_cascade(keys, NULL, offsets, k, ok, NULL, 0, scratch);
}

/* As sp_merge_runs_u64 with keys ordered by the pair (hi, lo); positions only. */
SP_API int64_t sp_merge_runs_pair(const uint64_t *hi, const uint64_t *lo, const int64_t *offsets,
                                  int64_t k, int64_t *op, uint64_t *scratch) {
    if (runs_check(offsets, k)) return -2;
    return merge_cascade(hi, lo, offsets, k, NULL, op, 1, scratch);
}

/* ------------------------------------------------------------------------------------ */
/* best-fit-decreasing row packing                                                         */

/* A hierarchical bitset over 0..cap: "smallest set index >= x" in O(log64 cap). */
typedef struct {
    int nlev;
    int64_t nw[8];
    uint64_t *w[8];
} bitset;

/* Words of a bitset over nbits (all levels); with mem, lays the levels out there, zeroed. */
static int64_t bs_layout(bitset *b, int64_t nbits, uint64_t *mem) {
    int64_t total = 0, m = nbits;
    b->nlev = 0;
    do {
        int64_t words = (m + 63) / 64;
        b->nw[b->nlev++] = words;
        total += words;
        m = words;
    } while (m > 1 && b->nlev < 8);
    if (mem) {
        memset(mem, 0, sizeof(uint64_t) * (size_t)total);
        uint64_t *p = mem;
        for (int l = 0; l < b->nlev; l++) {
            b->w[l] = p;
            p += b->nw[l];
        }
    }
    return total;
}

static inline int ctz64(uint64_t x) {
#if defined(__GNUC__) || defined(__clang__)
    return __builtin_ctzll(x);
#else
    int n = 0;
    while (!(x & 1)) { x >>= 1; n++; }
    return n;
#endif
}

static inline void bs_set(bitset *b, int64_t x) {
    for (int l = 0; l < b->nlev; l++) {
        uint64_t *word = &b->w[l][x >> 6];
        int was = *word != 0;
        *word |= (uint64_t)1 << (x & 63);
        if (was) return;
        x >>= 6;
    }
}

static inline void bs_clear(bitset *b, int64_t x) {
    for (int l = 0; l < b->nlev; l++) {
        uint64_t *word = &b->w[l][x >> 6];
        *word &= ~((uint64_t)1 << (x & 63));
        if (*word) return;
        x >>= 6;
    }
}

static inline int64_t bs_next(const bitset *b, int64_t x) {
    int l;
    for (l = 0; l < b->nlev; l++) {
        int64_t wi = x >> 6;
        if (wi >= b->nw[l]) return -1;
        uint64_t bits = b->w[l][wi] & (~(uint64_t)0 << (x & 63));
        if (bits) {
            x = (wi << 6) | ctz64(bits);
            break;
        }
        x = wi + 1;
    }
    if (l == b->nlev) return -1;
    while (l > 0) {
        l--;
        x = (x << 6) | ctz64(b->w[l][x]);
    }
    return x;
}

typedef struct {
    int64_t size, pos;
} sp_pair;

static int cmp_desc_size(const void *pa, const void *pb) {
    const sp_pair *a = (const sp_pair *)pa, *b = (const sp_pair *)pb;
    if (a->size != b->size) return a->size > b->size ? -1 : 1;
    return (a->pos > b->pos) - (a->pos < b->pos);
}

typedef struct {
    int64_t R, maxseg;
    int64_t *seq, *rowof, *rem, *seg, *first, *next, *head, *cnt;
    sp_pair *pairs;
    bitset bs;
} bfd_ws;

/* Packs one window sz[0:m] (positions local); appends to order/splits at the given offsets.
 * Returns the number of rows. */
static int64_t bfd_window(bfd_ws *ws, const int64_t *sz, int64_t m, int64_t gbase, int64_t *order,
                          int64_t *splits) {
    const int64_t R = ws->R;
    int64_t *seq = ws->seq, *rowof = ws->rowof, *rem = ws->rem, *seg = ws->seg;
    int64_t *first = ws->first, *next = ws->next, *head = ws->head;

    /* visit order: size descending, position ascending. Counting sort costs O(m + R), so
     * a window much smaller than the row length is sorted by comparison instead. */
    if (m * 4 >= R) {
        int64_t *cnt = ws->cnt;
        memset(cnt, 0, sizeof(int64_t) * (size_t)(R + 1));
        for (int64_t p = 0; p < m; p++) cnt[sz[p]]++;
        int64_t off = 0;
        for (int64_t v = R; v >= 0; v--) {
            int64_t c = cnt[v];
            cnt[v] = off;
            off += c;
        }
        for (int64_t p = 0; p < m; p++) seq[cnt[sz[p]]++] = p;
    } else {
        for (int64_t p = 0; p < m; p++) {
            ws->pairs[p].size = sz[p];
            ws->pairs[p].pos = p;
        }
        qsort(ws->pairs, (size_t)m, sizeof(sp_pair), cmp_desc_size);
        for (int64_t p = 0; p < m; p++) seq[p] = ws->pairs[p].pos;
    }

    int64_t nrows = 0;
    for (int64_t t = 0; t < m; t++) {
        int64_t p = seq[t], s = sz[p], row;
        int64_t c = bs_next(&ws->bs, s);
        if (c >= 0) {
            /* best fit: the tightest open row; among equally tight rows the last one pushed */
            row = head[c];
            head[c] = next[row];
            if (head[c] < 0) bs_clear(&ws->bs, c);
            rem[row] -= s;
            seg[row]++;
        } else {
            row = nrows++;
            rem[row] = R - s;
            seg[row] = 1;
            first[row] = p;
        }
        rowof[p] = row;
        if (ws->maxseg <= 0 || seg[row] < ws->maxseg) {
            int64_t r = rem[row];
            next[row] = head[r];
            if (head[r] < 0) bs_set(&ws->bs, r);
            head[r] = row;
        }
    }
    /* leave the buckets empty for the next window */
    for (int64_t row = 0; row < nrows; row++) {
        head[rem[row]] = -1;
        bs_clear(&ws->bs, rem[row]);
    }

    /* rows in the order of their opening (largest) sample's position, samples within a row
     * in position order: both follow the input order, so sorted input stays sorted-ish */
    int64_t *mark = seq, *emit = next, *fill = rem;
    for (int64_t p = 0; p < m; p++) mark[p] = -1;
    for (int64_t row = 0; row < nrows; row++) mark[first[row]] = row;
    int64_t e = 0;
    for (int64_t p = 0; p < m; p++)
        if (mark[p] >= 0) emit[mark[p]] = e++;
    /* seg[] (per old row id) -> sizes per emitted row -> fill pointers */
    for (int64_t row = 0; row < nrows; row++) first[emit[row]] = seg[row];
    int64_t acc = splits[0];
    for (int64_t q = 0; q < nrows; q++) {
        int64_t c = first[q];
        fill[q] = acc;
        acc += c;
        splits[q + 1] = acc;
    }
    for (int64_t p = 0; p < m; p++) order[fill[emit[rowof[p]]]++] = gbase + p;
    return nrows;
}

static int64_t pack_window_len(int64_t n, int64_t window) {
    return (window <= 0 || window > n) ? n : window;
}

/* Words of scratch memory sp_pack_rows needs. */
SP_API int64_t sp_pack_rows_scratch_words(int64_t n, int64_t row_len, int64_t window) {
    bitset b;
    int64_t W = pack_window_len(n, window);
    if (W < 1) W = 1;
    if (row_len < 0) row_len = 0;
    /* seq, rowof, rem, seg, first, next (W each), pairs (2W), head and cnt (R+1 each) */
    return 8 * W + 2 * (row_len + 1) + bs_layout(&b, row_len + 1, NULL);
}

/* Best-fit-decreasing packing of consecutive windows of `window` samples (<= 0: one window)
 * into rows of at most row_len tokens and max_segments samples (<= 0: unlimited).
 * order (n) receives positions grouped by row, row_splits (n + 1) the row boundaries;
 * scratch holds sp_pack_rows_scratch_words. Returns the number of rows, or -2 when a size
 * is outside [0, row_len]. */
SP_API int64_t sp_pack_rows(const int64_t *sizes, int64_t n, int64_t row_len, int64_t max_segments,
                            int64_t window, int64_t *order, int64_t *row_splits, int64_t *scratch) {
    row_splits[0] = 0;
    if (row_len < 0) return -2;
    for (int64_t i = 0; i < n; i++)
        if (sizes[i] < 0 || sizes[i] > row_len) return -2;
    if (n == 0) return 0;
    const int64_t W = pack_window_len(n, window);
    bfd_ws ws;
    ws.R = row_len;
    ws.maxseg = max_segments;
    ws.seq = scratch;
    ws.rowof = scratch + W;
    ws.rem = scratch + 2 * W;
    ws.seg = scratch + 3 * W;
    ws.first = scratch + 4 * W;
    ws.next = scratch + 5 * W;
    ws.pairs = (sp_pair *)(scratch + 6 * W);
    ws.head = scratch + 8 * W;
    ws.cnt = ws.head + row_len + 1;
    bs_layout(&ws.bs, row_len + 1, (uint64_t *)(ws.cnt + row_len + 1));
    for (int64_t c = 0; c <= row_len; c++) ws.head[c] = -1;
    int64_t nrows = 0;
    for (int64_t w0 = 0; w0 < n; w0 += W) {
        int64_t m = n - w0 < W ? n - w0 : W;
        nrows += bfd_window(&ws, sizes + w0, m, w0, order, row_splits + nrows);
    }
    return nrows;
}

/* ------------------------------------------------------------------------------------ */
/* optimal padded lengths: min over K lengths of sum(count * smallest length >= value)      */

/* One layer of the partition DP, by divide and conquer:
 *   cur[i] = min over j in [0, i) of prev[j] + v[i-1] * (C[i] - C[j]),  opt[i] = leftmost argmin,
 * for i in [lo, hi], knowing opt lies in [olo, ohi]. The cost v[i-1]*(C[i]-C[j]) is Monge, so
 * leftmost argmins do not decrease with i and each level of the recursion scans O(d). */
static void ol_layer(const int64_t *prev, int64_t *cur, int32_t *opt, const int64_t *v, const int64_t *C,
                     int64_t lo, int64_t hi, int64_t olo, int64_t ohi) {
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int64_t top = ohi < mid - 1 ? ohi : mid - 1;
        int64_t best = INT64_MAX, arg = olo;
        const int64_t vm = v[mid - 1], cm = C[mid];
        for (int64_t j = olo; j <= top; j++) {
            int64_t val = prev[j] + vm * (cm - C[j]);
            if (val < best) {
                best = val;
                arg = j;
            }
        }
        cur[mid] = best;
        opt[mid] = (int32_t)arg;
        /* recurse on the smaller half, loop on the other: stack depth stays O(log d) */
        if (mid - lo < hi - mid) {
            ol_layer(prev, cur, opt, v, C, lo, mid - 1, olo, arg);
            lo = mid + 1;
            olo = arg;
        } else {
            ol_layer(prev, cur, opt, v, C, mid + 1, hi, arg, ohi);
            hi = mid - 1;
            ohi = arg;
        }
    }
}

/* Choose at most k lengths among the d distinct values v (increasing, positive) with prefix
 * counts C (d + 1 entries, C[0] = 0) minimising sum over values of count * (smallest chosen
 * length >= value); the largest is always v[d-1]. f and g are d + 1 words of scratch, opt
 * (k - 1) * (d + 1) int32. The caller guarantees v[d-1] * C[d] < 2^62 (no overflow).
 * Writes the lengths, increasing, to out and returns how many. Ties go to the leftmost
 * split at every step, so the result is unique and equals the numpy fallback's. */
SP_API int64_t sp_optimal_lengths(const int64_t *v, const int64_t *C, int64_t d, int64_t k, int64_t *f,
                                  int64_t *g, int32_t *opt, int64_t *out) {
    if (d <= 0 || k <= 0) return 0;
    if (k >= d) {
        for (int64_t i = 0; i < d; i++) out[i] = v[i];
        return d;
    }
    f[0] = 0;
    for (int64_t i = 1; i <= d; i++) f[i] = v[i - 1] * C[i]; /* one length: everything to v[i-1] */
    for (int64_t layer = 2; layer <= k; layer++) {
        int32_t *o = opt + (layer - 2) * (d + 1);
        g[0] = 0;
        o[0] = 0;
        if (layer < k) {
            ol_layer(f, g, o, v, C, 1, d, 0, d - 1);
        } else {
            /* the last layer only needs i = d */
            ol_layer(f, g, o, v, C, d, d, 0, d - 1);
        }
        int64_t *t = f;
        f = g;
        g = t;
    }
    /* backtrack from i = d through the layers' splits */
    int64_t n = 0, i = d;
    out[n++] = v[d - 1];
    for (int64_t layer = k; layer >= 2; layer--) {
        i = opt[(layer - 2) * (d + 1) + i];
        if (i == 0) break;
        out[n++] = v[i - 1];
    }
    for (int64_t a = 0, b = n - 1; a < b; a++, b--) {
        int64_t t = out[a];
        out[a] = out[b];
        out[b] = t;
    }
    return n;
}

/* ------------------------------------------------------------------------------------ */
/* Gathering byte ranges: the one copy that moves stored rows from many Arrow buffers     */
/* (received pieces, input row groups) into one output buffer.                            */

/* dst[dst_off[i] .. + len[i]) = bases[piece[i]] + src_start[i], for i < m. Returns the
 * bytes copied, or -1 when a piece number is out of range. */
SP_API int64_t sp_gather_bytes(const uint64_t *bases, int64_t nbases, const int64_t *piece,
                               const int64_t *src_start, const int64_t *len, const int64_t *dst_off,
                               int64_t m, uint8_t *dst) {
    int64_t total = 0;
    for (int64_t i = 0; i < m; i++) {
        int64_t k = piece[i];
        if (k < 0 || k >= nbases) return -1;
        if (len[i] > 0) {
            memcpy(dst + dst_off[i], (const uint8_t *)(uintptr_t)bases[k] + src_start[i], (size_t)len[i]);
            total += len[i];
        }
    }
    return total;
}

/* ------------------------------------------------------------------------------------ */
/* The WF2Q interleave of a mixture's sources (sortpack/blend.py): which source gives the  */
/* next unit of the plan. Floating point: only comparisons of the given doubles with each  */
/* other and with integer prefixes below 2^53 (exact as doubles: the caller checks), so    */
/* the picks are those of the Python reference exactly.                                    */

/* Stream s is units offsets[s] .. offsets[s + 1] - 1 of starts/finishes/sizes, of which it
 * may give the first ends[s]. Writes the source of each pick to picks (at most cap) and
 * returns their number; -1 when cap is too small, -2 when out of memory. */
SP_API int64_t sp_wf2q(const double *starts, const double *finishes, const int64_t *sizes,
                       const int64_t *offsets, const int64_t *ends, int64_t k, double total,
                       int16_t *picks, int64_t cap) {
    int64_t *at = (int64_t *)malloc((size_t)(k > 0 ? k : 1) * sizeof(int64_t));
    int64_t *stop = (int64_t *)malloc((size_t)(k > 0 ? k : 1) * sizeof(int64_t));
    if (at == NULL || stop == NULL) {
        free(at);
        free(stop);
        return -2;
    }
    int64_t live = 0;
    for (int64_t s = 0; s < k; s++) {
        at[s] = offsets[s];
        stop[s] = offsets[s] + (ends[s] > 0 ? ends[s] : 0);
        live += ends[s] > 0;
    }
    int64_t x = 0, n = 0;
    while (live > 0) {
        int64_t best = -1, wait_src = -1;
        double best_f = INFINITY, wait = INFINITY;
        for (int64_t s = 0; s < k; s++) {
            if (at[s] >= stop[s]) continue;
            double sj = starts[at[s]];
            if (sj <= (double)x) {
                double f = finishes[at[s]];
                if (f < best_f || best < 0) { /* a started unit that never finishes (inf) beats waiting */
                    best_f = f;
                    best = s;
                }
            } else if (sj < wait) {
                wait = sj;
                wait_src = s;
            }
        }
        if (best < 0) best = wait_src; /* rounding left no unit started: the one that starts first */
        if (best < 0) break;
        int64_t m = sizes[at[best]];
        if ((double)(x + m) > total) break;
        if (n >= cap) {
            n = -1;
            break;
        }
        x += m;
        picks[n++] = (int16_t)best;
        if (++at[best] >= stop[best]) live--; /* a source that gave all it may gives no more */
    }
    free(at);
    free(stop);
    return n;
}

/* ------------------------------------------------------------------------------------ */
/* Token collate: a micro-batch's stored token ids (an Arrow list column's child values  */
/* and offsets, read in place) written into the padded or the varlen batch in one pass.  */

static inline int64_t tok_at(const void *v, int64_t vbytes, int64_t i) {
    return vbytes == 4 ? (int64_t)((const int32_t *)v)[i] : ((const int64_t *)v)[i];
}

/* rows x width ids (pad_id past each sample), labels (ids, ignore at column 0 and padding),
   lengths (tokens kept: at most width) and key_padding_mask (1 = padding); the first n
   rows are samples 0..n-1, whose tokens are values[offsets[j]:offsets[j+1]].
   Returns 0, -1 for a width of value or offset it does not know, -2 for offsets outside
   the values (checked before a sample is read). */
SP_API int64_t sp_pad_tokens(const void *values, int64_t vbytes, int64_t nvalues, const void *offsets, int64_t obytes,
                             int64_t n, int64_t rows, int64_t width, int64_t pad_id, int64_t ignore,
                             int64_t *ids, int64_t *labels, int64_t *lengths, uint8_t *kpm) {
    if ((vbytes != 4 && vbytes != 8) || (obytes != 4 && obytes != 8)) return -1;
    for (int64_t j = 0; j < rows; j++) {
        int64_t *row = ids + j * width, *lab = labels + j * width;
        uint8_t *mask = kpm + j * width;
        int64_t len = 0, start = 0;
        if (j < n) {
            start = tok_at(offsets, obytes, j);
            int64_t end = tok_at(offsets, obytes, j + 1);
            if (start < 0 || end < start || end > nvalues) return -2;
            len = end - start;
            if (len > width) len = width;
        }
        if (vbytes == 4) {  /* one pass writes both: the tokens are read once */
            const int32_t *src = (const int32_t *)values + start;
            for (int64_t t = 0; t < len; t++) row[t] = lab[t] = src[t];
        } else {
            const int64_t *src = (const int64_t *)values + start;
            for (int64_t t = 0; t < len; t++) row[t] = lab[t] = src[t];
        }
        for (int64_t t = len; t < width; t++) {
            row[t] = pad_id;
            lab[t] = ignore;
        }
        if (width > 0) lab[0] = ignore;
        memset(mask, 0, (size_t)len);
        memset(mask + len, 1, (size_t)(width - len));
        lengths[j] = len;
    }
    return 0;
}

/* A micro-batch's sample ids and real flags beside its tokens: sample_ids[j] is ids[j] (int32 or
   int64, nids of them; none when ids is NULL) and -1 after; real[j] is `real` for the n samples'
   rows and 0 for the others. */
static void fill_ids(const void *ids, int64_t ibytes, int64_t nids, int64_t n, int64_t rows, int64_t real,
                     int64_t *sample_ids, uint8_t *real_out) {
    for (int64_t j = 0; j < rows; j++) {
        sample_ids[j] = (ids != NULL && j < nids) ? tok_at(ids, ibytes, j) : -1;
        real_out[j] = (uint8_t)(j < n && real);
    }
}

/* sp_pad_tokens, plus each row's sample id and real flag (fill_ids): every output of the padded
   batch in one call, into buffers the caller allocated. The 20 arguments come as one int64
   array (a ctypes call converts each argument it is given: one pointer costs a twentieth):
   values, vbytes, nvalues, offsets, obytes, n, rows, width, pad_id, ignore, ids (0: none),
   ibytes, nids, real, then the outputs ids, labels, lengths, key_padding_mask, sample_ids, real. */
SP_API int64_t sp_pad_batch(const int64_t *a) {
    const void *ids = (const void *)(intptr_t)a[10];
    int64_t ibytes = a[11], n = a[5], rows = a[6];
    if (ids != NULL && ibytes != 4 && ibytes != 8) return -1;
    int64_t got = sp_pad_tokens((const void *)(intptr_t)a[0], a[1], a[2], (const void *)(intptr_t)a[3], a[4], n, rows,
                                a[7], a[8], a[9], (int64_t *)(intptr_t)a[14], (int64_t *)(intptr_t)a[15],
                                (int64_t *)(intptr_t)a[16], (uint8_t *)(intptr_t)a[17]);
    if (got < 0) return got;
    fill_ids(ids, ibytes, a[12], n, rows, a[13], (int64_t *)(intptr_t)a[18], (uint8_t *)(intptr_t)a[19]);
    return 0;
}

/* The varlen batch of n samples one after another, each its first min(len, cap) tokens (cap < 0:
   all): ids, labels (ignore at each sample's first token), positions (from pos_start),
   seq_idx (the sample, int32), token_mask (1), cu (int32, n + 1), lengths, seq_index (j), the
   sample ids and real flags (fill_ids). The token outputs hold at least
   offsets[n] - offsets[0] entries. stats[0] = the tokens written, stats[1] = the longest sample.
   The arguments come as one int64 array (as sp_pad_batch's): values, vbytes, nvalues, offsets,
   obytes, n, cap, ignore, pos_start, ids (0: none), ibytes, nids, real, then the outputs ids,
   labels, positions, seq_idx, token_mask, cu, lengths, seq_index, sample_ids, real, stats.
   Returns 0, -1 for an unknown width, -2 for offsets outside the values. */
SP_API int64_t sp_varlen_batch(const int64_t *a) {
    const void *values = (const void *)(intptr_t)a[0], *offsets = (const void *)(intptr_t)a[3];
    int64_t vbytes = a[1], nvalues = a[2], obytes = a[4], n = a[5], cap = a[6], ignore = a[7], pos_start = a[8];
    const void *ids = (const void *)(intptr_t)a[9];
    int64_t *out_ids = (int64_t *)(intptr_t)a[13], *labels = (int64_t *)(intptr_t)a[14];
    int64_t *pos = (int64_t *)(intptr_t)a[15];
    int32_t *seq_idx = (int32_t *)(intptr_t)a[16], *cu = (int32_t *)(intptr_t)a[18];
    uint8_t *token_mask = (uint8_t *)(intptr_t)a[17];
    int64_t *lengths = (int64_t *)(intptr_t)a[19], *seq_index = (int64_t *)(intptr_t)a[20];
    int64_t *stats = (int64_t *)(intptr_t)a[23];
    if ((vbytes != 4 && vbytes != 8) || (obytes != 4 && obytes != 8)) return -1;
    if (ids != NULL && a[10] != 4 && a[10] != 8) return -1;
    int64_t at = 0, longest = 0;
    cu[0] = 0;
    for (int64_t j = 0; j < n; j++) {
        int64_t start = tok_at(offsets, obytes, j), end = tok_at(offsets, obytes, j + 1);
        if (start < 0 || end < start || end > nvalues) return -2;
        int64_t len = end - start;
        if (cap >= 0 && len > cap) len = cap;
        int64_t *row = out_ids + at, *lab = labels + at, *p = pos + at;
        if (vbytes == 4) {
            const int32_t *src = (const int32_t *)values + start;
            for (int64_t t = 0; t < len; t++) row[t] = lab[t] = src[t];
        } else {
            const int64_t *src = (const int64_t *)values + start;
            for (int64_t t = 0; t < len; t++) row[t] = lab[t] = src[t];
        }
        if (len > 0) lab[0] = ignore;
        for (int64_t t = 0; t < len; t++) {
            p[t] = t + pos_start;
            seq_idx[at + t] = (int32_t)j;
        }
        memset(token_mask + at, 1, (size_t)len);
        at += len;
        cu[j + 1] = (int32_t)at;
        lengths[j] = len;
        seq_index[j] = j;
        if (len > longest) longest = len;
    }
    fill_ids(ids, a[10], a[11], n, n, a[12], (int64_t *)(intptr_t)a[21], (uint8_t *)(intptr_t)a[22]);
    stats[0] = at;
    stats[1] = longest;
    return 0;
}

/* The varlen layout: segment s (cu[s]..cu[s+1]) holds sample seg_sample[s]'s first
   seg_real[s] tokens then pad_id (seg_sample -1: all padding). Per token: ids, labels (ids,
   ignore at a segment's first token and at padding), position (place in the segment +
   pos_start), seq_idx (s, int32) and token_mask (1 = a sample's token). Returns 0, -1 for
   an unknown width, -2 for offsets outside the values or a segment whose real tokens exceed
   it or its sample. */
SP_API int64_t sp_varlen_tokens(const void *values, int64_t vbytes, int64_t nvalues, const void *offsets,
                                int64_t obytes,
                                int64_t nseg, const int64_t *cu, const int64_t *seg_real,
                                const int64_t *seg_sample, int64_t pad_id, int64_t ignore, int64_t pos_start,
                                int64_t *ids, int64_t *labels, int64_t *pos, int32_t *seq_idx,
                                uint8_t *token_mask) {
    if ((vbytes != 4 && vbytes != 8) || (obytes != 4 && obytes != 8)) return -1;
    for (int64_t s = 0; s < nseg; s++) {
        int64_t at = cu[s], len = cu[s + 1] - at, real = 0, start = 0;
        int64_t j = seg_sample[s];
        if (j >= 0) {
            start = tok_at(offsets, obytes, j);
            int64_t end = tok_at(offsets, obytes, j + 1);
            if (start < 0 || end < start || end > nvalues) return -2;
            real = seg_real[s];
            if (real < 0 || real > len || real > end - start) return -2;
        }
        int64_t *row = ids + at, *lab = labels + at, *p = pos + at;
        if (vbytes == 4) {
            const int32_t *src = (const int32_t *)values + start;
            for (int64_t t = 0; t < real; t++) row[t] = src[t];
        } else {
            memcpy(row, (const int64_t *)values + start, (size_t)real * sizeof(int64_t));
        }
        if (real > 0) {
            lab[0] = ignore;
            memcpy(lab + 1, row + 1, (size_t)(real - 1) * sizeof(int64_t));
        }
        for (int64_t t = real; t < len; t++) {
            row[t] = pad_id;
            lab[t] = ignore;
        }
        for (int64_t t = 0; t < len; t++) {
            p[t] = t + pos_start;
            seq_idx[at + t] = (int32_t)s;
        }
        memset(token_mask + at, 1, (size_t)real);
        memset(token_mask + at + real, 0, (size_t)(len - real));
    }
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Byte pieces of texts (sortpack/kernels/utf8.py, --size bytes --oversize split): each of */
/* rows[] (indices into starts/ends, byte offsets into data) cut greedily into pieces of   */
/* at most cap bytes; with text set, a cut never falls on a UTF-8 continuation byte        */
/* (10xxxxxx), so each piece is whole characters.                                           */

/* Writes (row, begin in the row, size) of each piece, rows in the given order and pieces in
 * order (an empty row is one piece of size 0); returns their number, -1 when out_cap is too
 * small, -2 when a character is longer than cap (its row in out_row[0]). */
SP_API int64_t sp_utf8_cuts(const uint8_t *data, const int64_t *starts, const int64_t *ends, const int64_t *rows,
                            int64_t n, int64_t cap, int64_t text, int64_t *out_row, int64_t *out_begin,
                            int64_t *out_size, int64_t out_cap) {
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = rows[i], s = starts[r], e = ends[r], pos = s;
        do {
            int64_t cut = e - pos > cap ? pos + cap : e;
            if (text) {
                while (cut > pos && cut < e && (data[cut] & 0xC0) == 0x80) cut--;
            }
            if (cut <= pos && pos < e) {
                out_row[0] = r;
                return -2;
            }
            if (m >= out_cap) return -1;
            out_row[m] = r;
            out_begin[m] = pos - s;
            out_size[m] = cut - pos;
            m++;
            pos = cut;
        } while (pos < e);
    }
    return m;
}

/* ------------------------------------------------------------------------------------ */
/* Stable LSD radix sort of uint64 codes by their bits from `shift` up (`bits` of them).  */
/* Where the low `shift` bits already rise in input order (packed sample ids numbered in  */
/* the order the codes are given), the result is the codes in ascending order: the same   */
/* as a comparison sort, in a few linear passes (one histogram read, one scatter per      */
/* digit of at most RADIX_DIGIT bits, digits every code shares skipped).                  */
/* counts: passes << width int64 words (sp_radix_passes). Returns 0 (sorted codes in out), */
/* 1 (in keys: no pass moved anything), 2 (a code has bits above shift + bits: nothing    */
/* moved), -3 (bad arguments). keys is scratch from the second pass on.                    */

#define RADIX_DIGIT 13

static int64_t radix_width(int64_t bits, int64_t *passes) {
    int64_t p = (bits + RADIX_DIGIT - 1) / RADIX_DIGIT;
    *passes = p;
    return p ? (bits + p - 1) / p : 0;
}

SP_API int64_t sp_radix_words(int64_t bits) {
    int64_t p, w = radix_width(bits, &p);
    return p << w;
}

SP_API int64_t sp_radix_sort_high(uint64_t *keys, int64_t n, int64_t shift, int64_t bits, uint64_t *out,
                                  int64_t *counts) {
    if (n < 0 || shift < 0 || bits < 0 || shift + bits > 64 || bits > 64) return -3;
    if (bits == 0 || shift == 64 || n < 2) {
        /* one value above the low bits: the input order is the sorted order, if no code has more */
        for (int64_t i = 0; i < n && shift < 64; i++)
            if (bits == 0 && (keys[i] >> shift) != 0) return 2;
        return 1;
    }
    int64_t p, w = radix_width(bits, &p);
    uint64_t mask = ((uint64_t)1 << w) - 1;
    int64_t buckets = (int64_t)1 << w;
    memset(counts, 0, (size_t)(p * buckets) * sizeof(int64_t));
    uint64_t over = bits >= 64 - shift ? 0 : ~(uint64_t)0 << bits;
    for (int64_t i = 0; i < n; i++) {
        uint64_t h = keys[i] >> shift;
        if (h & over) return 2;
        for (int64_t d = 0; d < p; d++) counts[d * buckets + (int64_t)((h >> (d * w)) & mask)]++;
    }
    uint64_t *src = keys, *dst = out;
    for (int64_t d = 0; d < p; d++) {
        int64_t *c = counts + d * buckets, total = 0, skip = 0;
        for (int64_t b = 0; b < buckets; b++) {
            if (c[b] == n) skip = 1; /* every code has this digit: the pass would move nothing */
            int64_t k = c[b];
            c[b] = total;
            total += k;
        }
        if (skip) continue;
        int s = (int)(shift + d * w);
        for (int64_t i = 0; i < n; i++) {
            uint64_t v = src[i];
            dst[c[(v >> s) & mask]++] = v;
        }
        uint64_t *t = src;
        src = dst;
        dst = t;
    }
    return src == out ? 0 : 1;
}

/* Merge two sorted runs of uint64 into buf[0, na + nb) where one of them already lies in buf:   */
/* own_first = 1: run b lies at buf + na and run a (own) elsewhere, merged from the front (a     */
/* write never passes an unread code of b); own_first = 0: run a lies at buf and run b (own)     */
/* elsewhere, merged from the back. Equal codes: a's first. No memory beyond buf.                */
SP_API int64_t sp_merge_two_in_place(uint64_t *buf, int64_t na, int64_t nb, const uint64_t *own,
                                     int64_t own_first) {
    if (na < 0 || nb < 0) return -3;
    if (own_first) {
        const uint64_t *a = own, *b = buf + na;
        int64_t i = 0, j = 0, w = 0;
        while (i < na && j < nb) buf[w++] = (b[j] < a[i]) ? b[j++] : a[i++];
        while (i < na) buf[w++] = a[i++];
        return 0; /* what is left of b is in place */
    }
    const uint64_t *a = buf, *b = own;
    int64_t i = na - 1, j = nb - 1, w = na + nb - 1;
    while (i >= 0 && j >= 0) buf[w--] = (b[j] < a[i]) ? a[i--] : b[j--];
    while (j >= 0) buf[w--] = b[j--];
    return 0; /* what is left of a is in place */
}

/* ------------------------------------------------------------------------------------ */
/* Rows composed by their targets: groups of equal-size slots (one per row at most) take   */
/* their samples, most targets first, in the order of their rows' targets elsewhere,       */
/* fewest first (ties: fewer sample index, earlier position), group after group, sweeps    */
/* times. grouped: positions by group; bounds: n_bounds + 1 group starts; scratch: 7 * the */
/* largest group. The same as compose.compose_rows' numpy loop.                             */
static void sp_sort_by2(int64_t *idx, int64_t m, const int64_t *k1, const int64_t *k2, int64_t *tmp) {
    for (int64_t i = 0; i < m; i++) idx[i] = i;
    for (int64_t width = 1; width < m; width *= 2) { /* bottom-up merge sort: stable */
        for (int64_t lo = 0; lo < m; lo += 2 * width) {
            int64_t mid = lo + width < m ? lo + width : m, hi = lo + 2 * width < m ? lo + 2 * width : m;
            int64_t i = lo, j = mid, w = lo;
            while (i < mid && j < hi) {
                int64_t a = idx[i], b = idx[j];
                int take_b = k1[b] < k1[a] || (k1[b] == k1[a] && k2[b] < k2[a]);
                tmp[w++] = take_b ? idx[j++] : idx[i++];
            }
            while (i < mid) tmp[w++] = idx[i++];
            while (j < hi) tmp[w++] = idx[j++];
        }
        memcpy(idx, tmp, (size_t)m * sizeof(int64_t));
    }
}

SP_API int64_t sp_compose_groups(int64_t *slot, const int64_t *row, const int64_t *targets, int64_t *total,
                                 const int64_t *grouped, const int64_t *bounds, int64_t n_bounds, int64_t sweeps,
                                 int64_t *scratch) {
    if (n_bounds < 0 || sweeps < 0) return -3;
    for (int64_t sweep = 0; sweep < sweeps; sweep++) {
        for (int64_t g = 0; g < n_bounds; g++) {
            int64_t a = bounds[g], m = bounds[g + 1] - a;
            if (m < 2) continue;
            int64_t *negt = scratch, *held = scratch + m, *rest = scratch + 2 * m, *at = scratch + 3 * m;
            int64_t *by_s = scratch + 4 * m, *by_p = scratch + 5 * m, *tmp = scratch + 6 * m;
            for (int64_t i = 0; i < m; i++) {
                at[i] = grouped[a + i];
                held[i] = slot[at[i]];
                negt[i] = -targets[held[i]];
                rest[i] = total[row[at[i]]] - targets[held[i]];
            }
            sp_sort_by2(by_s, m, negt, held, tmp);
            sp_sort_by2(by_p, m, rest, at, tmp);
            for (int64_t k = 0; k < m; k++) {
                int64_t p = by_p[k], s = held[by_s[k]];
                slot[at[p]] = s;
                total[row[at[p]]] = rest[p] + targets[s];
            }
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* The fewest targets of a subset of each row's samples whose rooms sum to exactly s, for  */
/* s in [0, top]: a 0/1 knapsack per row. rooms, targets: (n, k) row-major, room 0 = no    */
/* sample; out: (n, top + 1), none where no subset has that room.                          */
SP_API int64_t sp_min_subsets(const int64_t *rooms, const int64_t *targets, int64_t n, int64_t k, int64_t top,
                              int64_t none, int64_t *out) {
    if (n < 0 || k < 0 || top < 0) return -3;
    for (int64_t i = 0; i < n; i++) {
        int64_t *f = out + i * (top + 1);
        f[0] = 0;
        for (int64_t s = 1; s <= top; s++) f[s] = none;
        int64_t reach = 0; /* the largest room any subset so far has */
        for (int64_t j = 0; j < k; j++) {
            int64_t r = rooms[i * k + j], t = targets[i * k + j];
            if (r <= 0 || r > top) continue;
            int64_t hi = reach + r < top ? reach + r : top;
            for (int64_t s = hi; s >= r; s--) { /* downwards: each sample once */
                int64_t c = f[s - r];
                if (c != none && c + t < f[s]) f[s] = c + t;
            }
            reach = hi;
        }
    }
    return 0;
}

/* ------------------------------------------------------------------------------------ */
/* Items dealt to k parts of equal count and balanced cost (kernels/deal.py): the largest   */
/* differencing method over groups of k items. Items sorted by (cost desc, index asc); each  */
/* run of k is a state of k parts, one item each. The state of largest spread (ties: lowest */
/* id) is merged with the next: its i-th heaviest part takes the other's i-th lightest, and  */
/* the parts are re-sorted (sum desc, ties by place). A part's items are found through the  */
/* part each merged part joined (parent), resolved at the end. part[item] = the final rank   */
/* of its part (0: the heaviest). m % k == 0; returns 0, -1 (bad sizes), -2 (no memory).     */

typedef struct { double c; int64_t i; } dl_item;

static int dl_item_cmp(const void *pa, const void *pb) {
    const dl_item *a = (const dl_item *)pa, *b = (const dl_item *)pb;
    if (a->c != b->c) return a->c > b->c ? -1 : 1;
    return a->i < b->i ? -1 : (a->i > b->i);
}

static int dl_item_asc(const void *pa, const void *pb) { /* cost asc, ties by index */
    const dl_item *a = (const dl_item *)pa, *b = (const dl_item *)pb;
    if (a->c != b->c) return a->c < b->c ? -1 : 1;
    return a->i < b->i ? -1 : (a->i > b->i);
}

typedef struct { double spread; int64_t id; } dl_key;

static inline int dl_before(dl_key a, dl_key b) { /* a pops first */
    return a.spread > b.spread || (a.spread == b.spread && a.id < b.id);
}

static void dl_push(dl_key *h, int64_t *n, dl_key x) {
    int64_t j = (*n)++;
    while (j > 0) {
        int64_t p = (j - 1) / 2;
        if (!dl_before(x, h[p])) break;
        h[j] = h[p]; j = p;
    }
    h[j] = x;
}

static dl_key dl_pop(dl_key *h, int64_t *n) {
    dl_key top = h[0], x = h[--(*n)];
    int64_t j = 0;
    for (;;) {
        int64_t a = 2 * j + 1, b = a + 1, c = j;
        dl_key best = x;
        if (a < *n && dl_before(h[a], best)) { c = a; best = h[a]; }
        if (b < *n && dl_before(h[b], best)) { c = b; }
        if (c == j) break;
        h[j] = h[c]; j = c;
    }
    if (*n > 0) h[j] = x;
    return top;
}

/* Swaps after the deal (kernels/deal.py, ``_swaps_numpy`` step for step): while the heaviest part is more than
 * ``tight`` (relative) over the mean, one of its items is swapped with one of the first of the ``lightest``
 * lightest parts that lowers it: the pair whose costs differ nearest half the two parts' gap, within (0, gap).
 * Items from ``real`` on never move. held: k rows of m / k items, each row by (cost, index). */
static int dl_less(const double *cost, int64_t a, int64_t b) {
    return cost[a] < cost[b] || (cost[a] == cost[b] && a < b);
}

static void dl_resort(const double *cost, int64_t *row, int64_t c, int64_t at) {
    int64_t v = row[at];
    while (at > 0 && dl_less(cost, v, row[at - 1])) { row[at] = row[at - 1]; at--; }
    while (at < c - 1 && dl_less(cost, row[at + 1], v)) { row[at] = row[at + 1]; at++; }
    row[at] = v;
}

static double dl_total(const double *sums, int64_t k) {
    double t = 0.0;
    for (int64_t i = 0; i < k; i++) t += sums[i];
    return t;
}

/* the best swap of row ``mine`` (heavier) with ``theirs`` for a gap: its places and what moves (-1: none) */
static int64_t dl_best_swap(const double *cost, const int64_t *mine, const int64_t *theirs, int64_t c, double gap,
                            int64_t real, int64_t *y_out, double *moved_out) {
    int64_t bx = -1, by = -1;
    double best = gap, bmoved = 0.0;
    for (int pass = 0; pass < 2; pass++) {
        int64_t jx = -1, jy = -1;
        double jw = INFINITY, jm = 0.0;
        for (int64_t x = 0; x < c; x++) {
            double want = cost[mine[x]] - gap / 2;
            int64_t lo = 0, hi = c; /* the first place whose cost is not below want */
            while (lo < hi) { int64_t mid = (lo + hi) / 2; if (cost[theirs[mid]] < want) lo = mid + 1; else hi = mid; }
            int64_t y = pass == 0 ? (lo - 1 > 0 ? lo - 1 : 0) : (lo < c - 1 ? lo : c - 1);
            double moved = cost[mine[x]] - cost[theirs[y]];
            int ok = moved > 0 && moved < gap && mine[x] < real && theirs[y] < real;
            double w = ok ? (gap - moved > moved ? gap - moved : moved) : INFINITY;
            if (w < jw) { jw = w; jx = x; jy = y; jm = moved; }
        }
        if (jx >= 0 && jw < best) { best = jw; bx = jx; by = jy; bmoved = jm; }
    }
    *y_out = by;
    *moved_out = bmoved;
    return bx;
}

static void dl_swaps(const double *cost, int64_t m, int64_t k, int64_t real, int64_t rounds, double tight,
                     int64_t lightest, int64_t *held, double *sums, int64_t *part) {
    int64_t c = m / k;
    for (int64_t r = 0; r < k; r++) {
        double t = 0.0;
        for (int64_t j = 0; j < c; j++) t += cost[held[r * c + j]];
        sums[r] = t;
    }
    int64_t light[8];
    if (lightest > 8) lightest = 8;
    for (int64_t round = 0; round < rounds; round++) {
        int64_t h = 0;
        for (int64_t r = 1; r < k; r++) if (sums[r] > sums[h]) h = r;
        double mean = dl_total(sums, k) / (double)k;
        if (sums[h] - mean <= mean * tight) break;
        int64_t nl = 0; /* the lightest parts, ties by index */
        for (int64_t r = 0; r < k; r++) {
            int64_t at = nl < lightest ? nl++ : lightest;
            if (at == lightest) { if (!(sums[r] < sums[light[lightest - 1]])) continue; at = lightest - 1; }
            while (at > 0 && sums[r] < sums[light[at - 1]]) { light[at] = light[at - 1]; at--; }
            light[at] = r;
        }
        int swapped = 0;
        for (int64_t i = 0; i < nl && !swapped; i++) {
            int64_t l = light[i], y;
            double moved;
            int64_t x = dl_best_swap(cost, held + h * c, held + l * c, c, sums[h] - sums[l], real, &y, &moved);
            if (x < 0) continue;
            int64_t a = held[h * c + x];
            held[h * c + x] = held[l * c + y];
            held[l * c + y] = a;
            dl_resort(cost, held + h * c, c, x);
            dl_resort(cost, held + l * c, c, y);
            sums[h] -= moved;
            sums[l] += moved;
            swapped = 1;
        }
        if (!swapped) break;
    }
    for (int64_t r = 0; r < k; r++)
        for (int64_t j = 0; j < c; j++) part[held[r * c + j]] = r;
}

SP_API int64_t sp_deal_equal(const double *cost, int64_t m, int64_t k, int64_t real, int64_t rounds, double tight,
                             int64_t lightest, int64_t *part) {
    if (k < 1 || m < 0 || m % k) return -1;
    if (m == 0) return 0;
    int64_t g = m / k;
    dl_item *items = malloc(sizeof(dl_item) * (size_t)m);
    dl_item *merged = malloc(sizeof(dl_item) * (size_t)k);
    int64_t *set = malloc(sizeof(int64_t) * (size_t)m);     /* state s, place j: its part (a sorted position) */
    double *sum = malloc(sizeof(double) * (size_t)m);       /* and the part's sum */
    int64_t *parent = malloc(sizeof(int64_t) * (size_t)m);  /* a part merged into another: that one */
    int64_t *rank = malloc(sizeof(int64_t) * (size_t)m);    /* a final part: its rank */
    int64_t *tmp = malloc(sizeof(int64_t) * (size_t)k);
    dl_key *heap = malloc(sizeof(dl_key) * (size_t)g);
    int64_t status = 0, nh = 0;
    if (!items || !merged || !set || !sum || !parent || !rank || !tmp || !heap) { status = -2; goto done; }
    for (int64_t i = 0; i < m; i++) { items[i].c = cost[i]; items[i].i = i; }
    qsort(items, (size_t)m, sizeof(dl_item), dl_item_cmp);
    for (int64_t i = 0; i < m; i++) { set[i] = i; sum[i] = items[i].c; parent[i] = i; }
    for (int64_t s = 0; s < g; s++) {
        dl_key key = {sum[s * k] - sum[s * k + k - 1], s};
        dl_push(heap, &nh, key);
    }
    while (nh > 1) {
        int64_t a = dl_pop(heap, &nh).id, b = dl_pop(heap, &nh).id;
        int64_t *sa = set + a * k, *sb = set + b * k;
        double *ua = sum + a * k, *ub = sum + b * k;
        for (int64_t i = 0; i < k; i++) {
            parent[sb[k - 1 - i]] = sa[i];
            merged[i].c = ua[i] + ub[k - 1 - i];
            merged[i].i = i;
        }
        qsort(merged, (size_t)k, sizeof(dl_item), dl_item_cmp); /* sum desc, ties by place: stable */
        for (int64_t i = 0; i < k; i++) tmp[i] = sa[merged[i].i];
        for (int64_t i = 0; i < k; i++) { sa[i] = tmp[i]; ua[i] = merged[i].c; }
        dl_key key = {ua[0] - ua[k - 1], a};
        dl_push(heap, &nh, key);
    }
    int64_t last = heap[0].id;
    for (int64_t j = 0; j < k; j++) rank[set[last * k + j]] = j;
    for (int64_t i = 0; i < m; i++) {
        int64_t r = i;
        while (parent[r] != r) r = parent[r];
        for (int64_t x = i; parent[x] != r;) { int64_t nx = parent[x]; parent[x] = r; x = nx; }
        part[items[i].i] = rank[r];
    }
    if (rounds > 0 && k > 1) {
        /* each part's items by (cost, index), reusing set (m) and sum (k) */
        int64_t c = m / k, *fill = tmp;
        for (int64_t r = 0; r < k; r++) fill[r] = 0;
        for (int64_t i = 0; i < m; i++) set[part[i] * c + fill[part[i]]++] = i;
        for (int64_t r = 0; r < k; r++) {
            for (int64_t j = 0; j < c; j++) { items[j].c = cost[set[r * c + j]]; items[j].i = set[r * c + j]; }
            qsort(items, (size_t)c, sizeof(dl_item), dl_item_asc);
            for (int64_t j = 0; j < c; j++) set[r * c + j] = items[j].i;
        }
        dl_swaps(cost, m, k, real, rounds, tight, lightest, set, sum, part);
    }
done:
    free(items); free(merged); free(set); free(sum); free(parent); free(rank); free(tmp); free(heap);
    return status;
}

/* ------------------------------------------------------------------------------------ */
/* An empty module, so that the file is a valid extension for setuptools to build.       */

static struct PyModuleDef ckernels_module = {
    PyModuleDef_HEAD_INIT, "_ckernels",
    "Compiled kernels of sortpack.kernels, called through ctypes.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__ckernels(void) { return PyModule_Create(&ckernels_module); }
