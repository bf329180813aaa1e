/*
 * model_check.c - boot-time check of the embedded model (model_check.h).
 *
 * Field offsets come from colibri_format.h (the .colibri format) and
 * colibri_image.h (the signed image); both are checked against the Python
 * side by the tests. Everything is read byte by byte in the blob's own byte
 * order, so the check works on any CPU, any alignment, straight from flash.
 */
#include "model_check.h"

#include <string.h>

#include "colibri.h"
#include "colibri_format.h"
#include "colibri_image.h"

/* --- a tiny message builder (no stdio on bare metal) ---------------------- */
typedef struct {
    char *buf;
    size_t cap, len;
} msgbuf;

static void m_str(msgbuf *m, const char *s) {
    while (*s && m->len + 1 < m->cap) m->buf[m->len++] = *s++;
    if (m->cap) m->buf[m->len] = 0;
}

static void m_u64(msgbuf *m, uint64_t v) {
    char tmp[21];
    int i = 20;
    tmp[i] = 0;
    do {
        tmp[--i] = (char)('0' + v % 10u);
        v /= 10u;
    } while (v);
    m_str(m, tmp + i);
}

static void m_hex32(msgbuf *m, uint32_t v) {
    static const char digits[] = "0123456789abcdef";
    char tmp[11] = "0x";
    for (int i = 0; i < 8; i++) tmp[2 + i] = digits[(v >> (28 - 4 * i)) & 15u];
    tmp[10] = 0;
    m_str(m, tmp);
}

/* CRC-32: the runtime's colibri_crc32 (src/crc32.c, declared in colibri.h). */

/* --- SHA-256 (FIPS 180-4) -------------------------------------------------- */
static const uint32_t K256[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u};

static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

/* One 64-byte block into the state h[8]. */
static void sha256_block(uint32_t h[8], const uint8_t *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = ((uint32_t)p[4 * i] << 24) | ((uint32_t)p[4 * i + 1] << 16) |
               ((uint32_t)p[4 * i + 2] << 8) | (uint32_t)p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = k + (ror(e, 6) ^ ror(e, 11) ^ ror(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] +
                      w[i];
        uint32_t t2 = (ror(a, 2) ^ ror(a, 13) ^ ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        k = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    h[0] += a; h[1] += b; h[2] += c; h[3] += d;
    h[4] += e; h[5] += f; h[6] += g; h[7] += k;
}

void colibri_sha256(const uint8_t *data, size_t n, uint8_t out[COLIBRI_SHA256_SIZE]) {
    uint32_t h[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                     0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
    size_t full = n / 64u;
    for (size_t i = 0; i < full; i++) sha256_block(h, data + 64u * i);
    /* The tail, the 0x80 marker and the 64-bit big-endian bit length: one or
     * two more blocks. */
    uint8_t tail[128];
    size_t rest = n % 64u; /* = n - 64 * full, in [0, 64): tail holds it */
    memset(tail, 0, sizeof tail);
    if (rest) memcpy(tail, data + 64u * full, rest);
    tail[rest] = 0x80;
    size_t blocks = rest + 1 + 8 <= 64 ? 1 : 2;
    uint64_t bits = (uint64_t)n * 8u;
    for (size_t i = 0; i < 8; i++) tail[64 * blocks - 1 - i] = (uint8_t)(bits >> (8 * i));
    for (size_t i = 0; i < blocks; i++) sha256_block(h, tail + 64 * i);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(h[i] >> 8);
        out[4 * i + 3] = (uint8_t)h[i];
    }
}

/* --- the .colibri blob ----------------------------------------------------- */
typedef struct {
    const uint8_t *p;
    int big; /* 1: big-endian blob */
} reader;

static uint32_t rd(const reader *r, size_t off, int bytes) {
    uint32_t v = 0;
    for (int i = 0; i < bytes; i++) {
        int shift = r->big ? 8 * (bytes - 1 - i) : 8 * i;
        v |= (uint32_t)r->p[off + (size_t)i] << shift;
    }
    return v;
}

static uint64_t rd64(const reader *r, size_t off) {
    uint64_t lo = rd(r, off + (r->big ? 4 : 0), 4), hi = rd(r, off + (r->big ? 0 : 4), 4);
    return (hi << 32) | lo;
}

static int fail(msgbuf *m, int rc, const char *what) {
    m_str(m, what);
    return rc;
}

static void m_entry(msgbuf *m, uint32_t i, const reader *r, size_t e) {
    m_str(m, "section ");
    m_u64(m, i);
    m_str(m, " (kind ");
    m_u64(m, rd(r, e + COLIBRI_ENT_KIND, 2));
    uint32_t layer = rd(r, e + COLIBRI_ENT_LAYER, 2), expert = rd(r, e + COLIBRI_ENT_EXPERT, 2);
    if (layer != COLIBRI_NO_LAYER) {
        m_str(m, ", layer ");
        m_u64(m, layer);
    }
    if (expert != COLIBRI_NO_EXPERT) {
        m_str(m, ", expert ");
        m_u64(m, expert);
    }
    m_str(m, ")");
}

/* Non-zero padding between `from` and `to`? Reports the first such byte. */
static int padding_ok(msgbuf *m, const uint8_t *blob, uint64_t from, uint64_t to) {
    for (uint64_t i = from; i < to; i++) {
        if (blob[i]) {
            m_str(m, "padding byte ");
            m_u64(m, i);
            m_str(m, " is not zero: the model was modified or damaged in flash");
            return 0;
        }
    }
    return 1;
}

static int check_structure(msgbuf *m, const uint8_t *blob, size_t size) {
    if (size < COLIBRI_HEADER_SIZE) {
        m_str(m, "the model blob is ");
        m_u64(m, size);
        return fail(m, COLIBRI_MODEL_ERR_TRUNCATED, " bytes, shorter than the 64-byte header");
    }
    if (memcmp(blob, COLIBRI_MAGIC, COLIBRI_MAGIC_SIZE) != 0)
        return fail(m, COLIBRI_MODEL_ERR_FORMAT, "the model blob does not start with CLBR: "
                                                 "not a .colibri model");
    reader r = {blob, 0};
    if (blob[COLIBRI_HDR_BOM] == 0xFE && blob[COLIBRI_HDR_BOM + 1] == 0xFF) {
        r.big = 1;
    } else if (!(blob[COLIBRI_HDR_BOM] == 0xFF && blob[COLIBRI_HDR_BOM + 1] == 0xFE)) {
        return fail(m, COLIBRI_MODEL_ERR_FORMAT, "the model's byte-order mark is neither "
                                                 "FF FE nor FE FF");
    }
    uint32_t stored = rd(&r, COLIBRI_HDR_HEADER_CRC, 4);
    uint32_t got = colibri_crc32(0, blob, COLIBRI_HDR_HEADER_CRC);
    if (stored != got) {
        m_str(m, "model header CRC mismatch: stored ");
        m_hex32(m, stored);
        m_str(m, ", computed ");
        m_hex32(m, got);
        return COLIBRI_MODEL_ERR_CRC;
    }
    uint32_t version = rd(&r, COLIBRI_HDR_VERSION, 2);
    if (version < COLIBRI_FORMAT_VERSION_MIN || version > COLIBRI_FORMAT_VERSION) {
        m_str(m, "model format version ");
        m_u64(m, version);
        return fail(m, COLIBRI_MODEL_ERR_FORMAT, " is not supported by this firmware");
    }
    uint32_t n = rd(&r, COLIBRI_HDR_N_TENSORS, 4);
    uint64_t table_end = COLIBRI_TABLE_OFFSET + (uint64_t)n * COLIBRI_ENTRY_SIZE;
    if (n == 0 || table_end > size) {
        m_str(m, "model header n_tensors = ");
        m_u64(m, n);
        return fail(m, COLIBRI_MODEL_ERR_TRUNCATED, ": the tensor table does not fit the blob");
    }
    stored = rd(&r, COLIBRI_HDR_TABLE_CRC, 4);
    got = colibri_crc32(0, blob + COLIBRI_TABLE_OFFSET, (size_t)(table_end - COLIBRI_TABLE_OFFSET));
    if (stored != got) {
        m_str(m, "model tensor table CRC mismatch: stored ");
        m_hex32(m, stored);
        m_str(m, ", computed ");
        m_hex32(m, got);
        return COLIBRI_MODEL_ERR_CRC;
    }
    uint64_t prev_end = table_end;
    for (uint32_t i = 0; i < n; i++) {
        size_t e = COLIBRI_TABLE_OFFSET + (size_t)i * COLIBRI_ENTRY_SIZE;
        uint64_t off = rd64(&r, e + COLIBRI_ENT_OFFSET), len = rd64(&r, e + COLIBRI_ENT_SIZE);
        if (off < prev_end || off > size || len > size - off) {
            m_entry(m, i, &r, e);
            m_str(m, ": offset ");
            m_u64(m, off);
            m_str(m, " size ");
            m_u64(m, len);
            return fail(m, off > size || len > size - off ? COLIBRI_MODEL_ERR_TRUNCATED
                                                          : COLIBRI_MODEL_ERR_FORMAT,
                        " lies outside the blob or overlaps the previous section");
        }
        if (!padding_ok(m, blob, prev_end, off)) return COLIBRI_MODEL_ERR_FORMAT;
        stored = rd(&r, e + COLIBRI_ENT_CRC, 4);
        got = colibri_crc32(0, blob + off, (size_t)len);
        if (stored != got) {
            m_entry(m, i, &r, e);
            m_str(m, " at offset ");
            m_u64(m, off);
            m_str(m, ": CRC mismatch: stored ");
            m_hex32(m, stored);
            m_str(m, ", computed ");
            m_hex32(m, got);
            return COLIBRI_MODEL_ERR_CRC;
        }
        prev_end = off + len;
    }
    if (!padding_ok(m, blob, prev_end, size)) return COLIBRI_MODEL_ERR_FORMAT;
    return COLIBRI_MODEL_OK;
}

int colibri_model_check(const uint8_t *blob, size_t size, const uint8_t *expected_sha256,
                        char *msg, size_t msg_size) {
    msgbuf m = {msg, msg_size, 0};
    if (msg_size) msg[0] = 0;
    if (!blob) return fail(&m, COLIBRI_MODEL_ERR_FORMAT, "no model blob (NULL)");
    int rc = check_structure(&m, blob, size);
    if (rc) return rc;
    if (expected_sha256) {
        uint8_t got[COLIBRI_SHA256_SIZE];
        colibri_sha256(blob, size, got);
        if (memcmp(got, expected_sha256, COLIBRI_SHA256_SIZE) != 0)
            return fail(&m, COLIBRI_MODEL_ERR_SHA256,
                        "the model's SHA-256 differs from the one the image was signed with");
    }
    return COLIBRI_MODEL_OK;
}

/* Provided by the firmware platform (platform.h). */
void fw_write(const char *s, size_t n);

int colibri_fw_model_check(const uint8_t *blob, size_t size, const uint8_t *expected_sha256) {
    char msg[200];
    int rc = colibri_model_check(blob, size, expected_sha256, msg, sizeof msg);
    if (rc == COLIBRI_MODEL_OK) return 0;
    static const char pre[] = "error: model check: ";
    static const char post[] = " (refusing to run a corrupted model; re-flash the firmware)\n";
    fw_write(pre, sizeof pre - 1);
    fw_write(msg, strlen(msg));
    fw_write(post, sizeof post - 1);
    return COLIBRI_FW_EXIT_MODEL_CORRUPT;
}

/* --- the image's MODEL_SHA256 TLV ------------------------------------------ */
int colibri_image_model_sha256(const uint8_t *image, size_t size,
                               uint8_t out[COLIBRI_SHA256_SIZE]) {
    if (!image || size < COLIBRI_IMG_HEADER_STRUCT_SIZE ||
        colibri_img_u32(image + COLIBRI_IMG_HDR_MAGIC) != COLIBRI_IMG_MAGIC)
        return -1;
    uint32_t hdr_size = colibri_img_u16(image + COLIBRI_IMG_HDR_HDR_SIZE);
    uint32_t total = colibri_img_u16(image + COLIBRI_IMG_HDR_PROTECT_TLV_SIZE);
    if (hdr_size < COLIBRI_IMG_HEADER_STRUCT_SIZE) return -1;
    if (total == 0) return -2; /* no protected area: no model recorded */
    uint64_t pos = hdr_size + (uint64_t)colibri_img_u32(image + COLIBRI_IMG_HDR_IMG_SIZE);
    if (pos + COLIBRI_IMG_TLV_INFO_SIZE > size || total < COLIBRI_IMG_TLV_INFO_SIZE ||
        pos + total > size || colibri_img_u16(image + pos) != COLIBRI_IMG_TLV_PROT_INFO_MAGIC ||
        colibri_img_u16(image + pos + 2) != total)
        return -1;
    uint64_t end = pos + total;
    pos += COLIBRI_IMG_TLV_INFO_SIZE;
    while (pos < end) {
        if (pos + COLIBRI_IMG_TLV_HDR_SIZE > end) return -1;
        uint16_t type = colibri_img_u16(image + pos), len = colibri_img_u16(image + pos + 2);
        pos += COLIBRI_IMG_TLV_HDR_SIZE;
        if (pos + len > end) return -1;
        if (type == COLIBRI_IMG_TLV_MODEL_SHA256) {
            if (len != COLIBRI_SHA256_SIZE) return -1;
            memcpy(out, image + pos, COLIBRI_SHA256_SIZE);
            return 0;
        }
        pos += len;
    }
    return -2;
}
