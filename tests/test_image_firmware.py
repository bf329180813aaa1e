"""The real firmware (SConstruct, every target) through the whole update path:
`colibri fw pack` signs build/<target>/firmware.elf (model from its
.colibri_model section); the image runs natively or under the target's QEMU;
an A/B flash takes a new version as an OTA package and confirms it only after
its self-test (the firmware's own run) passes; one flipped byte in the model
section of the built image is rejected by `colibri fw verify` and, run
anyway, refused by the firmware itself."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri import cli
from colibri.device import image as I
from colibri.device import update_agent as U
from colibri.device import keys, ota
from colibri.buildsteps import blob

ROOT = Path(__file__).resolve().parents[1]
SCONS = Path(sys.executable).parent / "scons"
sys.path.insert(0, str(ROOT))
import targets  # noqa: E402  (the build's target modules: toolchain and emulator)

TARGETS = list(targets.load_all())


def test_every_target_has_an_image_id():
    """A target without an id could build but never be packed or verified."""
    assert set(I.TARGET_IDS) == set(TARGETS)


@pytest.fixture(scope="module", params=TARGETS)
def firmware(request, tmp_path_factory, shared_builds):
    t = targets.get(request.param)
    tools = [t.tool("gcc"), *t.emulator[:1]]
    missing = [x for x in tools if shutil.which(x) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed")
    build = tmp_path_factory.mktemp(f"fwbuild-{t.name}")
    shared_builds.build(build, f"target={t.name}", timeout=600)
    elf = build / t.name / "firmware.elf"
    return t, elf, build / t.name / "firmware" / "model.bin"


def test_scons_image_and_ota_goals(firmware, tmp_path, shared_builds):
    """`scons target=X image|ota version=... key=...` through the real
    SConstruct: the signed files verify for that target and carry the
    stripped ELF."""
    t, elf, model_bin = firmware
    key = tmp_path / "k"
    keys.generate(key)
    shared_builds.build(elf.parent.parent, f"target={t.name}", "image", "ota",
                        "version=2.3.4+5", f"key={key}", "security_counter=6", timeout=600)
    pub = keys.load_public(Path(str(key) + ".pub"))
    policy = I.Policy(target=t.name, installed_counter=6)
    img = I.verify_image((elf.parent / "firmware.img").read_bytes(), pub, policy)
    assert (img.version, img.security_counter) == (I.Version(2, 3, 4, 5), 6)
    # The image carries the ELF without its debug sections (SConstruct).
    shipped = (elf.parent / "firmware.stripped.elf").read_bytes()
    assert bytes(img.payload) == shipped and len(shipped) < elf.stat().st_size
    assert img.model.sha256 == hashlib.sha256(model_bin.read_bytes()).digest()
    pkg = ota.verify_package((elf.parent / "firmware.ota").read_bytes(), pub, policy)
    assert pkg.version == img.version and len(pkg.images) == 1


def run_payload(t, image: bytes, path: Path) -> subprocess.CompletedProcess:
    """Run an image's payload (the firmware ELF) as the device would."""
    hdr = int.from_bytes(image[8:10], "little")        # MCUboot hdr_size
    size = int.from_bytes(image[12:16], "little")      # MCUboot img_size
    path.write_bytes(image[hdr:hdr + size])
    os.chmod(path, 0o755)
    return subprocess.run(t.emulator_command(str(path)), capture_output=True, text=True,
                          timeout=t.run_timeout)


def fw(capsys, *argv):
    status = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return status, out.out + out.err


def test_real_firmware_image_update_and_corrupted_model(firmware, tmp_path, capsys):
    t, elf, model_bin = firmware
    key = tmp_path / "dev.key"
    assert fw(capsys, "fw", "keygen", "-o", key)[0] == 0
    pub = Path(str(key) + ".pub")
    # What an image carries: the ELF without its debug sections (SConstruct's
    # firmware.stripped.elf). With them, x86_64's ELF passed the 4 MiB slot.
    shipped = elf.parent / "firmware.stripped.elf"
    for version, counter in (("1.0.0", 1), ("1.1.0", 2)):
        status, out = fw(capsys, "fw", "pack", shipped, "--target", t.name, "--version", version,
                         "--key", key, "--security-counter", counter, "--slot-size", "4M",
                         "-o", tmp_path / f"{version}.img")
        assert status == 0, out
    v1 = (tmp_path / "1.0.0.img").read_bytes()
    img = I.verify_image(v1, keys.load_public(pub), I.Policy(target=t.name))
    model = model_bin.read_bytes()
    assert img.model.size == len(model) and img.model.format_version == 1
    assert img.model.byte_order == t.byte_order
    assert bytes(img.payload[img.model.offset:img.model.offset + img.model.size]) == model

    r = run_payload(t, v1, tmp_path / "good.elf")
    assert r.returncode == 0 and r.stdout.rstrip().endswith("done"), r.stdout[-500:]

    # A/B: v1 confirmed, v1.1 arrives as an OTA package; the self-test is the
    # firmware's own run, under QEMU where the target needs it.
    assert fw(capsys, "fw", "ota", tmp_path / "1.1.0.img", "--key", key, "-o",
              tmp_path / "1.1.0.ota")[0] == 0
    flash = tmp_path / "flash.bin"
    U.init_flash(flash, v1, keys.load_public(pub), slot_size=4 << 20, write_size=64 << 10)
    with U.Agent(flash, keys.load_public(pub)) as agent:
        agent.install((tmp_path / "1.1.0.ota").read_bytes())
        boot = agent.boot()
        assert boot.trial and boot.image.version == I.Version(1, 1, 0)
        assert boot.image.target_id == I.TARGET_IDS[t.name]
        slot = agent.slot_bytes(boot.slot)[:boot.image.size]
        selftest = run_payload(t, slot, tmp_path / "trial.elf")
        assert selftest.returncode == 0
        agent.confirm()
        assert agent.boot().image.version == I.Version(1, 1, 0)

    # One flipped byte in the model section of the signed image.
    bad = bytearray(v1)
    bad[img.hdr_size + img.model.offset + img.model.size // 2] ^= 0x10
    (tmp_path / "bad.img").write_bytes(bytes(bad))
    status, out = fw(capsys, "fw", "verify", tmp_path / "bad.img", "--key", pub)
    assert status == I.DigestError.exit_status and "REJECTED (damaged)" in out
    r = run_payload(t, bytes(bad), tmp_path / "bad.elf")
    # Refused at boot by firmware/model_check.c, before the runtime reads it.
    assert r.returncode == 3, r.stdout[-500:]
    assert "error: model check:" in r.stdout and "CRC mismatch" in r.stdout
    assert "row " not in r.stdout


def test_bare_metal_binary_payload(firmware, tmp_path, capsys):
    """A bare-metal device flashes firmware.bin, not the ELF: packed with
    --model, the model is located inside the binary at its flash address."""
    t, elf, model_bin = firmware
    if t.is_linux:
        pytest.skip("Linux targets run the ELF")
    key = tmp_path / "k"
    fw(capsys, "fw", "keygen", "-o", key)
    out = tmp_path / "bin.img"
    status, text = fw(capsys, "fw", "pack", elf.with_suffix(".bin"), "--model", model_bin,
                      "--target", t.name, "--version", "1.0.0", "--key", key, "-o", out)
    assert status == 0, text
    img = I.verify_image(out.read_bytes(), keys.load_public(Path(str(key) + ".pub")))
    assert img.header["flags"] == 0 and img.model is not None
    assert img.payload_kind == I.PAYLOAD_RAW
    # The binary starts at the ELF's lowest load address (its flash LMA): the
    # model lies at its section address minus that, read here with readelf.
    sections = subprocess.run([t.tool("readelf"), "-SW", str(elf)], capture_output=True,
                              text=True, check=True).stdout
    line = next(x for x in sections.splitlines() if ".colibri_model" in x)
    addr = int(line.split("]", 1)[1].split()[2], 16)
    segments = subprocess.run([t.tool("readelf"), "-lW", str(elf)], capture_output=True,
                              text=True, check=True).stdout
    base = min(int(x.split()[3], 16) for x in segments.splitlines()
               if x.strip().startswith("LOAD") and int(x.split()[4], 16) > 0)
    assert img.model.offset == addr - base


@pytest.fixture(scope="module")
def demo_model(tmp_path_factory):
    """The demo model as ./scripts/demo.sh converts it (int8, its tokenizer)."""
    from colibri.model.convert import ColibriExporter
    out = tmp_path_factory.mktemp("demo-model") / "demo-int8.colibri"
    return ColibriExporter(ROOT / "models" / "demo" / "checkpoint", quant="int8").export(out)


def test_the_demo_builds_and_signs_into_every_targets_slot(firmware, demo_model, tmp_path,
                                                          shared_builds):
    """Steps 3 and 6 of `./scripts/demo.sh T` for every target (emulation
    left to the tests above): the demo model embedded, the size budgets
    checked, the firmware signed into an image its target's slot holds. The
    x86_64 demo once stopped here, its image 224 KB over the 4 MiB slot."""
    t = firmware[0]
    key = tmp_path / "dev.key"
    keys.generate(key)
    size_txt = shared_builds.work_dir() / t.name / "size.txt"     # the budgets' check
    shared_builds.build(tmp_path, f"target={t.name}", f"model={demo_model}",
                        "prompt=The Python tutorial", "generate=60", str(size_txt), "image",
                        "version=0.1.0", f"key={key}", timeout=600)
    out = tmp_path / t.name
    img = I.verify_image((out / "firmware.img").read_bytes(),
                         keys.load_public(Path(str(key) + ".pub")), I.Policy(target=t.name))
    # The slot holds the demo model in the target's byte order (ppc: the
    # big-endian re-encoding, whose values test_build_blob.py checks).
    want = demo_model.read_bytes()
    if t.byte_order != "little":
        want = blob.blob_for_target(demo_model, tmp_path / "want.colibri",
                                    t.byte_order).read_bytes()
    assert img.model.sha256 == hashlib.sha256(want).digest()
    assert len((out / "firmware.img").read_bytes()) <= t.budgets["image"]
