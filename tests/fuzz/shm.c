/* Shared-memory headers as another process could have left them: the shm
 * tier's segment (src/tier/shm.c) and a CP group's control segment
 * (src/cp/group.c), both kvtier named segments (src/core/shmseg.c).
 *
 * A valid segment of each is made once by the library itself and kept as
 * bytes. Each input picks one, then patches it: bytes of the first 4 KiB
 * (the heads) flipped, the file cut short or grown, and on request the
 * segment head made stale (a creator pid that is not running), torn (not
 * ready) or of another version. The bytes are written to /dev/shm under a
 * name of this process's, and attached as a rank or a tier would:
 *
 *   shm tier: kvt_tier_create(KVT_TIER_SHM | KVT_TIER_ATTACH) with the
 *     creator's geometry. Refused: a kvtier error code. Accepted: every page
 *     written through the tier lands at the data offset the format puts it
 *     (read back from the file), never anywhere else.
 *   CP group: kvt_cp_group_join as rank 1 (after kvt__seg_attach says the
 *     head is attachable: a join waits for a segment that is not). Refused:
 *     a kvtier error code and the segment's bytes untouched. Accepted: the
 *     rank's slot in the file holds its pid, where the format puts it. */
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "core/shmseg-int.h"
#include "fuzz.h"
#include "kvtier/cp.h"
#include "kvtier/tier.h"

#define PAGES 4
#define LAYERS 2
#define LB 32
#define CP_SLOTS_OFF 4096u
#define CP_SLOT_BYTES 1024u

static char tier_name[64], group[32], ctl_name[64];
static uint8_t *snap[2];
static size_t snap_len[2];
static uint64_t tier_data_off;

static size_t read_seg(const char *name, uint8_t **out) {
    char path[128];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    int fd = open(path, O_RDONLY);
    FZ_ASSERT(fd >= 0, "open %s", path);
    struct stat sb;
    fstat(fd, &sb);
    *out = malloc((size_t)sb.st_size);
    FZ_ASSERT(pread(fd, *out, (size_t)sb.st_size, 0) == sb.st_size, "read %s", path);
    close(fd);
    return (size_t)sb.st_size;
}

static kvt_tier_config_t tier_config(uint32_t flags) {
    return (kvt_tier_config_t){.size = sizeof(kvt_tier_config_t), .kind = KVT_TIER_SHM, .name = tier_name, .flags = flags,
                               .geom = {PAGES, LAYERS, LB, KVT_LAYOUT_PAGE_FIRST}};
}

static kvt_cp_group_config_t group_config(uint32_t rank) {
    return (kvt_cp_group_config_t){.size = sizeof(kvt_cp_group_config_t), .name = group, .rank = rank, .ranks = 2,
                                   .l1_pages = 8, .l2_pages = 16, .page_tokens = 4, .layers = 2, .layer_bytes = 32,
                                   .requests = 4, .tag = 99, .timeout_ms = 1, .wait_ms = 1};
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_quiet();
    snprintf(tier_name, sizeof(tier_name), "/kvt-fuzz-tier-%d", (int)getpid());
    snprintf(group, sizeof(group), "kvtfuzz%d", (int)getpid());
    kvt_cp_group_segment(group, "ctl", ctl_name, sizeof(ctl_name));
    /* the valid segments, as the library makes them */
    kvt_tier_config_t tc = tier_config(KVT_TIER_CHECKSUM);
    kvt_tier_t *t;
    FZ_ASSERT(kvt_tier_create(&t, &tc) == KVT_OK, "shm tier");
    tier_data_off = (uint64_t)((uint8_t *)kvt_tier_addr(t, 0, 0) - (uint8_t *)kvt_tier_sums(t)) + 4096;
    snap_len[0] = read_seg(tier_name, &snap[0]);
    kvt_tier_destroy(t);
    kvt_cp_group_config_t gc = group_config(0);
    kvt_cp_group_t *g;
    const char *why;
    FZ_ASSERT(kvt_cp_group_join(&g, &gc, &why) == KVT_OK, "group: %s", why);
    snap_len[1] = read_seg(ctl_name, &snap[1]);
    kvt_cp_group_fail(g, "done"); /* rank 0 leaves without waiting for rank 1 */
    kvt_cp_group_leave(g, &why);
    shm_unlink(ctl_name);
    return 0;
}

static void put_file(const char *name, const uint8_t *b, size_t n) {
    int fd = shm_open(name, O_RDWR | O_CREAT | O_TRUNC, 0600);
    FZ_ASSERT(fd >= 0, "shm_open %s", name);
    FZ_ASSERT(n == 0 || pwrite(fd, b, n, 0) == (ssize_t)n, "write %s", name);
    close(fd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_t f = fz_of(data, size);
    uint8_t mode = fz_u8(&f);
    int which = mode & 1;
    size_t n = snap_len[which];
    uint8_t cut = fz_u8(&f);
    size_t drop = (size_t)(cut & 0x7f) * 64 < n ? (size_t)(cut & 0x7f) * 64 : n;
    size_t len = (cut & 0x80) ? n - drop : (cut & 0x40) ? n + (size_t)(cut & 0x3f) * 8 : n;
    if (cut & 0x80 && (cut & 0x7f) == 0x7f) len = fz_u8(&f); /* a scrap of a file */
    uint8_t *b = calloc(len > n ? len : n, 1);
    memcpy(b, snap[which], n);
    kvt__seg_head_t *h = (kvt__seg_head_t *)b;
    if (mode & 2) h->creator_pid = 0x3ffffff0;     /* a creator that is not running */
    if (mode & 4) h->ready = 0;                  /* torn: never finished */
    if (mode & 8) h->version ^= 1 + fz_u8(&f) % 7; /* another version */
    while (fz_left(&f) >= 3) {
        uint16_t at = fz_u16(&f) % 4096;
        b[at] ^= fz_u8(&f);
    }
    const char *name = which ? ctl_name : tier_name;
    put_file(name, b, len);
    if (which == 0) {
        kvt_tier_config_t tc = tier_config(KVT_TIER_ATTACH | KVT_TIER_CHECKSUM);
        kvt_tier_t *t = NULL;
        int rc = kvt_tier_create(&t, &tc);
        if (rc != KVT_OK) {
            FZ_ASSERT(fz_kvt_err(rc), "tier attach: %d", rc);
        } else { /* every page lands where the format says */
            uint8_t page[LB], back[LB];
            for (uint32_t p = 0; p < PAGES; p++)
                for (uint32_t l = 0; l < LAYERS; l++) {
                    memset(page, (int)(p * LAYERS + l + 1), LB);
                    FZ_ASSERT(kvt_tier_write(t, p, l, page) == KVT_OK, "write");
                }
            char path[128];
            snprintf(path, sizeof(path), "/dev/shm%s", name);
            int fd = open(path, O_RDONLY);
            for (uint32_t p = 0; p < PAGES; p++)
                for (uint32_t l = 0; l < LAYERS; l++) {
                    memset(page, (int)(p * LAYERS + l + 1), LB);
                    uint64_t off = tier_data_off + ((uint64_t)p * LAYERS + l) * LB;
                    FZ_ASSERT(pread(fd, back, LB, (off_t)off) == LB && memcmp(back, page, LB) == 0,
                              "page %u layer %u is not at byte %llu of the segment", p, l, (unsigned long long)off);
                }
            close(fd);
            kvt_tier_destroy(t);
        }
    } else {
        kvt__seg_t s;
        int rc = kvt__seg_attach(&s, name, KVT__SEG_KIND_CP, h->version);
        if (rc == KVT_OK) kvt__seg_close(&s);
        kvt_cp_group_config_t gc = group_config(1);
        kvt_cp_group_t *g = NULL;
        const char *why = NULL;
        rc = rc == KVT_OK ? kvt_cp_group_join(&g, &gc, &why) : rc;
        uint8_t *now;
        size_t now_len = read_seg(name, &now);
        if (rc != KVT_OK && why && strstr(why, "refused by group")) {
            /* a rank refused for a parameter stops the group (unless it had
             * stopped already): the header's stop record may change, nothing
             * from the slots on */
            FZ_ASSERT(fz_kvt_err(rc), "join: %d", rc);
            FZ_ASSERT(now_len == len && len > CP_SLOTS_OFF && memcmp(now + CP_SLOTS_OFF, b + CP_SLOTS_OFF, len - CP_SLOTS_OFF) == 0,
                      "a refused join changed the segment beyond its header (%s)", why);
        } else if (rc != KVT_OK) {
            FZ_ASSERT(fz_kvt_err(rc), "join: %d", rc);
            FZ_ASSERT(now_len == len && memcmp(now, b, len) == 0, "a refused join changed the segment (%s)", why ? why : "");
        } else {
            int32_t pid;
            memcpy(&pid, now + CP_SLOTS_OFF + CP_SLOT_BYTES, sizeof(pid));
            FZ_ASSERT(pid == (int32_t)getpid(), "rank 1's slot does not hold its pid (%d)", (int)pid);
            kvt_cp_group_leave(g, &why);
        }
        free(now);
    }
    shm_unlink(name);
    free(b);
    return 0;
}
