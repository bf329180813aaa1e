"""site_scons/site_tools/colibri_image.py under real SCons, in a scratch
project (independent of the main SConstruct): `scons image` signs
an ELF with an embedded model, `scons ota` packages it, a missing key or a bad
version stops the build with one clear line, and an image over the target's
slot budget fails the build."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from colibri.device import image as I
from colibri.device import keys, ota
from colibri.buildsteps import blob as fwblob
from colibri.buildsteps import testmodel
from image_fixtures import TINY

ROOT = Path(__file__).resolve().parents[1]
SCONS = Path(sys.executable).parent / "scons"

SCONSTRUCT = f"""
import sys
sys.path.insert(0, {str(ROOT)!r})
import targets
env = Environment(tools=[], toolpath=[{str(ROOT / 'site_scons' / 'site_tools')!r}],
                  COLIBRI_TARGET=targets.get("armv7"), COLIBRI_TARGET_NAME="armv7")
env.Tool("colibri_image")
slot = ARGUMENTS.get("slot_size")
img = env.ColibriImage("out/firmware.img", "firmware.elf", version=ARGUMENTS.get("version"),
                       key=ARGUMENTS.get("key"),
                       security_counter=ARGUMENTS.get("security_counter", "0"),
                       slot_size=int(slot) if slot else None)
env.Alias("image", img)
env.Alias("ota", env.ColibriOta("out/firmware.ota", img, key=ARGUMENTS.get("key")))
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    if not SCONS.exists() or shutil.which("arm-linux-gnueabihf-gcc") is None:
        pytest.skip("scons or arm-linux-gnueabihf-gcc not installed")
    d = tmp_path_factory.mktemp("sconsimg")
    model = d / "model.colibri"
    testmodel.make_model(model, "f32", shape=TINY)
    (d / "main.c").write_text("int main(void) { return 0; }\n")
    (d / "blob.S").write_text(fwblob.embed_asm(str(model), linux=True))
    subprocess.run(["arm-linux-gnueabihf-gcc", "-static", "-o", str(d / "firmware.elf"),
                    str(d / "main.c"), str(d / "blob.S")], check=True, capture_output=True)
    (d / "SConstruct").write_text(SCONSTRUCT)
    keys.generate(d / "dev.key")
    return d


def scons(project, *args):
    return subprocess.run([str(SCONS), "-Q", *args], cwd=project, capture_output=True,
                          text=True, timeout=120)


def test_image_and_ota_goals(project):
    r = scons(project, "image", "version=1.2.3+5", "key=dev.key", "security_counter=4")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "image [armv7] 1.2.3+5" in r.stdout and "model sha256" in r.stdout
    pub = keys.load_public(project / "dev.key.pub")
    img = I.verify_image((project / "out" / "firmware.img").read_bytes(), pub,
                         I.Policy(target="armv7"))
    model = (project / "model.colibri").read_bytes()
    assert (img.version, img.security_counter) == (I.Version(1, 2, 3, 5), 4)
    assert bytes(img.payload) == (project / "firmware.elf").read_bytes()
    assert bytes(img.payload[img.model.offset:img.model.offset + img.model.size]) == model
    r = scons(project, "ota", "version=1.2.3+5", "key=dev.key", "security_counter=4")
    assert r.returncode == 0, r.stdout + r.stderr
    pkg = ota.verify_package((project / "out" / "firmware.ota").read_bytes(), pub,
                             I.Policy(target="armv7"))
    assert pkg.version == I.Version(1, 2, 3, 5)
    # up to date: nothing re-signed; a new version re-signs
    assert "SIGN" not in scons(project, "image", "version=1.2.3+5", "key=dev.key",
                               "security_counter=4").stdout
    r = scons(project, "image", "version=1.2.4", "key=dev.key")
    assert r.returncode == 0 and "1.2.4" in r.stdout


@pytest.mark.parametrize("args,message", [
    (("version=1.0.0",), "the image goal needs key=KEY"),
    (("version=1.0.0", "key=nokey"), "key=nokey: no such file"),
    (("key=dev.key",), "needs version=MAJOR.MINOR.PATCH"),
    (("version=1.0", "key=dev.key"), "is not MAJOR.MINOR.PATCH"),
])
def test_clear_errors(project, args, message):
    r = scons(project, "image", *args)
    assert r.returncode != 0 and message in r.stderr, r.stderr


def test_image_over_the_slot_fails_the_build(project):
    r = scons(project, "image", "version=9.0.0", "key=dev.key", "slot_size=1000")
    assert r.returncode != 0
    assert "larger than the 1000-byte slot" in r.stderr
    assert not (project / "out" / "firmware.img.tmp").exists()
