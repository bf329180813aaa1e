/*
 * eva_boot.c - Frama-C EVA harness for the bootloader's image checks
 * (firmware/boot/boot_core.c, boot_verify_image: the MCUboot header, the
 * protected and unprotected TLV areas, the model-info TLV, with
 * colibri_sha256 of firmware/model_check.c over the bytes they select):
 * every byte of an image of EVA_MAX_BYTES bytes unknown, its length any of
 * 0..EVA_MAX_BYTES, the policy's key, target and floor unknown.
 *
 * ed25519_verify (third-party orlp code, not ours to prove) is replaced by
 * its contract: it reads the 64-byte signature, the message and the 32-byte
 * key and returns 0 or 1. The contract's reads are checked by EVA at the
 * call (requires), so the bootloader passes it valid buffers.
 */
#include "__fc_builtin.h"
#include "boot_core.h"

#ifndef EVA_MAX_BYTES
#define EVA_MAX_BYTES 1024
#endif

/*@ requires \valid_read(signature + (0 .. 63));
    requires \valid_read(message + (0 .. message_len - 1));
    requires \valid_read(public_key + (0 .. 31));
    assigns \result \from signature[0 .. 63], message[0 .. message_len - 1],
                          public_key[0 .. 31];
    ensures \result == 0 || \result == 1; */
int ed25519_verify(const unsigned char *signature, const unsigned char *message,
                   size_t message_len, const unsigned char *public_key);

static uint8_t image_bytes[EVA_MAX_BYTES];

void eva_main(void)
{
    Frama_C_make_unknown((char *)image_bytes, EVA_MAX_BYTES);
    uint32_t len = Frama_C_unsigned_int_interval(0, EVA_MAX_BYTES);
    static uint8_t key[32];
    Frama_C_make_unknown((char *)key, sizeof key);
    boot_policy p;
    p.target_id = Frama_C_unsigned_int_interval(0, 0xFFFFu);
    p.min_counter = Frama_C_unsigned_int_interval(0, 0xFFFFFFFFu);
    p.capacity = Frama_C_unsigned_int_interval(0, 0xFFFFFFFFu);
    p.pubkey = key;
    boot_image out;
    (void)boot_verify_image(image_bytes, len, &p, &out);
}
