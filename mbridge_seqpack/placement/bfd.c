/*
 * Best-fit decreasing over sequence lengths, in C (loaded with ctypes; no Python C API).
 *
 * Same placement as the pure-Python fallback in packer.py, item for item: lengths are taken largest
 * first (a stable counting sort of the seeded order), each goes to the bin with the smallest remaining
 * space that holds it, bins with equal remaining space form a LIFO stack, and a new bin opens when none
 * fits. "Smallest remaining space >= L" is a search in a 64-ary bitset over remaining-space values
 * (at most 4 levels, so ~4 word operations per query at any capacity up to 16M tokens).
 * Work: O(n + capacity); memory: 4 bytes per sequence for the order, 4 per bin for the stacks, 8 per
 * capacity token for the counting sort and the bitset.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MAX_LEVELS 4

/* the calling convention packer.py was written for: a library of another version (a stale build beside newer
 * sources) is not loaded, the pure-Python path runs instead (it places identically) */
int64_t bfd_abi_version(void) { return 2; }

typedef struct {
    int levels;
    int64_t words[MAX_LEVELS];
    uint64_t *bits[MAX_LEVELS]; /* level 0: one bit per remaining-space value */
} bitset_t;

static int bitset_init(bitset_t *b, int64_t size) {
    memset(b, 0, sizeof(*b));
    int64_t n = size;
    for (;;) {
        if (b->levels == MAX_LEVELS) return -1;
        int64_t words = (n + 63) / 64;
        b->words[b->levels] = words;
        b->bits[b->levels] = (uint64_t *)calloc((size_t)words, sizeof(uint64_t));
        if (!b->bits[b->levels]) return -1;
        b->levels++;
        if (words == 1) return 0;
        n = words;
    }
}

static void bitset_free(bitset_t *b) {
    for (int i = 0; i < b->levels; i++) free(b->bits[i]);
}

static inline void bitset_set(bitset_t *b, int64_t i) {
    for (int lv = 0; lv < b->levels; lv++) {
        uint64_t *w = &b->bits[lv][i >> 6];
        uint64_t was = *w;
        *w = was | (1ULL << (i & 63));
        if (was) return; /* upper levels already mark this word */
        i >>= 6;
    }
}

static inline void bitset_clear(bitset_t *b, int64_t i) {
    for (int lv = 0; lv < b->levels; lv++) {
        uint64_t *w = &b->bits[lv][i >> 6];
        *w &= ~(1ULL << (i & 63));
        if (*w) return;
        i >>= 6;
    }
}

/* smallest set index >= i, or -1 */
static int64_t bitset_next(const bitset_t *b, int64_t i) {
    int lv = 0;
    for (;;) {
        if (lv == b->levels) return -1;
        int64_t w = i >> 6;
        if (w >= b->words[lv]) return -1;
        uint64_t masked = b->bits[lv][w] & (~0ULL << (i & 63));
        if (masked) {
            i = (w << 6) | __builtin_ctzll(masked);
            break;
        }
        i = w + 1; /* continue in the next word: look one level up */
        lv++;
    }
    while (lv > 0) { /* descend to the lowest set bit under the found word */
        lv--;
        i = (i << 6) | __builtin_ctzll(b->bits[lv][i]);
    }
    return i;
}

/*
 * lengths[n]: token counts (1..capacity). seeded[m]: indices into lengths to place (the seeded tie
 * order; ascending length is not required). out_bin[n]: receives bin ids for those indices (others
 * untouched). Bins 0..num_open-1 already exist with open_space[i] tokens free (pushed in index order);
 * new bins are numbered from num_open. Returns the number of bins, or -1 on allocation failure / bad input.
 */
/*
 * Best fit of order[0..m) (already longest first, ties in the wanted order) into the open bins and new ones;
 * see bfd_pack_into. ends (may be NULL): ends[j] is the end in order of the sequences of length capacity - j, so
 * a sequence's length is known from its position instead of read at random from lengths. Returns the number of
 * bins, or -1.
 */
static int64_t place_sorted(const int64_t *lengths, const int32_t *order, int64_t m, int64_t capacity,
                            int64_t *out_bin, int64_t num_open, const int64_t *open_space, const int64_t *ends) {
    int32_t *head = (int32_t *)malloc(((size_t)capacity + 1) * sizeof(int32_t));
    /* one stack link per bin; bins are few next to sequences, so the array grows on demand */
    int64_t next_size = num_open + 1024 + m / 16;
    int32_t *next = (int32_t *)malloc((size_t)next_size * sizeof(int32_t));
    bitset_t free_space;
    memset(&free_space, 0, sizeof(free_space));
    int ok = head && next && bitset_init(&free_space, capacity + 1) == 0;
    int64_t num_bins = -1;
    if (!ok) goto done;

    memset(head, 0xff, ((size_t)capacity + 1) * sizeof(int32_t)); /* -1: empty stack */
    for (int64_t b = 0; b < num_open; b++) {
        int64_t space = open_space[b];
        if (space < 0 || space > capacity) goto done;
        if (space == 0) continue;
        if (head[space] < 0) bitset_set(&free_space, space);
        next[b] = head[space];
        head[space] = (int32_t)b;
    }
    num_bins = num_open;
    int64_t k = 0;
    int64_t bucket = 0; /* with ends: the bucket of position k */
    while (k < m) {
        int64_t len;
        if (ends) {
            while (ends[bucket] <= k) bucket++;
            len = capacity - bucket;
        } else {
            len = lengths[order[k]];
        }
        int64_t group_end = ends ? ends[bucket] : m;
        int64_t space = bitset_next(&free_space, len);
        int32_t bin;
        if (space < 0) { /* open a bin */
            if (num_bins == next_size) {
                int64_t grown = next_size * 2;
                int32_t *bigger = (int32_t *)realloc(next, (size_t)grown * sizeof(int32_t));
                if (!bigger) { num_bins = -1; goto done; }
                next = bigger;
                next_size = grown;
            }
            bin = (int32_t)num_bins++;
            space = capacity;
        } else { /* pop the top of the best-fitting stack */
            bin = head[space];
            head[space] = next[bin];
            if (head[space] < 0) bitset_clear(&free_space, space);
        }
        /* this bin stays the best fit for equal lengths while it can take one more */
        do {
            out_bin[order[k]] = bin;
            space -= len;
            k++;
        } while (k < group_end && space >= len && (ends || lengths[order[k]] == len));
        if (space > 0) {
            if (head[space] < 0) bitset_set(&free_space, space);
            next[bin] = head[space];
            head[space] = bin;
        }
    }

done:
    free(head);
    free(next);
    bitset_free(&free_space);
    return num_bins;
}

/*
 * lengths[n]: token counts (1..capacity). seeded[m]: indices into lengths to place (the seeded tie
 * order; ascending length is not required). out_bin[n]: receives bin ids for those indices (others
 * untouched). Bins 0..num_open-1 already exist with open_space[i] tokens free (pushed in index order);
 * new bins are numbered from num_open. Returns the number of bins, or -1 on allocation failure / bad input.
 */
int64_t bfd_pack_into(const int64_t *lengths, const int32_t *seeded, int64_t m, int64_t capacity, int64_t *out_bin,
                      int64_t num_open, const int64_t *open_space) {
    if (capacity < 1 || m < 0 || num_open < 0 || m + num_open >= INT32_MAX) return -1;
    int64_t *start = (int64_t *)calloc((size_t)capacity + 2, sizeof(int64_t));
    int32_t *order = (int32_t *)malloc((size_t)(m ? m : 1) * sizeof(int32_t));
    int64_t num_bins = -1;
    if (!start || !order) goto done;
    /* stable counting sort by descending length: slot of length L starts after all longer ones */
    for (int64_t k = 0; k < m; k++) {
        int64_t len = lengths[seeded[k]];
        if (len < 1 || len > capacity) goto done;
        start[capacity - len + 1]++;
    }
    for (int64_t j = 1; j <= capacity + 1; j++) start[j] += start[j - 1];
    for (int64_t k = 0; k < m; k++) {
        int64_t idx = seeded[k];
        order[start[capacity - lengths[idx]]++] = (int32_t)idx;
    }
    free(start);
    start = NULL;
    num_bins = place_sorted(lengths, order, m, capacity, out_bin, num_open, open_space, NULL);
done:
    free(start);
    free(order);
    return num_bins;
}

/* SplitMix64 finalizer: the tie order's random numbers, a pure function of (seed, length, position) */
static inline uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/*
 * pack_lengths' whole placement without a shuffled index array: sequences are bucketed by length (a stable
 * counting sort over the indices, sequential reads), each bucket of equal lengths is shuffled in place by
 * Fisher-Yates with position p swapped with mix64(seed + len * 0x9E3779B97F4A7C15 + p) % (p + 1) (the bucket
 * is small and contiguous: cache-local), and then placed as bfd_pack_into places, longest first. Lengths above
 * capacity are skipped (out_bin -1). Same placement as packer.py's Python path for this tie order.
 */
int64_t bfd_pack_seeded(const int64_t *lengths, int64_t n, int64_t capacity, uint64_t seed, int64_t *out_bin) {
    if (capacity < 1 || n < 0 || n >= INT32_MAX) return -1;
    int64_t *start = (int64_t *)calloc((size_t)capacity + 2, sizeof(int64_t));
    if (!start) return -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = lengths[i];
        if (len < 1) { free(start); return -1; }
        if (len <= capacity) start[capacity - len + 1]++;
        else out_bin[i] = -1; /* too long: left out (the caller's out_bin need not be initialized) */
    }
    for (int64_t j = 1; j <= capacity + 1; j++) start[j] += start[j - 1];
    int64_t m = start[capacity + 1];
    int32_t *order = (int32_t *)malloc((size_t)(m ? m : 1) * sizeof(int32_t));
    if (!order) { free(start); return -1; }
    for (int64_t i = 0; i < n; i++) {
        int64_t len = lengths[i];
        if (len <= capacity) order[start[capacity - len]++] = (int32_t)i; /* start[j]: end of bucket j */
    }
    int64_t begin = 0;
    for (int64_t j = 0; j <= capacity; j++) { /* bucket j holds length capacity - j, [begin, start[j]) */
        int64_t end = start[j];
        uint64_t base = seed + (uint64_t)(capacity - j) * 0x9E3779B97F4A7C15ULL;
        for (int64_t p = end - begin - 1; p > 0; p--) {
            int64_t q = (int64_t)(mix64(base + (uint64_t)p) % (uint64_t)(p + 1));
            int32_t t = order[begin + p];
            order[begin + p] = order[begin + q];
            order[begin + q] = t;
        }
        begin = end;
    }
    int64_t bins = place_sorted(lengths, order, m, capacity, out_bin, 0, NULL, start);
    free(start);
    free(order);
    return bins;
}

/* out_bin[i] = relabel[out_bin[i]] for every placed sequence, in index order (sequential; relabel is int32, half
 * the cache footprint of int64 for the random reads) */
void relabel_all(int64_t *out_bin, int64_t n, const int32_t *relabel) {
    for (int64_t i = 0; i < n; i++) {
        int64_t b = out_bin[i];
        if (b >= 0) out_bin[i] = relabel[b];
    }
}
