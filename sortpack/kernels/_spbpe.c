/* The BPE of SentencePiece-style tokenizer.json files (Mistral 7B, Llama 2): sortpack/kernels/sp_bpe.py.
 *
 * A second source of the _cbpe extension (called through ctypes with the GIL released, like _bpe.c), with
 * its own ABI number. These files have no pre-tokenizer: a whole text is one word. Its characters are the
 * code points of the text with every space replaced by the replacement character (U+2581), that character
 * put in front where the file prepends it (a Prepend normalizer: before every non-empty text; a Metaspace
 * pre-tokenizer: unless the text starts with one already); each is its vocabulary id, or the ids of its UTF-8 bytes'
 * <0xHH> tokens (byte fallback) when it is none. Then the merges run exactly as `tokenizers`' BPE runs
 * them (models/bpe/word.rs, merge_all): a heap of (rank, position, new id) over linked symbols, the lowest
 * rank first and the leftmost of equals; an entry whose pair has changed since is skipped; each merge
 * pushes the pairs it makes with its neighbours. The result is the file's ids by construction, and no
 * text costs more than O(n log n) (a whole document is one word here, so a rescan after each merge
 * would be quadratic in the document).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(_WIN32)
#define SPB_API __declspec(dllexport)
#else
#define SPB_API __attribute__((visibility("default")))
#endif

/* Bumped whenever a signature or a semantic changes: sp_bpe.py ignores a stale in-place build. */
#define SPB_ABI_VERSION 2
#define SPB_CODE_POINTS 0x110000

SPB_API int64_t sp_spbpe_abi_version(void) { return SPB_ABI_VERSION; }

typedef struct {
    int32_t *char_id;   /* each code point's id, -1: none (byte fallback) */
    int32_t byte_id[256];
    uint32_t replacement;
    int prepend;
    int64_t widest;     /* the symbols one text byte can become at most: a space's replacement's UTF-8 bytes (1-4)
                         * where it is no token, else 1 */
    int64_t slots;      /* the pair table: a power of two */
    uint64_t *key;      /* (left << 32 | right) + 1; 0: empty */
    int32_t *rank;
    int32_t *made;
    int64_t bigram_slots; /* the bigrams of the merges' tokens (cp1 << 21 | cp2) + 1; 0: empty; no table: no cuts */
    uint64_t *bigram;
} spb_table;

static inline uint64_t spb_mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    return h ^ (h >> 33);
}

/* the slot of a pair: where it is, or the empty slot where it would go */
static inline int64_t spb_slot(const spb_table *t, uint64_t key) {
    int64_t mask = t->slots - 1, i = (int64_t)(spb_mix(key) & (uint64_t)mask);
    while (t->key[i] && t->key[i] != key) i = (i + 1) & mask;
    return i;
}

/* the rank of the pair (a, b) and the id it makes; 0 when it is no merge */
static inline int spb_pair(const spb_table *t, int32_t a, int32_t b, int32_t *rank, int32_t *made) {
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    int64_t i = spb_slot(t, key);
    if (!t->key[i]) return 0;
    *rank = t->rank[i];
    *made = t->made[i];
    return 1;
}

/* the ids one text byte can become at most (the caller sizes out by it): 1, or the replacement's UTF-8 bytes where it
 * is no token */
SPB_API int64_t sp_spbpe_widest(void *handle) { return ((const spb_table *)handle)->widest; }

SPB_API void sp_spbpe_free(void *handle) {
    spb_table *t = (spb_table *)handle;
    if (!t) return;
    free(t->char_id);
    free(t->key);
    free(t->rank);
    free(t->made);
    free(t->bigram);
    free(t);
}

static inline uint64_t spb_bigram_key(int64_t x, int64_t y) { return (((uint64_t)x << 21) | (uint64_t)y) + 1; }

static inline int spb_has_bigram(const spb_table *t, int64_t x, int64_t y) {
    uint64_t key = spb_bigram_key(x, y);
    int64_t mask = t->bigram_slots - 1, i = (int64_t)(spb_mix(key) & (uint64_t)mask);
    while (t->bigram[i]) {
        if (t->bigram[i] == key) return 1;
        i = (i + 1) & mask;
    }
    return 0;
}

/* A table of n_chars (code point, id) pairs, the 256 byte-fallback ids, and n_merges merges (left, right, made id),
 * whose rank is their place in the list (a pair listed twice keeps its last place, as tokenizers' map does).
 * bigrams: the n_bigrams pairs of adjacent code points (cp1 << 21 | cp2) inside any token a merge makes, where no
 * merge takes a byte-fallback token (NULL: unknown; then a text is merged whole). NULL: out of memory, or a code
 * point out of range. */
SPB_API void *sp_spbpe_new(const int32_t *cps, const int32_t *cp_ids, int64_t n_chars, const int32_t *byte_ids,
                           const int32_t *left, const int32_t *right, const int32_t *made, int64_t n_merges,
                           int64_t replacement, int64_t prepend, const uint64_t *bigrams, int64_t n_bigrams) {
    spb_table *t = (spb_table *)calloc(1, sizeof(spb_table));
    if (!t) return NULL;
    t->replacement = (uint32_t)replacement;
    t->prepend = (int)prepend;
    memcpy(t->byte_id, byte_ids, sizeof(t->byte_id));
    t->char_id = (int32_t *)malloc(sizeof(int32_t) * SPB_CODE_POINTS);
    int64_t slots = 16;
    while (slots < 2 * n_merges + 16) slots <<= 1;
    t->slots = slots;
    t->key = (uint64_t *)calloc((size_t)slots, sizeof(uint64_t));
    t->rank = (int32_t *)malloc(sizeof(int32_t) * (size_t)slots);
    t->made = (int32_t *)malloc(sizeof(int32_t) * (size_t)slots);
    if (!t->char_id || !t->key || !t->rank || !t->made) {
        sp_spbpe_free(t);
        return NULL;
    }
    for (int64_t c = 0; c < SPB_CODE_POINTS; c++) t->char_id[c] = -1;
    for (int64_t k = 0; k < n_chars; k++) {
        if (cps[k] < 0 || cps[k] >= SPB_CODE_POINTS) {
            sp_spbpe_free(t);
            return NULL;
        }
        t->char_id[cps[k]] = cp_ids[k];
    }
    if (replacement < 0 || replacement >= SPB_CODE_POINTS) {
        sp_spbpe_free(t);
        return NULL;
    }
    /* a space becomes the replacement: one symbol where it is a token, else its UTF-8 bytes' fallback ids */
    t->widest = t->char_id[replacement] >= 0 ? 1 : replacement < 0x80 ? 1 : replacement < 0x800 ? 2
                : replacement < 0x10000 ? 3 : 4;
    for (int64_t k = 0; k < n_merges; k++) {
        uint64_t key = (((uint64_t)(uint32_t)left[k] << 32) | (uint32_t)right[k]) + 1;
        int64_t i = spb_slot(t, key);
        t->key[i] = key;
        t->rank[i] = (int32_t)k;
        t->made[i] = made[k];
    }
    if (bigrams) {
        int64_t bs = 16;
        while (bs < 2 * n_bigrams + 16) bs <<= 1;
        t->bigram_slots = bs;
        t->bigram = (uint64_t *)calloc((size_t)bs, sizeof(uint64_t));
        if (!t->bigram) {
            sp_spbpe_free(t);
            return NULL;
        }
        for (int64_t k = 0; k < n_bigrams; k++) {
            uint64_t key = bigrams[k] + 1;
            int64_t i = (int64_t)(spb_mix(key) & (uint64_t)(bs - 1));
            while (t->bigram[i] && t->bigram[i] != key) i = (i + 1) & (bs - 1);
            t->bigram[i] = key;
        }
    }
    return t;
}

#define SPB_SHORT 32 /* words of fewer symbols rescan their pairs after each merge; longer ones use the heap */
#define SPB_CACHE_BITS 14

/* one short word's symbols and the ids they merge to: a word's ids depend on its symbols alone */
typedef struct {
    int32_t n_in, n_out;
    int32_t in[SPB_SHORT - 1], out[SPB_SHORT - 1];
} spb_word;

typedef struct {
    int32_t *id, *prev, *next;
    spb_word *cache; /* direct-mapped by the symbols' hash (NULL: none, as where it could not be had) */
    uint8_t *alive;
    uint8_t *cut; /* cut[i]: no merge ever crosses the boundary before symbol i (a new word starts there) */
    uint64_t *heap; /* (rank << 32 | position): position < 2^31 */
    int32_t *heap_made;
    int64_t cap, heap_cap;
} spb_scratch;

static int spb_reserve(spb_scratch *s, int64_t n) {
    if (n > s->cap) {
        int64_t cap = n + n / 2 + 64;
        int32_t *id = (int32_t *)realloc(s->id, sizeof(int32_t) * (size_t)cap);
        if (id) s->id = id;
        int32_t *prev = (int32_t *)realloc(s->prev, sizeof(int32_t) * (size_t)cap);
        if (prev) s->prev = prev;
        int32_t *next = (int32_t *)realloc(s->next, sizeof(int32_t) * (size_t)cap);
        if (next) s->next = next;
        uint8_t *alive = (uint8_t *)realloc(s->alive, (size_t)cap);
        if (alive) s->alive = alive;
        uint8_t *cut = (uint8_t *)realloc(s->cut, (size_t)cap);
        if (cut) s->cut = cut;
        if (!id || !prev || !next || !alive || !cut) return -1;
        s->cap = cap;
    }
    return 0;
}

/* the heap orders by (rank, position); the made id rides along in a parallel array */
static void spb_down(spb_scratch *s, int64_t size, int64_t i) {
    uint64_t key = s->heap[i];
    int32_t made = s->heap_made[i];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= size) break;
        if (c + 1 < size && s->heap[c + 1] < s->heap[c]) c++;
        if (s->heap[c] >= key) break;
        s->heap[i] = s->heap[c];
        s->heap_made[i] = s->heap_made[c];
        i = c;
    }
    s->heap[i] = key;
    s->heap_made[i] = made;
}

static int spb_push(spb_scratch *s, int64_t *size, int32_t rank, int32_t pos, int32_t made) {
    if (*size == s->heap_cap) {
        int64_t cap = s->heap_cap * 2 + 64;
        uint64_t *heap = (uint64_t *)realloc(s->heap, sizeof(uint64_t) * (size_t)cap);
        if (heap) s->heap = heap;
        int32_t *hm = (int32_t *)realloc(s->heap_made, sizeof(int32_t) * (size_t)cap);
        if (hm) s->heap_made = hm;
        if (!heap || !hm) return -1;
        s->heap_cap = cap;
    }
    uint64_t key = ((uint64_t)(uint32_t)rank << 32) | (uint32_t)pos;
    int64_t i = (*size)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (s->heap[p] <= key) break;
        s->heap[i] = s->heap[p];
        s->heap_made[i] = s->heap_made[p];
        i = p;
    }
    s->heap[i] = key;
    s->heap_made[i] = made;
    return 0;
}

/* the next code point of UTF-8 at p[i..n) and its length in *len; -1: not UTF-8 */
static inline int64_t spb_code_point(const uint8_t *p, int64_t i, int64_t n, int64_t *len) {
    uint8_t c = p[i];
    if (c < 0x80) {
        *len = 1;
        return c;
    }
    int64_t k;
    uint32_t cp, min;
    if ((c & 0xE0) == 0xC0) k = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) k = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) k = 4, cp = c & 0x07, min = 0x10000;
    else return -1;
    if (i + k > n) return -1;
    for (int64_t j = 1; j < k; j++) {
        if ((p[i + j] & 0xC0) != 0x80) return -1;
        cp = (cp << 6) | (p[i + j] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
    *len = k;
    return cp;
}

/* append the symbol(s) of one code point (its id, or its UTF-8 bytes' fallback ids) and mark where no merge crosses:
 * before a fallback byte (no merge takes one where cuts are known), after one, and between two code points that
 * no token a merge makes holds side by side. -1: a byte with no id */
static inline int spb_append(const spb_table *t, spb_scratch *s, int64_t *m, int64_t cp, int64_t *last) {
    int32_t id = t->char_id[cp];
    if (id >= 0) {
        /* last: the previous code point, -1 at the start, -2 after a fallback byte */
        s->cut[*m] = *last == -1 || (t->bigram && (*last == -2 || !spb_has_bigram(t, *last, cp)));
        s->id[(*m)++] = id;
        *last = cp;
        return 0;
    }
    uint8_t u[4];
    int k;
    if (cp < 0x80) u[0] = (uint8_t)cp, k = 1;
    else if (cp < 0x800) u[0] = (uint8_t)(0xC0 | (cp >> 6)), u[1] = (uint8_t)(0x80 | (cp & 0x3F)), k = 2;
    else if (cp < 0x10000)
        u[0] = (uint8_t)(0xE0 | (cp >> 12)), u[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)),
        u[2] = (uint8_t)(0x80 | (cp & 0x3F)), k = 3;
    else
        u[0] = (uint8_t)(0xF0 | (cp >> 18)), u[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F)),
        u[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F)), u[3] = (uint8_t)(0x80 | (cp & 0x3F)), k = 4;
    for (int j = 0; j < k; j++) {
        if (t->byte_id[u[j]] < 0) return -1;
        s->cut[*m] = t->bigram != NULL || *m == 0;
        s->id[(*m)++] = t->byte_id[u[j]];
    }
    *last = t->bigram ? -2 : cp;
    return 0;
}

/* the first symbols of one text (its characters' ids or their bytes') and the cuts between them; their count, -1
 * not UTF-8 or a byte with no id, -2 out of memory */
static int64_t spb_symbols(const spb_table *t, const uint8_t *p, int64_t n, spb_scratch *s) {
    /* at most one symbol per byte, a space's replacement (and the prepended one) t->widest: up to four where it is a
     * four-byte character with no token */
    if (spb_reserve(s, t->widest * (n + 1)) < 0) return -2;
    int64_t m = 0, last = -1, len;
    int pre = t->prepend == 1 && n > 0;
    if (t->prepend == 2 && n > 0) { /* Metaspace: unless the text starts with the replacement already */
        int64_t cp = spb_code_point(p, 0, n, &len);
        pre = !(cp == ' ' || cp == (int64_t)t->replacement);
    }
    if (pre && spb_append(t, s, &m, t->replacement, &last) < 0) return -1;
    for (int64_t i = 0; i < n; i += len) {
        int64_t cp = spb_code_point(p, i, n, &len);
        if (cp < 0) return -1;
        if (spb_append(t, s, &m, cp == ' ' ? (int64_t)t->replacement : cp, &last) < 0) return -1;
    }
    return m;
}

/* merge the n symbols from a as tokenizers does (the lowest rank first, the leftmost of equals), by rescanning */
static int64_t spb_merge_short(const spb_table *t, const int32_t *sym, int64_t n, int32_t *out) {
    int32_t rank[SPB_SHORT], made[SPB_SHORT];
    for (int64_t i = 0; i < n; i++) out[i] = sym[i];
    for (int64_t i = 0; i + 1 < n; i++)
        if (!spb_pair(t, out[i], out[i + 1], &rank[i], &made[i])) rank[i] = INT32_MAX;
    while (n > 1) {
        int64_t best = -1;
        for (int64_t i = 0; i + 1 < n; i++)
            if (rank[i] != INT32_MAX && (best < 0 || rank[i] < rank[best])) best = i;
        if (best < 0) break;
        out[best] = made[best];
        for (int64_t i = best + 1; i + 1 < n; i++) out[i] = out[i + 1], rank[i] = rank[i + 1], made[i] = made[i + 1];
        n--;
        if (best > 0 && !spb_pair(t, out[best - 1], out[best], &rank[best - 1], &made[best - 1]))
            rank[best - 1] = INT32_MAX;
        if (best + 1 < n && !spb_pair(t, out[best], out[best + 1], &rank[best], &made[best])) rank[best] = INT32_MAX;
    }
    return n;
}

/* merge the symbols [a, b) of s as tokenizers does, through a heap over linked symbols; write the ids to out;
 * return their count, -2 out of memory */
static int64_t spb_merge_heap(const spb_table *t, spb_scratch *s, int64_t a, int64_t b, int32_t *out) {
    int64_t size = 0;
    int32_t rank, made;
    for (int64_t i = a; i < b; i++) {
        s->prev[i] = i > a ? (int32_t)(i - 1) : -1;
        s->next[i] = i + 1 < b ? (int32_t)(i + 1) : -1;
        s->alive[i] = 1;
    }
    for (int64_t i = a; i + 1 < b; i++)
        if (spb_pair(t, s->id[i], s->id[i + 1], &rank, &made) && spb_push(s, &size, rank, (int32_t)i, made) < 0)
            return -2;
    while (size > 0) {
        uint64_t top = s->heap[0];
        int32_t top_made = s->heap_made[0];
        size--;
        if (size > 0) {
            s->heap[0] = s->heap[size];
            s->heap_made[0] = s->heap_made[size];
            spb_down(s, size, 0);
        }
        int32_t pos = (int32_t)(top & 0xFFFFFFFFu);
        if (!s->alive[pos] || s->next[pos] < 0) continue;
        int32_t nx = s->next[pos];
        /* an entry whose pair has changed since it was pushed makes another id, or none */
        if (!spb_pair(t, s->id[pos], s->id[nx], &rank, &made) || made != top_made) continue;
        s->id[pos] = top_made;
        s->alive[nx] = 0;
        s->next[pos] = s->next[nx];
        if (s->next[nx] >= 0) s->prev[s->next[nx]] = pos;
        int32_t pv = s->prev[pos];
        if (pv >= 0 && spb_pair(t, s->id[pv], s->id[pos], &rank, &made) && spb_push(s, &size, rank, pv, made) < 0)
            return -2;
        int32_t after = s->next[pos];
        if (after >= 0 && spb_pair(t, s->id[pos], s->id[after], &rank, &made) && spb_push(s, &size, rank, pos, made) < 0)
            return -2;
    }
    int64_t o = 0;
    for (int64_t i = a; i >= 0; i = s->next[i]) out[o++] = s->id[i];
    return o;
}

/* merge a short word (the n symbols from a) through the cache: real text repeats its words, and a word's merges
 * are the same wherever it stands */
static int64_t spb_merge_cached(const spb_table *t, spb_scratch *s, int64_t a, int64_t n, int32_t *out) {
    const int32_t *sym = s->id + a;
    if (!s->cache) return spb_merge_short(t, sym, n, out);
    uint64_t h = 0xcbf29ce484222325ULL ^ (uint64_t)n;
    for (int64_t i = 0; i < n; i++) h = (h ^ (uint32_t)sym[i]) * 0x100000001b3ULL;
    spb_word *w = &s->cache[spb_mix(h) & ((1u << SPB_CACHE_BITS) - 1)];
    if (w->n_in == n && memcmp(w->in, sym, sizeof(int32_t) * (size_t)n) == 0) {
        memcpy(out, w->out, sizeof(int32_t) * (size_t)w->n_out);
        return w->n_out;
    }
    int64_t got = spb_merge_short(t, sym, n, out);
    w->n_in = (int32_t)n;
    w->n_out = (int32_t)got;
    memcpy(w->in, sym, sizeof(int32_t) * (size_t)n);
    memcpy(w->out, out, sizeof(int32_t) * (size_t)got);
    return got;
}

/* merge the m symbols of s word by word (between the cuts: merges on either side of a cut never meet, so each
 * side's merges come in the same order alone); write the ids to out; return their count, -2 out of memory */
static int64_t spb_merge(const spb_table *t, spb_scratch *s, int64_t m, int32_t *out) {
    int64_t o = 0;
    for (int64_t a = 0; a < m;) {
        int64_t b = a + 1;
        while (b < m && !s->cut[b]) b++;
        int64_t got = b - a == 1 ? (out[o] = s->id[a], 1)
                      : b - a < SPB_SHORT ? spb_merge_cached(t, s, a, b - a, out + o)
                      : spb_merge_heap(t, s, a, b, out + o);
        if (got < 0) return got;
        o += got;
        a = b;
    }
    return o;
}

/* Encode the n texts data[offsets[i]:offsets[i + 1]]: each text's ids to out (when out is not NULL) one text after
 * another, its count to counts[i] (-1: left to the caller, as skip[i] says, or not UTF-8). Every text needs at
 * most (its bytes + 1) x sp_spbpe_widest ids (a space, and the prepended replacement, become the replacement's
 * UTF-8 bytes where it is no token: up to four); one of 512 MiB or more is left to the caller (its symbols' places
 * stay under 2^31). Returns the ids written, -1 out of memory. */
SPB_API int64_t sp_spbpe_encode(void *handle, const uint8_t *data, const int64_t *offsets, int64_t n,
                                const uint8_t *skip, int32_t *out, int64_t *counts) {
    const spb_table *t = (const spb_table *)handle;
    spb_scratch s;
    memset(&s, 0, sizeof(s));
    /* zeroed pages cost nothing until a word lands in them; without the cache every word is merged */
    s.cache = t->bigram ? (spb_word *)calloc((size_t)1 << SPB_CACHE_BITS, sizeof(spb_word)) : NULL;
    int32_t *tmp = NULL;
    int64_t tmp_cap = 0, total = 0, rc = 0;
    for (int64_t k = 0; k < n; k++) {
        int64_t a = offsets[k], b = offsets[k + 1];
        if (skip && skip[k]) {
            counts[k] = -1;
            continue;
        }
        if (b - a >= ((int64_t)1 << 29) - 1) { /* its symbols' places would pass 2^31: left to the caller */
            counts[k] = -1;
            continue;
        }
        int64_t m = spb_symbols(t, data + a, b - a, &s);
        if (m == -2) {
            rc = -1;
            break;
        }
        if (m < 0) {
            counts[k] = -1;
            continue;
        }
        int32_t *dst = out ? out + total : NULL;
        if (!dst) {
            if (m > tmp_cap) {
                int32_t *grown = (int32_t *)realloc(tmp, sizeof(int32_t) * (size_t)m);
                if (!grown) {
                    rc = -1;
                    break;
                }
                tmp = grown, tmp_cap = m;
            }
            dst = tmp;
        }
        int64_t got = spb_merge(t, &s, m, dst);
        if (got < 0) {
            rc = -1;
            break;
        }
        counts[k] = got;
        if (out) total += got;
    }
    free(s.id);
    free(s.prev);
    free(s.next);
    free(s.alive);
    free(s.cut);
    free(s.heap);
    free(s.heap_made);
    free(s.cache);
    free(tmp);
    return rc < 0 ? rc : total;
}
