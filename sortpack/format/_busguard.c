/* A bus error in a memory-mapped sortpack file, as one line and an exit (sortpack.format.mapped).
 *
 * A file that shrinks while a process has it memory-mapped (a truncation, `cp` or
 * `rsync --inplace` over it) turns the next touch of a page past its new end into SIGBUS, and
 * the default action kills the process with no word of which file. The readers check each
 * shard's size before they read it (sortpack/format/mapped.py); this handler covers what a
 * check cannot: a change in the moment between the check and the read. For a fault whose
 * address lies in a file mapping under a directory registered with sp_guard_watch, it writes
 * one line naming the file to stderr and ends the process (_exit, status 128 + SIGBUS). Any
 * other bus error goes to the handler that was installed before (torch's DataLoader workers
 * have one for shared memory), or to the default action.
 *
 * Built as a Python extension only so that setuptools compiles and installs it; the module is
 * empty and the functions are called through ctypes. The handler uses async-signal-safe calls
 * only (open, read, close, write, sigaction, _exit) and no allocation: it reads
 * /proc/self/maps to learn which file the faulting address maps.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdint.h>
#include <string.h>

#if defined(_WIN32)
#define SP_API __declspec(dllexport)
#else
#define SP_API __attribute__((visibility("default")))
#endif

#define SP_GUARD_ABI 1

SP_API int64_t sp_guard_abi(void) { return SP_GUARD_ABI; }

#if defined(__linux__)
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#define MAX_PREFIXES 512
#define POOL_BYTES (1 << 17)

/* The watched path prefixes, appended only (under the Python side's lock) and published by
 * the count: the handler reads entries below the count it loads, which are complete. */
static char pool[POOL_BYTES];
static int64_t prefix_at[MAX_PREFIXES];
static int64_t prefix_len[MAX_PREFIXES];
static int64_t pool_used;
static int n_prefixes;

static struct sigaction previous;

static int watched(const char *path, int64_t len) {
    int n = __atomic_load_n(&n_prefixes, __ATOMIC_ACQUIRE);
    for (int i = 0; i < n; i++) {
        if (prefix_len[i] <= len && memcmp(pool + prefix_at[i], path, (size_t)prefix_len[i]) == 0) return 1;
    }
    return 0;
}

static uintptr_t parse_hex(const char **p, const char *end) {
    uintptr_t v = 0;
    while (*p < end) {
        char c = **p;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) break;
        v = (v << 4) | (uintptr_t)d;
        (*p)++;
    }
    return v;
}

/* One line of /proc/self/maps: "lo-hi perms offset dev inode   path". Returns the path's length
 * (0: no path) and sets *path when addr lies in [lo, hi). */
static int64_t line_maps(const char *line, const char *end, uintptr_t addr, const char **path) {
    const char *p = line;
    uintptr_t lo = parse_hex(&p, end);
    if (p >= end || *p != '-') return -1;
    p++;
    uintptr_t hi = parse_hex(&p, end);
    if (addr < lo || addr >= hi) return -1;
    for (int field = 0; field < 4 && p < end; field++) {  /* perms, offset, dev, inode */
        while (p < end && *p == ' ') p++;
        while (p < end && *p != ' ') p++;
    }
    while (p < end && *p == ' ') p++;
    *path = p;
    return (int64_t)(end - p);
}

/* Copy the path of the file mapping that holds addr into out (NUL-terminated); return its length, or 0. */
static int64_t mapping_path(uintptr_t addr, char *out, int64_t cap) {
    char buf[8192];  /* a maps line is at most a path (4096) and ~100 bytes of fields */
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    int64_t have = 0, found = 0;
    for (;;) {
        ssize_t got = read(fd, buf + have, sizeof(buf) - (size_t)have);
        if (got <= 0) break;
        have += got;
        const char *start = buf, *stop = buf + have;
        for (;;) {
            const char *nl = memchr(start, '\n', (size_t)(stop - start));
            if (nl == NULL) break;
            const char *path = NULL;
            int64_t len = line_maps(start, nl, addr, &path);
            if (len >= 0) {
                if (len > cap - 1) len = cap - 1;
                memcpy(out, path, (size_t)len);
                out[len] = 0;
                found = len;
                goto done;
            }
            start = nl + 1;
        }
        have = stop - start;
        if (have == (int64_t)sizeof(buf)) have = 0;  /* a line longer than the buffer: skip it */
        memmove(buf, start, (size_t)have);
    }
done:
    close(fd);
    return found;
}

static void say(const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static void on_sigbus(int sig, siginfo_t *info, void *ctx) {
    char path[4096];
    int64_t len = mapping_path((uintptr_t)info->si_addr, path, (int64_t)sizeof(path));
    if (len > 0 && path[0] == '/' && watched(path, len)) {
        static const char head[] = "sortpack: ";
        static const char tail[] = ": bus error reading it memory-mapped: the file shrank while this process "
                                   "read it (truncated or rewritten in place under a running reader); exiting "
                                   "with status 135\n";
        char line[sizeof(head) + sizeof(path) + sizeof(tail)];
        size_t n = 0;
        memcpy(line, head, sizeof(head) - 1);
        n += sizeof(head) - 1;
        memcpy(line + n, path, (size_t)len);
        n += (size_t)len;
        memcpy(line + n, tail, sizeof(tail) - 1);
        n += sizeof(tail) - 1;
        say(line, n);  /* one write: lines of two processes do not interleave */
        _exit(128 + SIGBUS);
    }
    /* not ours: the handler before us, or the default action (the fault repeats and kills) */
    if ((previous.sa_flags & SA_SIGINFO) && previous.sa_sigaction != NULL) {
        previous.sa_sigaction(sig, info, ctx);
        return;
    }
    if (previous.sa_handler != SIG_DFL && previous.sa_handler != SIG_IGN) {
        previous.sa_handler(sig);
        return;
    }
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGBUS, &dfl, NULL);
}

/* Install the handler unless it is the current one (a forked DataLoader worker may have had
 * its handler replaced since); return 1 when installed now, 0 when already in place, -1 on error. */
SP_API int64_t sp_guard_install(void) {
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) != 0) return -1;
    if ((now.sa_flags & SA_SIGINFO) && now.sa_sigaction == on_sigbus) return 0;
    struct sigaction ours;
    memset(&ours, 0, sizeof(ours));
    ours.sa_sigaction = on_sigbus;
    /* no SA_ONSTACK: a mapped read's fault runs on the thread's own stack, never an alternate one as
     * small as faulthandler's, which the buffers below could overflow */
    ours.sa_flags = SA_SIGINFO;
    sigemptyset(&ours.sa_mask);
    if (sigaction(SIGBUS, &ours, &previous) != 0) return -1;
    return 1;
}

/* Watch the files under a path prefix; return 1 when added, 0 when already watched, -1 when full. */
SP_API int64_t sp_guard_watch(const char *prefix, int64_t len) {
    if (len <= 0) return -1;
    int n = n_prefixes;
    for (int i = 0; i < n; i++)
        if (prefix_len[i] == len && memcmp(pool + prefix_at[i], prefix, (size_t)len) == 0) return 0;
    if (n >= MAX_PREFIXES || pool_used + len > POOL_BYTES) return -1;
    memcpy(pool + pool_used, prefix, (size_t)len);
    prefix_at[n] = pool_used;
    prefix_len[n] = len;
    pool_used += len;
    __atomic_store_n(&n_prefixes, n + 1, __ATOMIC_RELEASE);
    return 1;
}

#else /* no SIGBUS guard off Linux: a bus error keeps the default action */

SP_API int64_t sp_guard_install(void) { return -1; }
SP_API int64_t sp_guard_watch(const char *prefix, int64_t len) { (void)prefix; (void)len; return -1; }

#endif

static struct PyModuleDef busguard_module = {
    PyModuleDef_HEAD_INIT, "_busguard",
    "The SIGBUS handler of sortpack.format.mapped, called through ctypes.", -1, NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__busguard(void) { return PyModule_Create(&busguard_module); }
