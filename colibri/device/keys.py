"""Ed25519 signing keys for firmware images and OTA packages (docs/IMAGE.md).

A key pair is two PEM files: KEY (PKCS#8 private key, written with mode 0600,
optionally encrypted with a password as `imgtool keygen -p` does) and KEY.pub
(SubjectPublicKeyInfo public key). Both are what `imgtool` reads and writes.
Images and packages carry the key hash: SHA-256 of the DER SubjectPublicKeyInfo
(44 bytes for Ed25519), which is what imgtool puts in MCUboot's KEYHASH TLV and
what an MCUboot bootloader compares with its built-in keys.

Signatures are made over a SHA-256 digest, never over the raw bytes of a file,
so a device hashes the image while streaming it from flash and verifies a short
message. An image signs the bare 32-byte digest (MCUboot's rule for Ed25519);
an OTA manifest signs `colibri-ota-manifest-v1\0` + its digest, a 56-byte
message, so neither signature can be replayed as the other.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (Ed25519PrivateKey,
                                                               Ed25519PublicKey)

from ..errors import ColibriError

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
KEY_HASH_SIZE = 32
PASSWORD_ENV = "COLIBRI_KEY_PASSWORD"   # password of an encrypted key, for unattended builds


class KeyFileError(ColibriError):
    """A key file is missing, unreadable or not an Ed25519 key."""


def public_suffix(path: str | os.PathLike) -> Path:
    """KEY -> KEY.pub, the public half `generate` writes next to the private one."""
    return Path(str(path) + ".pub")


def generate(path: str | os.PathLike, force: bool = False,
             password: bytes | None = None) -> tuple[Path, Path]:
    """Write a new key pair to `path` and `path`.pub; returns both paths.
    `password`: encrypt the private key with it (PKCS#8, the best encryption
    `cryptography` offers, as imgtool does). Refuses to overwrite an existing
    key unless `force`: losing a signing key means every device in the field
    needs a new trust anchor."""
    priv_path, pub_path = Path(path), public_suffix(path)
    if not force:
        for p in (priv_path, pub_path):
            if p.exists():
                raise KeyFileError(f"{p} already exists: refusing to overwrite a signing key "
                                   "(remove it first or pass --force)")
    key = Ed25519PrivateKey.generate()
    enc = (serialization.BestAvailableEncryption(password) if password
           else serialization.NoEncryption())
    priv_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 enc)
    pub_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        fd = os.open(priv_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(priv_pem)
        pub_path.write_bytes(pub_pem)
    except OSError as exc:
        raise KeyFileError(f"cannot write the key pair to {priv_path}: {exc.strerror}") from None
    return priv_path, pub_path


def _read_pem(path: str | os.PathLike) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {path}: {exc.strerror}") from None


def is_encrypted(path: str | os.PathLike) -> bool:
    """True when the PEM private key at `path` needs a password."""
    return b"ENCRYPTED" in _read_pem(path)


def load_private(path: str | os.PathLike, password: bytes | None = None) -> Ed25519PrivateKey:
    """The private key in the PEM file `path` (as written by `generate` or
    `imgtool keygen -t ed25519`), decrypted with `password` when encrypted."""
    data = _read_pem(path)
    encrypted = b"ENCRYPTED" in data
    if encrypted and not password and os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV].encode()   # the SCons build's way in
    if encrypted and not password:
        raise KeyFileError(f"{path} is encrypted: give its password (--password-file FILE "
                           "or the COLIBRI_KEY_PASSWORD environment variable)")
    try:
        key = serialization.load_pem_private_key(data, password=password if encrypted else None)
    except (ValueError, TypeError) as exc:
        if encrypted:
            raise KeyFileError(f"cannot decrypt {path}: wrong password ({exc})") from None
        raise KeyFileError(f"{path} is not a PEM private key ({exc}); "
                           "create one with `colibri fw keygen -o KEY`") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, expected an Ed25519 key; "
                           "create one with `colibri fw keygen -o KEY`")
    return key


def load_public(path: str | os.PathLike) -> Ed25519PublicKey:
    """The public key in `path`: a KEY.pub file, or the private KEY itself
    (its public half), so either can be given to `verify`."""
    data = _read_pem(path)
    if b"PRIVATE KEY" in data:
        if b"ENCRYPTED" in data:
            raise KeyFileError(f"{path} is an encrypted private key: pass the public key "
                               "KEY.pub to verify")
        return load_private(path).public_key()
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise KeyFileError(f"{path} is not a PEM public key ({exc}); pass the KEY.pub that "
                           "`colibri fw keygen` wrote") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"{path} holds a {type(key).__name__}, expected an Ed25519 key")
    return key


def raw_public(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """The 32 raw bytes of a public key (of a private key's public half)."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def der_public(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """The DER SubjectPublicKeyInfo of a public key (44 bytes for Ed25519):
    the form MCUboot builds into a bootloader and hashes for KEYHASH."""
    if isinstance(key, Ed25519PrivateKey):
        key = key.public_key()
    return key.public_bytes(serialization.Encoding.DER,
                            serialization.PublicFormat.SubjectPublicKeyInfo)


def key_hash(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """SHA-256 of the DER public key: what images (MCUboot's KEYHASH, as
    imgtool computes it) and packages record."""
    return hashlib.sha256(der_public(key)).digest()


def sign(key: Ed25519PrivateKey, domain: bytes, digest: bytes) -> bytes:
    """Ed25519 signature (64 bytes) of domain + digest."""
    return key.sign(domain + digest)


def sign_digest(key: Ed25519PrivateKey, digest: bytes) -> bytes:
    """Ed25519 signature of the bare digest: MCUboot's ED25519 TLV."""
    return key.sign(digest)


def check_digest(key: Ed25519PublicKey, digest: bytes, signature: bytes) -> bool:
    """True when `signature` is `key`'s signature of the bare digest."""
    return check(key, b"", digest, signature)


def check(key: Ed25519PublicKey, domain: bytes, digest: bytes, signature: bytes) -> bool:
    """True when `signature` is `key`'s signature of domain + digest."""
    try:
        key.verify(bytes(signature), domain + digest)
    except InvalidSignature:
        return False
    return True
