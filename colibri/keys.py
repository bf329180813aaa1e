"""Ed25519 signing keys for firmware images and OTA packages (docs/IMAGE.md).

A key pair is two PEM files: KEY (PKCS#8 private key, written with mode 0600)
and KEY.pub (SubjectPublicKeyInfo public key). Images and packages carry the
SHA-256 of the raw 32-byte public key, so a verifier holding several keys can
tell which one signed a file (MCUboot's KEYHASH TLV).

Signatures are made over a short domain string plus a SHA-256 digest, never
over the raw bytes of a file: a device can hash the image as it streams it from
flash and verify a 52-byte message, and the domain string keeps an image
signature from being replayed as a package signature (or the other way round).
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (Ed25519PrivateKey,
                                                               Ed25519PublicKey)

from .errors import ColibriError

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
KEY_HASH_SIZE = 32


class KeyFileError(ColibriError):
    """A key file is missing, unreadable or not an Ed25519 key."""


def public_suffix(path: str | os.PathLike) -> Path:
    """KEY -> KEY.pub, the public half `generate` writes next to the private one."""
    return Path(str(path) + ".pub")


def generate(path: str | os.PathLike, force: bool = False) -> tuple[Path, Path]:
    """Write a new key pair to `path` and `path`.pub; returns both paths.
    Refuses to overwrite an existing key unless `force`: losing a signing key
    means every device in the field needs a new trust anchor."""
    priv_path, pub_path = Path(path), public_suffix(path)
    if not force:
        for p in (priv_path, pub_path):
            if p.exists():
                raise KeyFileError(f"{p} already exists: refusing to overwrite a signing key "
                                   "(remove it first or pass --force)")
    key = Ed25519PrivateKey.generate()
    priv_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                 serialization.NoEncryption())
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


def load_private(path: str | os.PathLike) -> Ed25519PrivateKey:
    """The private key in the PEM file `path` (as written by `generate`)."""
    data = _read_pem(path)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"{path} is not an unencrypted PEM private key ({exc}); "
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


def key_hash(key: Ed25519PublicKey | Ed25519PrivateKey) -> bytes:
    """SHA-256 of the raw public key: what images and packages record."""
    return hashlib.sha256(raw_public(key)).digest()


def sign(key: Ed25519PrivateKey, domain: bytes, digest: bytes) -> bytes:
    """Ed25519 signature (64 bytes) of domain + digest."""
    return key.sign(domain + digest)


def check(key: Ed25519PublicKey, domain: bytes, digest: bytes, signature: bytes) -> bool:
    """True when `signature` is `key`'s signature of domain + digest."""
    try:
        key.verify(bytes(signature), domain + digest)
    except InvalidSignature:
        return False
    return True
