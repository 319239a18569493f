/* Media header kernels for sortpack.kernels.media, compiled into the same _ckernels library
 * (a second source file of the extension, so that the other kernels' file and its ABI
 * number stay as they are: a stale library without these symbols fails to load as a whole
 * and the numpy fallbacks run).
 *
 * sp_jpeg_sizes walks the markers of each JPEG to its first frame header (SOFn) and reads
 * the stored height and width there. Plain C arrays and int64 counts, no Python objects.
 */
#include <stdint.h>

#if defined(_WIN32)
#define SP_MEDIA_API __declspec(dllexport)
#else
#define SP_MEDIA_API __attribute__((visibility("default")))
#endif

/* the statuses sortpack.inputs.media.images names (HEADER_OK ... HEADER_NO_SIZE) */
enum { JPEG_OK = 0, JPEG_TRUNCATED = 1, JPEG_CORRUPT = 3, JPEG_NO_SIZE = 4 };

/* a frame header: SOF0-SOF15 but DHT (C4), JPG (C8) and DAC (CC), which share the range */
static int is_frame_header(int m) { return m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC; }

/* One image at p[0, len): its status, width and height; need = the bytes a truncated walk must see. */
static int64_t jpeg_one(const uint8_t *p, int64_t len, int64_t *w, int64_t *h, int64_t *need) {
    int64_t pos = 2;  /* after SOI (checked by the caller) */
    for (;;) {
        if (pos + 2 > len) { *need = pos + 2; return JPEG_TRUNCATED; }
        if (p[pos] != 0xFF) return JPEG_CORRUPT;
        int m = p[pos + 1];
        if (m == 0xFF) { pos += 1; continue; }  /* a fill byte before the marker */
        if (m == 0xD8 || (m >= 0xD0 && m <= 0xD7) || m == 0x01) { pos += 2; continue; }  /* no length */
        if (m == 0xD9 || m == 0xDA || m == 0x00) return JPEG_CORRUPT;  /* the end or a scan before any frame */
        if (pos + 4 > len) { *need = pos + 4; return JPEG_TRUNCATED; }
        int64_t seg = ((int64_t)p[pos + 2] << 8) | p[pos + 3];
        if (seg < 2) return JPEG_CORRUPT;
        if (is_frame_header(m)) {
            if (pos + 9 > len) { *need = pos + 9; return JPEG_TRUNCATED; }
            *h = ((int64_t)p[pos + 5] << 8) | p[pos + 6];
            *w = ((int64_t)p[pos + 7] << 8) | p[pos + 8];
            /* a height of 0 is set later by a DNL marker, after the first scan: not a header's size */
            return (*w > 0 && *h > 0) ? JPEG_OK : JPEG_NO_SIZE;
        }
        pos += 2 + seg;
    }
}

/* For each image i (bytes [starts[i], ends[i]) of data, beginning FF D8): width, height, status, need.
 * Returns n. */
SP_MEDIA_API int64_t sp_jpeg_sizes(const uint8_t *data, const int64_t *starts, const int64_t *ends, int64_t n,
                                   int64_t *width, int64_t *height, int64_t *status, int64_t *need) {
    for (int64_t i = 0; i < n; i++) {
        int64_t w = 0, h = 0, nd = 0;
        status[i] = jpeg_one(data + starts[i], ends[i] - starts[i], &w, &h, &nd);
        width[i] = w;
        height[i] = h;
        need[i] = nd;
    }
    return n;
}
