/* The byte-level BPE of texts split by GPT-2's, Llama 3's or Qwen 2's pattern (sortpack/kernels/bpe.py).
 *
 * Built as a Python extension only so that setuptools compiles and installs it next to the package;
 * the module is empty and the functions are called through ctypes, with the GIL released. Kept apart
 * from _ckernels.c: the tokenizer path has its own table, its own ABI number and its own tests.
 *
 * A table of token bytes -> rank (open addressing, FNV-1a), then per text: the pattern's pieces found
 * by hand over UTF-8 (each code point's class, letter, number, whitespace or other, from the class
 * table bpe.py passes in, which sortpack/kernels/unicode_classes.py generates from the regex engines),
 * each piece a token when it is one, else merged as tiktoken does: the adjacent pair whose
 * concatenation has the lowest rank, the leftmost of equals, until no pair is a token. A short piece
 * rescans its pairs after each merge; a long one keeps its pairs in a heap over linked parts, so no
 * piece costs more than O(n log n).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define SP_API __declspec(dllexport)
#else
#define SP_API __attribute__((visibility("default")))
#endif

/* Bumped whenever a signature or a semantic changes: bpe.py ignores a stale in-place build. */
#define SP_BPE_ABI_VERSION 1
#define BPE_CODE_POINTS 0x110000
#define BPE_HEAP_MIN 64 /* pieces of this many bytes or more merge through the heap */

SP_API int64_t sp_bpe_abi_version(void) { return SP_BPE_ABI_VERSION; }

typedef struct {
    int64_t slots;    /* a power of two */
    int64_t *key;     /* offset of the key in arena; -1: empty */
    int32_t *len;
    int64_t *rank;
    uint8_t *arena;
    int64_t longest;
    uint8_t *classes; /* each code point's class (BPE_OTHER...), NULL: texts with a byte above 127 left out */
    int64_t heap_min;
    int32_t single[256]; /* the rank of each one-byte token, -1: none */
    int32_t *pair;       /* the rank of each two-byte token by (p[0] << 8 | p[1]), -1: none (most lookups) */
} bpe_table;

/* FNV-1a, then a full avalanche (MurmurHash3's finalizer): the table takes the low bits, and FNV alone leaves
 * the pairs of one script's two-byte characters in long runs of neighbouring slots */
static inline uint64_t bpe_hash(const uint8_t *p, int64_t n) {
    uint64_t h = 1469598103934665603ULL;
    for (int64_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

static inline int64_t bpe_find(const bpe_table *t, const uint8_t *p, int64_t n) {
    if (n == 2) return t->pair[(p[0] << 8) | p[1]];
    if (n == 1) return t->single[p[0]];
    if (n > t->longest) return -1;
    uint64_t m = (uint64_t)t->slots - 1, at = bpe_hash(p, n) & m;
    for (;;) {
        int64_t k = t->key[at];
        if (k < 0) return -1;
        if (t->len[at] == n && memcmp(t->arena + k, p, (size_t)n) == 0) return t->rank[at];
        at = (at + 1) & m;
    }
}

SP_API void sp_bpe_free(void *table) {
    bpe_table *t = (bpe_table *)table;
    if (!t) return;
    free(t->key); free(t->len); free(t->rank); free(t->arena); free(t->classes); free(t->pair); free(t);
}

/* keys: the tokens' bytes one after another, offsets[n + 1] where each starts; ranks in [0, 2^31); classes:
 * BPE_CODE_POINTS bytes (copied) or NULL. NULL when out of memory, a token repeats or a rank is out of range. */
SP_API void *sp_bpe_new(const uint8_t *keys, const int64_t *offsets, const int64_t *ranks, int64_t n,
                        const uint8_t *classes) {
    if (n < 0) return NULL;
    bpe_table *t = (bpe_table *)calloc(1, sizeof(bpe_table));
    if (!t) return NULL;
    int64_t slots = 16;
    while (slots < 2 * n) slots <<= 1;
    t->slots = slots;
    t->heap_min = BPE_HEAP_MIN;
    t->key = (int64_t *)malloc((size_t)slots * sizeof(int64_t));
    t->len = (int32_t *)malloc((size_t)slots * sizeof(int32_t));
    t->rank = (int64_t *)malloc((size_t)slots * sizeof(int64_t));
    t->arena = (uint8_t *)malloc((size_t)(offsets[n] > 0 ? offsets[n] : 1));
    t->pair = (int32_t *)malloc(65536 * sizeof(int32_t));
    if (!t->key || !t->len || !t->rank || !t->arena || !t->pair) { sp_bpe_free(t); return NULL; }
    for (int i = 0; i < 65536; i++) t->pair[i] = -1;
    for (int i = 0; i < 256; i++) t->single[i] = -1;
    if (classes) {
        t->classes = (uint8_t *)malloc(BPE_CODE_POINTS);
        if (!t->classes) { sp_bpe_free(t); return NULL; }
        memcpy(t->classes, classes, BPE_CODE_POINTS);
    }
    memcpy(t->arena, keys, (size_t)offsets[n]);
    for (int64_t i = 0; i < slots; i++) t->key[i] = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t a = offsets[i], len = offsets[i + 1] - a;
        if (len <= 0 || len > INT32_MAX || ranks[i] < 0 || ranks[i] > INT32_MAX || bpe_find(t, t->arena + a, len) >= 0) {
            sp_bpe_free(t);
            return NULL;
        }
        uint64_t at = bpe_hash(t->arena + a, len) & (uint64_t)(slots - 1);
        while (t->key[at] >= 0) at = (at + 1) & (uint64_t)(slots - 1);
        t->key[at] = a; t->len[at] = (int32_t)len; t->rank[at] = ranks[i];
        if (len > t->longest) t->longest = len;
        if (len == 1) t->single[t->arena[a]] = (int32_t)ranks[i];
        if (len == 2) t->pair[(t->arena[a] << 8) | t->arena[a + 1]] = (int32_t)ranks[i];
    }
    return t;
}

/* the piece length from which merges go through the heap (tests set 2 to run every piece through it) */
SP_API void sp_bpe_heap_min(void *table, int64_t bytes) { ((bpe_table *)table)->heap_min = bytes < 2 ? 2 : bytes; }

/* ------------------------------------------------------------------------------------ */
/* Merging one piece                                                                      */

typedef struct {
    int64_t *pos, *rk, cap;           /* the short merge: part starts, pair ranks */
    uint32_t *next, *prev, *rk32;     /* the heap merge: linked parts, the rank of the pair each part begins */
    uint64_t *heap;                   /* (rank << 32 | start) of the pairs that are tokens: the lowest, leftmost first */
    int64_t heap_cap;
    struct bpe_memo *memo;            /* the pieces merged lately (NULL until the first) */
} bpe_scratch;

/* Text repeats its words: a piece merged once in this call is looked up the next time (its ids are in out
 * already, its bytes in data). Direct-mapped, a slot overwritten on collision; pieces up to BPE_MEMO_LONGEST. */
#define BPE_MEMO_SLOTS 16384
#define BPE_MEMO_LONGEST 96
struct bpe_memo { const uint8_t *p; int64_t n, at, count; };

static int bpe_grow(void **array, int64_t count, size_t width) {
    void *grown = realloc(*array, (size_t)count * width);
    if (!grown) return -1;
    *array = grown;
    return 0;
}

static int bpe_reserve(bpe_scratch *s, int64_t n, int heap) {
    if (!heap && n + 1 > s->cap) {
        if (bpe_grow((void **)&s->pos, 2 * (n + 1), sizeof(int64_t)) < 0
            || bpe_grow((void **)&s->rk, 2 * (n + 1), sizeof(int64_t)) < 0) return -1;
        s->cap = 2 * (n + 1);
    }
    if (heap && n + 1 > s->heap_cap) { /* as long as this piece: 20 bytes a byte (a long piece is rare) */
        int64_t cap = n + 1;
        if (bpe_grow((void **)&s->next, cap, sizeof(uint32_t)) < 0 || bpe_grow((void **)&s->prev, cap, sizeof(uint32_t)) < 0
            || bpe_grow((void **)&s->rk32, cap, sizeof(uint32_t)) < 0
            || bpe_grow((void **)&s->heap, 2 * cap, sizeof(uint64_t)) < 0) return -1;
        s->heap_cap = cap;
    }
    return 0;
}

static void bpe_scratch_free(bpe_scratch *s) {
    free(s->pos); free(s->rk); free(s->next); free(s->prev); free(s->rk32); free(s->heap); free(s->memo);
}

/* the rank of p[a .. b) as one token, INT64_MAX when it is none */
static inline int64_t bpe_rank(const bpe_table *t, const uint8_t *p, int64_t a, int64_t b) {
    int64_t r = bpe_find(t, p + a, b - a);
    return r < 0 ? INT64_MAX : r;
}

/* the tokens of the linked parts p[k .. next[k]) appended at out[*o]; -2 when a part is no token */
static int bpe_emit_linked(const bpe_table *t, const uint8_t *p, const uint32_t *next, int64_t n, int32_t *out,
                           int64_t *o) {
    for (int64_t k = 0; k < n; k = next[k]) {
        int64_t r = bpe_find(t, p + k, (int64_t)next[k] - k);
        if (r < 0) return -2;
        if (out) out[*o] = (int32_t)r;
        (*o)++;
    }
    return 0;
}

/* O(n^2) but tight: after each merge, rescan the pairs for the lowest rank (pieces of a few bytes) */
static int bpe_merge_short(const bpe_table *t, const uint8_t *p, int64_t n, bpe_scratch *s, int32_t *out, int64_t *o) {
    int64_t *pos = s->pos, *rk = s->rk, m = n; /* m parts; part k is p[pos[k] .. pos[k + 1]) */
    for (int64_t k = 0; k <= n; k++) pos[k] = k;
    for (int64_t k = 0; k + 1 < m; k++) rk[k] = bpe_rank(t, p, k, k + 2);
    for (;;) {
        int64_t best = INT64_MAX, k = -1;
        for (int64_t j = 0; j + 1 < m; j++)
            if (rk[j] < best) { best = rk[j]; k = j; }
        if (k < 0) break;
        /* parts k and k + 1 become one: its boundary goes, and the pairs on either side are looked up again */
        memmove(pos + k + 1, pos + k + 2, (size_t)(m - k - 1) * sizeof(int64_t));
        if (k + 2 < m) memmove(rk + k + 1, rk + k + 2, (size_t)(m - k - 2) * sizeof(int64_t));
        m--;
        if (k + 1 < m) rk[k] = bpe_rank(t, p, pos[k], pos[k + 2]);
        if (k > 0) rk[k - 1] = bpe_rank(t, p, pos[k - 1], pos[k + 1]);
    }
    for (int64_t k = 0; k < m; k++) {
        int64_t r = bpe_find(t, p + pos[k], pos[k + 1] - pos[k]);
        if (r < 0) return -2;
        if (out) out[*o] = (int32_t)r;
        (*o)++;
    }
    return 0;
}

#define BPE_NONE UINT32_MAX /* no pair, or a part merged away (ranks are below 2^31) */

static inline uint32_t bpe_rank32(const bpe_table *t, const uint8_t *p, int64_t a, int64_t b) {
    int64_t r = bpe_find(t, p + a, b - a);
    return r < 0 ? BPE_NONE : (uint32_t)r;
}

static void bpe_down(uint64_t *heap, int64_t size, int64_t i) {
    uint64_t x = heap[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= size) break;
        if (c + 1 < size && heap[c + 1] < heap[c]) c++;
        if (heap[c] >= x) break;
        heap[i] = heap[c];
        i = c;
    }
    heap[i] = x;
}

static void bpe_push(uint64_t *heap, int64_t *size, uint64_t key) {
    int64_t i = (*size)++;
    while (i > 0 && key < heap[(i - 1) / 2]) { heap[i] = heap[(i - 1) / 2]; i = (i - 1) / 2; }
    heap[i] = key;
}

/* O(n log n): parts linked by their starts; the pairs that are tokens in a heap by (rank, start), an entry
 * stale once its start's pair changed (rk32 holds each start's current pair rank); each merge adds at most the
 * two pairs around the new part, so the heap holds fewer than 2n entries */
static int bpe_merge_heap(const bpe_table *t, const uint8_t *p, int64_t n, bpe_scratch *s, int32_t *out, int64_t *o) {
    uint32_t *next = s->next, *prev = s->prev, *rk = s->rk32;
    uint64_t *heap = s->heap;
    int64_t size = 0;
    for (int64_t k = 0; k < n; k++) {
        next[k] = (uint32_t)(k + 1); prev[k] = (uint32_t)(k - 1);
        rk[k] = k + 2 <= n ? bpe_rank32(t, p, k, k + 2) : BPE_NONE;
        if (rk[k] != BPE_NONE) heap[size++] = ((uint64_t)rk[k] << 32) | (uint64_t)k;
    }
    for (int64_t i = size / 2 - 1; i >= 0; i--) bpe_down(heap, size, i);
    while (size > 0) {
        uint64_t top = heap[0];
        heap[0] = heap[--size];
        if (size > 0) bpe_down(heap, size, 0);
        uint32_t k = (uint32_t)top;
        if (rk[k] != (uint32_t)(top >> 32)) continue; /* stale */
        uint32_t j = next[k], after = next[j];
        next[k] = after;
        if (after < n) prev[after] = k;
        rk[j] = BPE_NONE;
        rk[k] = after < n ? bpe_rank32(t, p, k, next[after]) : BPE_NONE;
        if (rk[k] != BPE_NONE) bpe_push(heap, &size, ((uint64_t)rk[k] << 32) | k);
        if (k > 0) {
            uint32_t before = prev[k];
            rk[before] = bpe_rank32(t, p, before, after);
            if (rk[before] != BPE_NONE) bpe_push(heap, &size, ((uint64_t)rk[before] << 32) | before);
        }
    }
    return bpe_emit_linked(t, p, next, n, out, o);
}

/* the tokens of one piece appended at out[*o] (out NULL: counted only); 0, or -1 (no memory), -2 (a byte is no token),
 * -4 (a piece of 2 GiB or more) */
static int bpe_merge(const bpe_table *t, const uint8_t *p, int64_t n, bpe_scratch *s, int32_t *out, int64_t *o) {
    int heap = n >= t->heap_min;
    if (n >= INT32_MAX) return -4;
    if (bpe_reserve(s, n, heap) < 0) return -1;
    return heap ? bpe_merge_heap(t, p, n, s, out, o) : bpe_merge_short(t, p, n, s, out, o);
}

static int bpe_piece(const bpe_table *t, const uint8_t *p, int64_t n, bpe_scratch *s, int32_t *out, int64_t *o) {
    int64_t whole = bpe_find(t, p, n);
    if (whole >= 0) {
        if (out) out[*o] = (int32_t)whole;
        (*o)++;
        return 0;
    }
    if (n > BPE_MEMO_LONGEST) return bpe_merge(t, p, n, s, out, o);
    if (!s->memo && !(s->memo = (struct bpe_memo *)calloc(BPE_MEMO_SLOTS, sizeof(struct bpe_memo)))) return -1;
    struct bpe_memo *m = s->memo + (bpe_hash(p, n) & (BPE_MEMO_SLOTS - 1));
    if (m->n == n && memcmp(m->p, p, (size_t)n) == 0 && (m->at >= 0 || !out)) {
        if (out) memcpy(out + *o, out + m->at, (size_t)m->count * sizeof(int32_t));
        *o += m->count;
        return 0;
    }
    int64_t first = *o;
    int r = bpe_merge(t, p, n, s, out, o);
    if (r == 0) { m->p = p; m->n = n; m->at = out ? first : -1; m->count = *o - first; }
    return r;
}

/* ------------------------------------------------------------------------------------ */
/* The patterns' pieces over UTF-8                                                        */

enum { BPE_OTHER = 0, BPE_LETTER = 1, BPE_DIGIT = 2, BPE_SPACE = 3 };

static inline int bpe_ascii_class(uint8_t c) {
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return BPE_LETTER;
    if (c >= '0' && c <= '9') return BPE_DIGIT;
    if (c == ' ' || (c >= 9 && c <= 13)) return BPE_SPACE; /* \t \n \v \f \r: Unicode White_Space in ASCII */
    return BPE_OTHER;
}

/* the class of the code point at p[i] (valid UTF-8), its length in *len */
static inline int bpe_class_at(const bpe_table *t, const uint8_t *p, int64_t i, int64_t *len) {
    uint8_t c = p[i];
    if (c < 0x80) { *len = 1; return bpe_ascii_class(c); }
    uint32_t cp;
    if (c < 0xE0) { *len = 2; cp = ((uint32_t)(c & 0x1F) << 6) | (p[i + 1] & 0x3F); }
    else if (c < 0xF0) { *len = 3; cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(p[i + 1] & 0x3F) << 6) | (p[i + 2] & 0x3F); }
    else {
        *len = 4;
        cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(p[i + 1] & 0x3F) << 12) | ((uint32_t)(p[i + 2] & 0x3F) << 6)
             | (p[i + 3] & 0x3F);
    }
    return t->classes[cp];
}

static inline int bpe_class_of(const bpe_table *t, const uint8_t *p, int64_t i) {
    int64_t len;
    return bpe_class_at(t, p, i, &len);
}

static inline int bpe_crlf(uint8_t c) { return c == '\r' || c == '\n'; }

/* a run of code points of class k from p[b]: its end */
static inline int64_t bpe_run(const bpe_table *t, const uint8_t *p, int64_t b, int64_t n, int k) {
    int64_t len;
    while (b < n && bpe_class_at(t, p, b, &len) == k) b += len;
    return b;
}

/* "\s+(?!\S)|\s+" from the whitespace at p[a]: the run, less its last code point when a non-space follows it */
static int64_t bpe_spaces(const bpe_table *t, const uint8_t *p, int64_t a, int64_t n) {
    int64_t b = a, last = a, count = 0, len;
    while (b < n && bpe_class_at(t, p, b, &len) == BPE_SPACE) { last = b; b += len; count++; }
    return (b < n && count >= 2) ? last : b;
}

/* the end of the piece at p[a] (a < n) under GPT-2's pattern:
 * 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
static int64_t bpe_piece_gpt2(const bpe_table *t, const uint8_t *p, int64_t a, int64_t n) {
    uint8_t c = p[a];
    if (c == '\'' && a + 1 < n && (p[a + 1] == 's' || p[a + 1] == 't' || p[a + 1] == 'm' || p[a + 1] == 'd'))
        return a + 2;
    if (c == '\'' && a + 2 < n && ((p[a + 1] == 'r' && p[a + 2] == 'e') || (p[a + 1] == 'v' && p[a + 2] == 'e')
                                   || (p[a + 1] == 'l' && p[a + 2] == 'l')))
        return a + 3;
    /* " ?X+" for X letters, numbers or the rest: one space may lead a run of one class */
    int64_t run = (c == ' ' && a + 1 < n && bpe_class_of(t, p, a + 1) != BPE_SPACE) ? a + 1 : a, len;
    int k = bpe_class_at(t, p, run, &len);
    return k == BPE_SPACE ? bpe_spaces(t, p, a, n) : bpe_run(t, p, run + len, n, k);
}

/* Llama 3's and Qwen 2's "(?i:'s|'t|'re|'ve|'m|'ll|'d)" at p[a]: its end, or a when none. Case-insensitive
 * in both regex engines means ASCII case and U+017F (long s, UTF-8 C5 BF) for s: no other code point folds
 * to these letters. */
static int64_t bpe_contraction(const uint8_t *p, int64_t a, int64_t n) {
    if (p[a] != '\'' || a + 1 >= n) return a;
    if (p[a + 1] == 0xC5 && a + 2 < n && p[a + 2] == 0xBF) return a + 3;
    if (bpe_ascii_class(p[a + 1]) != BPE_LETTER) return a;
    uint8_t d = p[a + 1] | 0x20; /* lower case: a letter's */
    if (d == 's' || d == 't' || d == 'm' || d == 'd') return a + 2;
    if (a + 2 < n && bpe_ascii_class(p[a + 2]) == BPE_LETTER) {
        uint8_t e = p[a + 2] | 0x20;
        if ((d == 'r' && e == 'e') || (d == 'v' && e == 'e') || (d == 'l' && e == 'l')) return a + 3;
    }
    return a;
}

/* the end of the piece at p[a] (a < n) under Llama 3's pattern (digits = 3) or Qwen 2's (digits = 1):
 * (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+
 * |\s+(?!\S)|\s+ */
static int64_t bpe_piece_llama3(const bpe_table *t, const uint8_t *p, int64_t a, int64_t n, int64_t digits) {
    int64_t b = bpe_contraction(p, a, n), len, first;
    if (b > a) return b;
    uint8_t c = p[a];
    int k = bpe_class_at(t, p, a, &first);
    /* letters, led by at most one code point that is no letter, number, \r or \n */
    if (k == BPE_LETTER || (k != BPE_DIGIT && !bpe_crlf(c) && a + first < n
                            && bpe_class_of(t, p, a + first) == BPE_LETTER))
        return bpe_run(t, p, a + first, n, BPE_LETTER);
    if (k == BPE_DIGIT) {
        b = a + first;
        for (int64_t count = 1; b < n && count < digits && bpe_class_at(t, p, b, &len) == BPE_DIGIT; count++) b += len;
        return b;
    }
    /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
    int64_t run = (c == ' ' && a + 1 < n && bpe_class_of(t, p, a + 1) == BPE_OTHER) ? a + 1 : a;
    if (bpe_class_at(t, p, run, &len) == BPE_OTHER) {
        b = bpe_run(t, p, run + len, n, BPE_OTHER);
        while (b < n && bpe_crlf(p[b])) b++;
        return b;
    }
    /* "\s*[\r\n]+": the whitespace run up to its last \r or \n; else GPT-2's two whitespace rules */
    int64_t last = -1;
    for (b = a; b < n && bpe_class_at(t, p, b, &len) == BPE_SPACE; b += len)
        if (bpe_crlf(p[b])) last = b;
    return last >= 0 ? last + 1 : bpe_spaces(t, p, a, n);
}

/* 1: p[0 .. n) is ASCII; 2: valid UTF-8 with a byte above 127; 0: not UTF-8 (an overlong form, a surrogate,
 * a code point past U+10FFFF, a cut sequence) */
static int bpe_utf8(const uint8_t *p, int64_t n) {
    int64_t i = 0;
    while (i < n && p[i] < 0x80) i++;
    if (i == n) return 1;
    while (i < n) {
        uint8_t c = p[i];
        if (c < 0x80) { i++; continue; }
        int64_t len = c >= 0xC2 && c <= 0xDF ? 2 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xF0 && c <= 0xF4 ? 4 : 0;
        if (len == 0 || i + len > n) return 0;
        for (int64_t j = 1; j < len; j++)
            if ((p[i + j] & 0xC0) != 0x80) return 0;
        if ((c == 0xE0 && p[i + 1] < 0xA0) || (c == 0xED && p[i + 1] >= 0xA0) || (c == 0xF0 && p[i + 1] < 0x90)
            || (c == 0xF4 && p[i + 1] >= 0x90))
            return 0;
        i += len;
    }
    return 2;
}

/* Texts i in [0, n_texts): data[offsets[i] .. offsets[i + 1]), split by the pattern ``style`` names (0 GPT-2,
 * 1 Llama 3, 2 Qwen 2). A text is left out (counts[i] = -1, no ids) when skip[i] is set (skip may be NULL),
 * when it is not UTF-8, or when it holds a byte above 127 and the table has no classes. Each other text's ids
 * are appended to out (NULL: counted only; room for one id per byte suffices) and counts[i] is their number.
 * Returns the ids written, or -1 (out of memory), -2 (a byte that is no token: not a byte-level vocabulary),
 * -3 (no such style), -4 (a piece of 2 GiB or more). */
SP_API int64_t sp_bpe_encode(const void *table, int64_t style, const uint8_t *data, const int64_t *offsets,
                             int64_t n_texts, const uint8_t *skip, int32_t *out, int64_t *counts) {
    if (style < 0 || style > 2) return -3;
    const bpe_table *t = (const bpe_table *)table;
    bpe_scratch s = {NULL, NULL, 0, NULL, NULL, NULL, NULL, 0, NULL};
    int64_t o = 0, status = 0;
    for (int64_t i = 0; i < n_texts && status == 0; i++) {
        const uint8_t *p = data + offsets[i];
        int64_t n = offsets[i + 1] - offsets[i];
        int form = (skip && skip[i]) ? 0 : bpe_utf8(p, n);
        if (form == 0 || (form == 2 && !t->classes)) { counts[i] = -1; continue; }
        int64_t first = o, a = 0;
        while (a < n && status == 0) {
            int64_t b = style == 0 ? bpe_piece_gpt2(t, p, a, n) : bpe_piece_llama3(t, p, a, n, style == 1 ? 3 : 1);
            int r = bpe_piece(t, p + a, b - a, &s, out, &o);
            if (r < 0) status = r;
            a = b;
        }
        counts[i] = o - first;
    }
    bpe_scratch_free(&s);
    return status < 0 ? status : o;
}

/* ------------------------------------------------------------------------------------ */
/* An empty module, so that the file is a valid extension for setuptools to build.       */

static struct PyModuleDef cbpe_module = {
    PyModuleDef_HEAD_INIT, "_cbpe",
    "The compiled byte-level BPE of sortpack.kernels.bpe, called through ctypes.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cbpe(void) { return PyModule_Create(&cbpe_module); }
