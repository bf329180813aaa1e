"""`colibri fw ...`: keys, signed images, OTA packages and the A/B flash
simulation (docs/IMAGE.md).

  colibri fw keygen -o KEY [--password-file F]  KEY + KEY.pub (Ed25519, imgtool reads both)
  colibri fw pack ELF --target T --version V --key KEY -o IMG   an MCUboot image
  colibri fw ota IMG [IMG...] --key KEY -o PKG
  colibri fw verify FILE --key KEY.pub [policy]  exit 0 only for a good file
  colibri fw info FILE                           what a file says (not verified)
  colibri fw flash-init / install / boot / confirm / rollback / status
                                                 the A/B update agent over a flash file

`verify` exits with the VerifyError's own status per reason (IMAGE.md 6) and
prints one line; everything else follows colibri.cli (one line, status 2).
"""
from __future__ import annotations

import argparse
import os
import sys

from . import image as I
from . import keys, ota
from . import update_agent as U
from ..errors import ColibriError


def parse_size(text: str) -> int:
    """Bytes from '65536', '0x10000', '64K', '4M'."""
    t = text.strip().upper()
    mult = 1
    if t.endswith(("K", "M")):
        mult = 1024 if t[-1] == "K" else 1 << 20
        t = t[:-1]
    try:
        value = int(t, 0) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (e.g. 65536, 0x10000, 64K, 4M)")
    if value < 0:
        raise argparse.ArgumentTypeError(f"size {text!r} is negative")
    return value


def _int(text: str) -> int:
    try:
        return int(text, 0)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _version(text: str) -> I.Version:
    try:
        return I.Version.parse(text)
    except ColibriError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


read_input = I.read_bytes


def add_policy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", choices=list(I.TARGET_IDS),
                   help="the device's target: reject files built for another")
    p.add_argument("--installed-version", type=_version, metavar="V",
                   help="reject a lower version (downgrade)")
    p.add_argument("--installed-counter", type=_int, metavar="N",
                   help="reject a lower security counter (anti-rollback)")
    p.add_argument("--slot-size", type=parse_size, metavar="BYTES",
                   help="reject an image larger than the flash slot")


def policy_from(args) -> I.Policy:
    return I.Policy(target=args.target, installed_version=args.installed_version,
                    installed_counter=args.installed_counter, slot_size=args.slot_size)


PASSWORD_ENV = keys.PASSWORD_ENV


def add_password_arg(p: argparse.ArgumentParser, helptext: str) -> None:
    p.add_argument("--password-file", metavar="FILE",
                   help=helptext + f" (first line; or set {PASSWORD_ENV})")


def password_from(args) -> bytes | None:
    """The key password: --password-file's first line, else $COLIBRI_KEY_PASSWORD,
    else None. Never a prompt: builds run unattended."""
    if args.password_file:
        text = I.read_bytes(args.password_file).splitlines()
        if not text or not text[0]:
            raise ColibriError(f"{args.password_file}: the password file is empty")
        return text[0]
    env = os.environ.get(PASSWORD_ENV)
    return env.encode() if env else None


def add_parser(subparsers) -> None:
    fw = subparsers.add_parser("fw", help="sign, package, verify and install firmware images",
                               description="Signed firmware images, OTA packages and the "
                               "A/B update agent (docs/IMAGE.md).")
    sub = fw.add_subparsers(dest="fw_command", metavar="FWCOMMAND")
    sub.required = True

    p = sub.add_parser("keygen", help="create an Ed25519 key pair (KEY and KEY.pub)")
    p.add_argument("-o", "--output", required=True, metavar="KEY")
    p.add_argument("--force", action="store_true", help="overwrite an existing key")
    add_password_arg(p, "encrypt the private key with the password in FILE")
    p.set_defaults(func=_keygen)

    p = sub.add_parser("pack", help="sign a firmware ELF/binary into an image",
                       description="Build a signed image: header, payload, TLVs (SHA-256, "
                       "Ed25519, security counter, model SHA-256 from the ELF's "
                       f"{I.MODEL_SECTION} section or --model).")
    p.add_argument("payload", metavar="ELF", help="firmware.elf (or a raw firmware binary)")
    p.add_argument("--target", required=True, choices=list(I.TARGET_IDS))
    p.add_argument("--version", required=True, type=_version, help="MAJOR.MINOR.PATCH[+BUILD]")
    p.add_argument("--key", required=True, metavar="KEY", help="private key from fw keygen")
    p.add_argument("--security-counter", type=_int, default=0, metavar="N",
                   help="anti-rollback counter; raise it to revoke older releases (default 0)")
    p.add_argument("--slot-size", type=parse_size, metavar="BYTES",
                   help="refuse to build an image larger than this")
    p.add_argument("--model", metavar="FILE",
                   help=f"the .colibri blob when the payload has no {I.MODEL_SECTION} section")
    p.add_argument("--load-address", type=_int, metavar="ADDR",
                   help="the image runs from RAM at ADDR (MCUboot's RAM_LOAD, imgtool's "
                   "--load-addr); default: it executes in place")
    p.add_argument("--header-size", type=_int, default=I.HEADER_SIZE, metavar="BYTES",
                   help=f"MCUboot hdr_size, the payload's offset in the slot (default "
                   f"{I.HEADER_SIZE}; imgtool's --header-size with --pad-header)")
    add_password_arg(p, "the private key is encrypted with the password in FILE")
    p.add_argument("-o", "--output", required=True, metavar="IMG")
    p.set_defaults(func=_pack)

    p = sub.add_parser("ota", help="bundle signed images into a signed OTA package")
    p.add_argument("images", nargs="+", metavar="IMG")
    p.add_argument("--key", required=True, metavar="KEY")
    add_password_arg(p, "the private key is encrypted with the password in FILE")
    p.add_argument("-o", "--output", required=True, metavar="PKG")
    p.set_defaults(func=_ota)

    p = sub.add_parser("verify", help="verify an image or OTA package (exit 0 only if good)",
                       description="Check integrity, signer, signature, critical TLVs and "
                       "the device policy. Exit 0: good; otherwise one line and the "
                       "reason's own status: " + ", ".join(
                           f"{e.exit_status} {e.reason}" for e in I.REJECTIONS)
                       + "; 2 cannot read the file or the key.")
    p.add_argument("file", metavar="FILE")
    p.add_argument("--key", required=True, metavar="KEY.pub")
    add_policy_args(p)
    p.set_defaults(func=_verify)

    p = sub.add_parser("info", help="print what an image or package says (not verified)")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=_info)

    add_agent_parsers(sub)


def _keygen(args) -> int:
    priv, pub = keys.generate(args.output, force=args.force, password=password_from(args))
    print(f"wrote {priv} (private: keep it secret) and {pub} (public: give it to devices)")
    return 0


def _pack(args) -> int:
    info = I.pack_file(args.payload, args.output, args.target, args.version, args.key,
                       security_counter=args.security_counter, slot_size=args.slot_size,
                       model_path=args.model, load_address=args.load_address,
                       header_size=args.header_size, password=password_from(args))
    model_note = (f", model {info.model.size} bytes sha256 {info.model.sha256.hex()[:16]}..."
                  if info.model else ", no model")
    print(f"wrote {args.output}: {args.target} {args.version}, {info.size} bytes, "
          f"security counter {args.security_counter}{model_note}")
    return 0


def _ota(args) -> int:
    info = ota.pack_files(args.images, args.output, args.key, password=password_from(args))
    print(f"wrote {args.output}: {info.target} {info.version}, {len(info.entries)} payload(s), "
          f"{info.size} bytes")
    return 0


def verify_bytes(data: bytes, public_key, policy: I.Policy):
    """Verify an image or a package, whichever `data` is."""
    if ota.is_package(data):
        return ota.verify_package(data, public_key, policy)
    return I.verify_image(data, public_key, policy)


def _verify(args) -> int:
    public_key = keys.load_public(args.key)
    data = read_input(args.file)
    try:
        result = verify_bytes(data, public_key, policy_from(args))
    except I.VerifyError as exc:
        print(f"{args.file}: REJECTED ({exc.reason}): {exc}", file=sys.stderr)
        return exc.exit_status
    kind = "package" if isinstance(result, ota.Package) else "image"
    print(f"{args.file}: OK: signed {kind}, {result.target} {result.version}, "
          f"security counter {result.security_counter}")
    return 0


def _info(args) -> int:
    data = read_input(args.file)
    try:
        if ota.is_package(data):
            text = ota.describe(ota.inspect_package(data))
        else:
            text = I.describe(I.inspect_image(data))
    except I.VerifyError as exc:
        print(f"{args.file}: cannot be read ({exc.reason}): {exc}", file=sys.stderr)
        return exc.exit_status
    print(text)
    print("signature     not checked here: run `colibri fw verify FILE --key KEY.pub`")
    return 0


# --- `colibri fw flash-init|install|boot|confirm|rollback|status` ---------------------
def add_agent_parsers(sub) -> None:
    p = sub.add_parser("flash-init", help="create a simulated A/B flash with IMG confirmed in A")
    p.add_argument("flash", metavar="FLASH")
    p.add_argument("--image", required=True, metavar="IMG")
    p.add_argument("--key", required=True, metavar="KEY.pub")
    p.add_argument("--slot-size", required=True, type=parse_size, metavar="BYTES")
    p.add_argument("--write-size", type=parse_size, default=U.DEFAULT_WRITE_SIZE,
                   metavar="BYTES",
                   help="bytes per flash write step (default 4096)")
    p.set_defaults(func=_flash_init)
    for name, helptext in (("install", "verify PKG and install it into the inactive slot"),
                           ("boot", "pick and verify the slot to boot (MCUboot direct-XIP "
                                    "with revert)"),
                           ("confirm", "the trial image passed its self-test: keep it"),
                           ("rollback", "the trial image failed its self-test: drop it"),
                           ("status", "print the state record and both slots")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("flash", metavar="FLASH")
        if name == "install":
            p.add_argument("package", metavar="PKG")
            p.add_argument("--permanent", action="store_true",
                           help="confirm it at once (MCUboot's permanent pending), no test boot")
        # rollback too: it reads which slot is on test, and that needs verified images
        p.add_argument("--key", required=True, metavar="KEY.pub")
        p.set_defaults(func=_agent, agent_command=name)


def _flash_init(args) -> int:
    geo = U.init_flash(args.flash, I.read_bytes(args.image), keys.load_public(args.key),
                     slot_size=args.slot_size, write_size=args.write_size)
    print(f"wrote {args.flash}: {I.target_name(geo.target_id)}, slots of {geo.slot_size} bytes "
          f"at {geo.slot_offsets[0]} and {geo.slot_offsets[1]}, {args.image} confirmed in A")
    return 0


def _agent(args) -> int:
    pub = keys.load_public(args.key)
    with U.Agent(args.flash, pub) as agent:
        cmd = args.agent_command
        if cmd == "install":
            try:
                slot = agent.install(I.read_bytes(args.package), permanent=args.permanent)
            except I.VerifyError as exc:
                print(f"{args.package}: REJECTED ({exc.reason}): {exc}", file=sys.stderr)
                return exc.exit_status
            print(f"installed {args.package} into slot {U.SLOT_NAMES[slot]}: "
                  + ("permanent; boot to run it" if args.permanent
                     else "pending test; boot to try it, then confirm"))
        elif cmd == "boot":
            b = agent.boot()
            print(f"boot slot {U.SLOT_NAMES[b.slot]}: {b.note}")
        elif cmd == "confirm":
            print(f"confirmed: {agent.confirm().describe()}")
        elif cmd == "rollback":
            print(f"rolled back: {agent.rollback().describe()}")
        else:
            st = agent.read_state()
            print(f"state         {st.describe()}")
            for slot in (0, 1):
                try:
                    img = agent.verify_slot(slot)
                    what = f"{img.version}, counter {img.security_counter}"
                except I.VerifyError as exc:
                    what = f"no verified image ({exc.reason})"
                print(f"slot {U.SLOT_NAMES[slot]}        {what}; trailer: "
                      f"{agent.trailer(slot).describe()}")
    return 0
