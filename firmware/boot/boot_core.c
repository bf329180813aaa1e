/*
 * boot_core.c - image verification and slot choice (boot_core.h).
 *
 * The checks mirror colibri.device.image.verify_image line by line, in the same
 * order, so both give the same verdict on the same bytes (the tests run one
 * corpus through both). Every field is read little-endian byte by byte:
 * no alignment assumption about the flash.
 */
#include "boot_core.h"

#include <string.h>

#include "colibri_image.h"
#include "ed25519.h"          /* orlp ed25519, third_party/ (scripts/setup.sh) */
#include "model_check.h"      /* colibri_sha256 */

/* DER SubjectPublicKeyInfo prefix of an Ed25519 key (RFC 8410): the key hash
 * is SHA-256 of these 12 bytes and the 32-byte key, as imgtool computes it. */
static const uint8_t ED25519_SPKI_PREFIX[12] = {0x30, 0x2a, 0x30, 0x05, 0x06, 0x03,
                                                0x2b, 0x65, 0x70, 0x03, 0x21, 0x00};
static const uint8_t BOOT_MAGIC[16] = {0x77, 0xc2, 0x95, 0xf3, 0x60, 0xd2, 0xef, 0x7f,
                                       0x35, 0x52, 0x50, 0x0f, 0x2c, 0xb6, 0x79, 0x80};

#define U16(p) colibri_img_u16(p)
#define U32(p) colibri_img_u32(p)

/* CRC-32 (zlib's, as the agent's records use), bit by bit: it checks 60-byte
 * records only, so the 1 KiB table of the runtime's colibri_crc32 is not
 * worth its flash here. */
static uint32_t crc32_bits(const uint8_t *p, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    while (n--) {
        c ^= *p++;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
    }
    return ~c;
}

const char *boot_reason(int rc) {
    switch (rc) {
    case BOOT_OK: return "ok";
    case BOOT_R_MALFORMED: return "malformed";
    case BOOT_R_TRUNCATED: return "truncated";
    case BOOT_R_DAMAGED: return "damaged";
    case BOOT_R_WRONG_KEY: return "wrong-key";
    case BOOT_R_BAD_SIGNATURE: return "bad-signature";
    case BOOT_R_UNKNOWN_CRITICAL: return "unknown-critical-tlv";
    case BOOT_R_WRONG_TARGET: return "wrong-target";
    case BOOT_R_COUNTER: return "security-counter";
    case BOOT_R_TOO_LARGE: return "too-large";
    default: return "error";
    }
}

/* A TLV area at `pos`: its total length in *total, or a verdict. */
static int read_area(const uint8_t *b, uint64_t n, uint64_t pos, uint16_t magic,
                     uint32_t *total) {
    if (pos + COLIBRI_IMG_TLV_INFO_SIZE > n) return BOOT_R_TRUNCATED;
    if (U16(b + pos) != magic) return BOOT_R_MALFORMED;
    uint32_t t = U16(b + pos + 2);
    if (t < COLIBRI_IMG_TLV_INFO_SIZE) return BOOT_R_MALFORMED;
    if (pos + t > n) return BOOT_R_TRUNCATED;
    *total = t;
    return BOOT_OK;
}

/* The TLVs of an area must tile it exactly. */
static int tiles(const uint8_t *area, uint32_t total) {
    uint32_t pos = COLIBRI_IMG_TLV_INFO_SIZE;
    while (pos < total) {
        if (pos + COLIBRI_IMG_TLV_HDR_SIZE > total) return 0;
        uint32_t len = U16(area + pos + 2);
        if (pos + COLIBRI_IMG_TLV_HDR_SIZE + len > total) return 0;
        pos += COLIBRI_IMG_TLV_HDR_SIZE + len;
    }
    return 1;
}

static int unprotected_len(uint16_t type) {
    switch (type) {
    case COLIBRI_IMG_TLV_KEYHASH: return 32;
    case COLIBRI_IMG_TLV_SHA256: return 32;
    case COLIBRI_IMG_TLV_ED25519: return 64;
    default: return -1;
    }
}

static int protected_len(uint16_t type) {
    switch (type) {
    case COLIBRI_IMG_TLV_SEC_CNT: return 4;
    case COLIBRI_IMG_TLV_MODEL_SHA256: return 32;
    case COLIBRI_IMG_TLV_MODEL_INFO: return COLIBRI_IMG_MODEL_INFO_SIZE;
    case COLIBRI_IMG_TLV_TARGET: return COLIBRI_IMG_TARGET_SIZE;
    default: return -1;
    }
}

int boot_verify_image(const uint8_t *b, uint32_t len, const boot_policy *p, boot_image *out) {
    const uint64_t n = len;
    /* 1. structure */
    uint8_t magic[4] = {0x3d, 0xb8, 0xf3, 0x96};
    if (memcmp(b, magic, n < 4 ? (size_t)n : 4u) != 0) return BOOT_R_MALFORMED;
    if (n < COLIBRI_IMG_HEADER_STRUCT_SIZE) return BOOT_R_TRUNCATED;
    uint32_t hdr_size = U16(b + COLIBRI_IMG_HDR_HDR_SIZE);
    uint32_t prot_size = U16(b + COLIBRI_IMG_HDR_PROTECT_TLV_SIZE);
    uint32_t img_size = U32(b + COLIBRI_IMG_HDR_IMG_SIZE);
    if (hdr_size < COLIBRI_IMG_HEADER_STRUCT_SIZE) return BOOT_R_MALFORMED;
    uint64_t pend = (uint64_t)hdr_size + img_size;
    if (pend > n) return BOOT_R_TRUNCATED;
    uint32_t prot = 0;
    int rc;
    if (prot_size) {
        if ((rc = read_area(b, n, pend, COLIBRI_IMG_TLV_PROT_INFO_MAGIC, &prot))) return rc;
        if (prot != prot_size) return BOOT_R_MALFORMED;
    }
    uint64_t upos = pend + prot;
    uint32_t unprot = 0; /* set by read_area when it returns BOOT_OK */
    if ((rc = read_area(b, n, upos, COLIBRI_IMG_TLV_INFO_MAGIC, &unprot))) return rc;
    const uint8_t *u = b + upos;
    if (!tiles(u, unprot)) return BOOT_R_MALFORMED;
    const uint8_t *found[3] = {0, 0, 0}; /* SHA256, KEYHASH, ED25519 */
    for (uint32_t pos = COLIBRI_IMG_TLV_INFO_SIZE; pos < unprot;) {
        uint16_t type = U16(u + pos), tlen = U16(u + pos + 2);
        int want = unprotected_len(type);
        if (want < 0) return BOOT_R_MALFORMED; /* nothing else may be unprotected */
        int idx = type == COLIBRI_IMG_TLV_SHA256 ? 0 : type == COLIBRI_IMG_TLV_KEYHASH ? 1 : 2;
        if (found[idx]) return BOOT_R_MALFORMED;
        if (tlen != (uint16_t)want) return BOOT_R_MALFORMED;
        found[idx] = u + pos + COLIBRI_IMG_TLV_HDR_SIZE;
        pos += COLIBRI_IMG_TLV_HDR_SIZE + tlen;
    }
    if (!found[0] || !found[1] || !found[2]) return BOOT_R_MALFORMED;

    /* 2. SHA-256 of header, payload and protected TLVs */
    uint8_t digest[32];
    colibri_sha256(b, (size_t)(pend + prot), digest);
    if (memcmp(digest, found[0], 32) != 0) return BOOT_R_DAMAGED;
    /* 3. key hash */
    uint8_t spki[44], khash[32];
    memcpy(spki, ED25519_SPKI_PREFIX, sizeof ED25519_SPKI_PREFIX);
    memcpy(spki + sizeof ED25519_SPKI_PREFIX, p->pubkey, 32);
    colibri_sha256(spki, sizeof spki, khash);
    if (memcmp(khash, found[1], 32) != 0) return BOOT_R_WRONG_KEY;
    /* 4. the signature: Ed25519 of the 32-byte digest (MCUboot's rule) */
    if (!ed25519_verify(found[2], digest, sizeof digest, p->pubkey)) return BOOT_R_BAD_SIGNATURE;

    /* 5. now authentic: header flags, pad1, protected TLVs, the model */
    if (U32(b + COLIBRI_IMG_HDR_FLAGS) & ~(uint32_t)COLIBRI_IMG_F_RAM_LOAD)
        return BOOT_R_UNKNOWN_CRITICAL;
    if (U32(b + COLIBRI_IMG_HDR_PAD1) != 0) return BOOT_R_MALFORMED;
    const uint8_t *a = b + pend;
    if (prot && !tiles(a, prot)) return BOOT_R_MALFORMED;
    const uint8_t *sec = 0, *target = 0, *msha = 0, *minfo = 0;
    for (uint32_t pos = COLIBRI_IMG_TLV_INFO_SIZE; pos < prot;) {
        uint16_t type = U16(a + pos), tlen = U16(a + pos + 2);
        const uint8_t *v = a + pos + COLIBRI_IMG_TLV_HDR_SIZE;
        pos += COLIBRI_IMG_TLV_HDR_SIZE + tlen;
        int want = protected_len(type);
        if (want >= 0) {
            const uint8_t **slot = type == COLIBRI_IMG_TLV_SEC_CNT        ? &sec
                                   : type == COLIBRI_IMG_TLV_TARGET       ? &target
                                   : type == COLIBRI_IMG_TLV_MODEL_SHA256 ? &msha
                                                                          : &minfo;
            if (*slot) return BOOT_R_MALFORMED;          /* twice */
            if (tlen != (uint16_t)want) return BOOT_R_MALFORMED;
            *slot = v;
        } else if (unprotected_len(type) >= 0) {
            return BOOT_R_MALFORMED;                     /* belongs unprotected */
        } else if (type & COLIBRI_IMG_TLV_CRITICAL) {
            return BOOT_R_UNKNOWN_CRITICAL;
        } /* else: optional data from a newer signer, covered by the hash */
    }
    if (!sec || !target) return BOOT_R_MALFORMED;
    uint32_t kind = U16(target + COLIBRI_IMG_TARGET_KIND);
    if (kind != COLIBRI_IMG_PAYLOAD_RAW && kind != COLIBRI_IMG_PAYLOAD_ELF)
        return BOOT_R_UNKNOWN_CRITICAL;
    if (!msha != !minfo) return BOOT_R_MALFORMED;
    if (minfo) {
        uint32_t off = U32(minfo + COLIBRI_IMG_MODEL_INFO_OFFSET);
        uint32_t size = U32(minfo + COLIBRI_IMG_MODEL_INFO_BLOB_SIZE);
        if (minfo[COLIBRI_IMG_MODEL_INFO_BYTE_ORDER] > 1 || minfo[11] != 0)
            return BOOT_R_MALFORMED;
        if (off != COLIBRI_IMG_MODEL_NOT_IN_PAYLOAD) {
            if ((uint64_t)off + size > img_size) return BOOT_R_MALFORMED;
            uint8_t got[32];
            colibri_sha256(b + hdr_size + off, size, got);
            if (memcmp(got, msha, 32) != 0) return BOOT_R_DAMAGED;
        }
    }

    /* 6. the device's policy (no version floor here: see boot_select) */
    uint32_t counter = U32(sec);
    uint64_t size = upos + unprot;
    if (U16(target + COLIBRI_IMG_TARGET_ID) != p->target_id) return BOOT_R_WRONG_TARGET;
    if (counter < p->min_counter) return BOOT_R_COUNTER;
    if (size > p->capacity) return BOOT_R_TOO_LARGE;

    if (out) {
        out->major = b[COLIBRI_IMG_HDR_VER_MAJOR];
        out->minor = b[COLIBRI_IMG_HDR_VER_MINOR];
        out->revision = U16(b + COLIBRI_IMG_HDR_VER_REVISION);
        out->build = U32(b + COLIBRI_IMG_HDR_VER_BUILD);
        out->security_counter = counter;
        out->hdr_size = hdr_size;
        out->img_size = img_size;
        out->size = (uint32_t)size;
    }
    return BOOT_OK;
}

int boot_version_cmp(const boot_image *a, const boot_image *b) {
    uint64_t x = ((uint64_t)a->major << 56) | ((uint64_t)a->minor << 48) |
                 ((uint64_t)a->revision << 32) | a->build;
    uint64_t y = ((uint64_t)b->major << 56) | ((uint64_t)b->minor << 48) |
                 ((uint64_t)b->revision << 32) | b->build;
    return x < y ? -1 : x > y;
}

/* --- the flash layout of colibri/device/update_agent.py --------------------------- */
#define GEO_SIZE 64u
#define GEO_VERSION 2u
#define NV_OFFSET 64u
#define NV_SIZE 64u
#define MAX_WRITE 4096u
#define FLAG_SET 0x01u
#define ERASED 0xFFu
/* trailer offsets from the end of the slot (BOOT_MAX_ALIGN 8) */
#define MAGIC_OFF 16u
#define IMAGE_OK_OFF 24u
#define COPY_DONE_OFF 32u

typedef struct {
    uint32_t target_id, slot_size, slot[2], write_size;
} geometry;

static int read_geometry(const boot_flash *f, geometry *g) {
    const uint8_t *b = f->base;
    if (f->size < GEO_SIZE || memcmp(b, "CLFL", 4) != 0 || U16(b + 4) != GEO_VERSION ||
        crc32_bits(b, 60) != U32(b + 60))
        return 0;
    g->target_id = U16(b + 6);
    g->slot_size = U32(b + 8);
    g->slot[0] = U32(b + 12);
    g->slot[1] = U32(b + 16);
    g->write_size = U32(b + 20);
    for (int s = 0; s < 2; s++)
        if (g->slot[s] < NV_OFFSET + 2 * NV_SIZE || g->slot[s] > f->size ||
            g->slot_size > f->size - g->slot[s])
            return 0;
    return g->slot_size > BOOT_TRAILER_SIZE && g->write_size > 0 && g->write_size <= MAX_WRITE &&
           (g->slot[0] + g->slot_size <= g->slot[1] || g->slot[1] + g->slot_size <= g->slot[0]);
}

/* The security counter: the valid copy with the highest sequence number. */
static int read_counter(const boot_flash *f, uint32_t *value, int *newest) {
    uint32_t best_seq = 0;
    int found = 0;
    *value = 0;
    *newest = 1; /* no valid copy: the first write goes to copy 0 */
    for (int i = 0; i < 2; i++) {
        const uint8_t *c = f->base + NV_OFFSET + (uint32_t)i * NV_SIZE;
        int zero = 1;
        for (int k = 12; k < 60; k++) zero &= c[k] == 0;
        if (memcmp(c, "CLNV", 4) != 0 || !zero || crc32_bits(c, 60) != U32(c + 60)) continue;
        if (!found || U32(c + 4) > best_seq) {
            best_seq = U32(c + 4);
            *value = U32(c + 8);
            *newest = i;
            found = 1;
        }
    }
    return found ? (int)best_seq : 0;
}

static void put32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

/* Raise the stored counter (never lower it), into the other copy. */
static int raise_counter(boot_flash *f, uint32_t to) {
    uint32_t value;
    int newest;
    uint32_t seq = (uint32_t)read_counter(f, &value, &newest);
    if (seq && value >= to) return 0;
    uint8_t rec[NV_SIZE];
    memset(rec, 0, sizeof rec);
    memcpy(rec, "CLNV", 4);
    put32(rec + 4, seq + 1);
    put32(rec + 8, to);
    put32(rec + 60, crc32_bits(rec, 60));
    return f->write(f, NV_OFFSET + (uint32_t)(1 - newest) * NV_SIZE, rec, NV_SIZE);
}

static uint8_t erased_chunk[MAX_WRITE];

static int erase_slot(boot_flash *f, const geometry *g, int s) {
    memset(erased_chunk, ERASED, sizeof erased_chunk);
    for (uint32_t off = 0; off < g->slot_size; off += g->write_size) {
        uint32_t n = g->slot_size - off < g->write_size ? g->slot_size - off : g->write_size;
        int rc = f->write(f, g->slot[s] + off, erased_chunk, n);
        if (rc) return rc;
    }
    return 0;
}

/* --- console lines --------------------------------------------------------- */
typedef struct {
    char buf[160];
    size_t len;
} line;

static void l_str(line *l, const char *s) {
    while (*s && l->len + 1 < sizeof l->buf) l->buf[l->len++] = *s++;
    l->buf[l->len] = 0;
}

static void l_u32(line *l, uint32_t v) {
    char t[11];
    int i = 10;
    t[i] = 0;
    do t[--i] = (char)('0' + v % 10u); while ((v /= 10u) != 0);
    l_str(l, t + i);
}

static void l_version(line *l, const boot_image *im) {
    l_u32(l, im->major), l_str(l, "."), l_u32(l, im->minor), l_str(l, "."), l_u32(l, im->revision);
    if (im->build) l_str(l, "+"), l_u32(l, im->build);
}

static void say(boot_flash *f, line *l) {
    if (f->log) f->log(f, l->buf);
    l->len = 0;
    l->buf[0] = 0;
}

static const char *const SLOT_NAME[2] = {"A", "B"};

int boot_select(boot_flash *f, const boot_policy *base_policy, boot_choice *out) {
    geometry g;
    line l = {{0}, 0};
    if (!read_geometry(f, &g)) {
        l_str(&l, "boot: no valid flash geometry block: re-provision the device");
        say(f, &l);
        return BOOT_E_GEOMETRY;
    }
    uint32_t counter;
    int newest;
    read_counter(f, &counter, &newest);
    boot_policy p = *base_policy;
    p.min_counter = counter;
    p.capacity = g.slot_size - BOOT_TRAILER_SIZE;

    boot_image img[2];
    int ok[2];
    for (int s = 0; s < 2; s++) {
        int rc = boot_verify_image(f->base + g.slot[s], g.slot_size, &p, &img[s]);
        const char *why = rc ? boot_reason(rc) : 0;
        if (!rc && f->runnable) why = f->runnable(f, s, &img[s]);
        ok[s] = why == 0;
        if (!ok[s] && !(rc == BOOT_R_MALFORMED && f->base[g.slot[s]] == ERASED)) {
            l_str(&l, "boot: slot "), l_str(&l, SLOT_NAME[s]), l_str(&l, " rejected: "), l_str(&l, why);
            say(f, &l);
        }
    }
    /* Highest version first; ties: slot A. */
    int order[2] = {0, 1};
    if (ok[0] && ok[1] && boot_version_cmp(&img[1], &img[0]) > 0) order[0] = 1, order[1] = 0;
    for (int i = 0; i < 2; i++) {
        int s = order[i];
        if (!ok[s]) continue;
        const uint8_t *end = f->base + g.slot[s] + g.slot_size;
        int magic_good = memcmp(end - MAGIC_OFF, BOOT_MAGIC, 16) == 0;
        int image_ok = end[-(int)IMAGE_OK_OFF] == FLAG_SET;
        int copy_done = end[-(int)COPY_DONE_OFF] == FLAG_SET;
        if (!magic_good || (copy_done && !image_ok)) {
            /* MCUboot direct-XIP revert: never select it again. */
            l_str(&l, "boot: slot "), l_str(&l, SLOT_NAME[s]), l_str(&l, " ("), l_version(&l, &img[s]);
            l_str(&l, magic_good ? ") test boot was not confirmed: reverting (erasing the slot)"
                                 : ") not marked for boot: erasing the slot");
            say(f, &l);
            if (erase_slot(f, &g, s)) return BOOT_E_FLASH;
            continue;
        }
        out->slot = s;
        out->slot_offset = g.slot[s];
        out->img = img[s];
        out->trial = !image_ok;
        l_str(&l, "boot: slot "), l_str(&l, SLOT_NAME[s]), l_str(&l, " "), l_version(&l, &img[s]);
        if (!image_ok) {
            /* Consume the test before running it: a reset before the image
             * confirms itself finds copy_done and reverts. */
            if (!copy_done) {
                uint8_t field[8] = {FLAG_SET, ERASED, ERASED, ERASED, ERASED, ERASED, ERASED, ERASED};
                if (f->write(f, g.slot[s] + g.slot_size - COPY_DONE_OFF, field, 8)) return BOOT_E_FLASH;
            }
            l_str(&l, " test boot (it must confirm itself)");
        } else {
            if (raise_counter(f, img[s].security_counter)) return BOOT_E_FLASH;
            l_str(&l, " confirmed");
        }
        l_str(&l, ", security counter "), l_u32(&l, img[s].security_counter), l_str(&l, ": booting");
        say(f, &l);
        return BOOT_OK;
    }
    l_str(&l, "boot: no bootable image (neither slot holds a verified, confirmed or test image "
              "with security counter >= ");
    l_u32(&l, counter);
    l_str(&l, "): re-flash the device");
    say(f, &l);
    return BOOT_E_NO_IMAGE;
}

int boot_set_confirmed(boot_flash *f, uint32_t running) {
    geometry g;
    if (!read_geometry(f, &g)) return BOOT_E_GEOMETRY;
    for (int s = 0; s < 2; s++) {
        if (running < g.slot[s] || running - g.slot[s] >= g.slot_size) continue;
        const uint8_t *end = f->base + g.slot[s] + g.slot_size;
        if (memcmp(end - MAGIC_OFF, BOOT_MAGIC, 16) != 0) return BOOT_E_NO_IMAGE;
        if (end[-(int)IMAGE_OK_OFF] == FLAG_SET) return BOOT_OK;
        uint8_t field[8] = {FLAG_SET, ERASED, ERASED, ERASED, ERASED, ERASED, ERASED, ERASED};
        return f->write(f, g.slot[s] + g.slot_size - IMAGE_OK_OFF, field, 8) ? BOOT_E_FLASH
                                                                            : BOOT_OK;
    }
    return BOOT_E_NO_IMAGE;
}
