"""SCons tool: signed firmware images and OTA packages (docs/IMAGE.md).

env.ColibriImage(img, firmware_elf, version=, key=, security_counter=0,
                 slot_size=None)
    signs the firmware into `img` with colibri.device.image.pack_file (the model is
    taken from the ELF's .colibri_model section). slot_size defaults to the
    target's `image` budget (targets/<name>.py), so an image that would not fit
    its flash slot fails the build.
env.ColibriOta(pkg, img, key=)
    bundles the image into a signed OTA package (colibri.device.ota.pack_files).

The actions are plain calls into the colibri package; errors (a missing key,
a bad version string, an image over the slot) stop the build with the
package's one-line message. Intended use in SConstruct, per target:

    env.Tool("colibri_image")
    img = env.ColibriImage(f"{bdir}/firmware.img", firmware, version=..., key=...)
    env.Alias("image", img)
    env.Alias("ota", env.ColibriOta(f"{bdir}/firmware.ota", img, key=...))

with `version=`, `key=` and `security_counter=` command-line variables
(`scons target=armv7 image version=1.2.3 key=keys/dev`).
"""
import os

import SCons.Errors
from SCons.Action import Action

from colibri.device import image as fwimage
from colibri.device import ota as fwota
from colibri.errors import ColibriError


def _check_key(key, goal):
    if not key:
        raise SCons.Errors.StopError(
            f"the {goal} goal needs key=KEY (a private key from `colibri fw keygen -o KEY`)")
    if not os.path.exists(str(key)):
        raise SCons.Errors.StopError(
            f"key={key}: no such file; create one with `colibri fw keygen -o {key}`")


def _image_action(target, source, env):
    t = env["COLIBRI_TARGET"]
    try:
        info = fwimage.pack_file(str(source[0]), str(target[0]), t.name,
                                 env["COLIBRI_IMAGE_VERSION"], env["COLIBRI_IMAGE_KEY"],
                                 security_counter=env["COLIBRI_IMAGE_COUNTER"],
                                 slot_size=env["COLIBRI_IMAGE_SLOT"])
    except ColibriError as exc:
        raise SCons.Errors.BuildError(errstr=f"{target[0]}: {exc}")
    print(f"  image [{t.name}] {info.version}, {info.size} bytes, security counter "
          f"{info.security_counter}" + (f", model sha256 {info.model.sha256.hex()[:16]}..."
                                        if info.model else ", no model section"))
    return 0


def _ota_action(target, source, env):
    try:
        fwota.pack_files([str(s) for s in source], str(target[0]), env["COLIBRI_IMAGE_KEY"])
    except ColibriError as exc:
        raise SCons.Errors.BuildError(errstr=f"{target[0]}: {exc}")
    return 0


def _parse(version, counter, slot_size):
    try:
        version = str(fwimage.Version.parse(version))
        counter = int(counter, 0) if isinstance(counter, str) else int(counter)
        slot = int(slot_size, 0) if isinstance(slot_size, str) else slot_size
    except (ColibriError, ValueError) as exc:
        raise SCons.Errors.StopError(f"image: {exc}")
    return version, counter, slot


def ColibriImage(env, img, firmware, version, key, security_counter=0, slot_size=None):
    if not version:
        raise SCons.Errors.StopError("the image goal needs version=MAJOR.MINOR.PATCH[+BUILD]")
    _check_key(key, "image")
    t = env["COLIBRI_TARGET"]
    if slot_size is None:
        slot_size = t.budgets.get("image")
    version, counter, slot = _parse(version, security_counter, slot_size)
    key = env.File(key)
    nodes = env.Command(img, firmware, Action(_image_action,
                                              "  SIGN  [$COLIBRI_TARGET_NAME] $TARGET"),
                        COLIBRI_IMAGE_VERSION=version, COLIBRI_IMAGE_KEY=key.abspath,
                        COLIBRI_IMAGE_COUNTER=counter, COLIBRI_IMAGE_SLOT=slot)
    # Re-sign when the key, the version/counter/slot or the image format change.
    env.Depends(nodes, [key, env.Value((version, counter, slot)),
                        env.File(fwimage.__file__), env.File(fwimage.keys.__file__)])
    return nodes


def ColibriOta(env, pkg, img, key):
    _check_key(key, "ota")
    key = env.File(key)
    nodes = env.Command(pkg, img, Action(_ota_action, "  OTA   [$COLIBRI_TARGET_NAME] $TARGET"),
                        COLIBRI_IMAGE_KEY=key.abspath)
    env.Depends(nodes, [key, env.File(fwota.__file__)])
    return nodes


def generate(env):
    env.AddMethod(ColibriImage)
    env.AddMethod(ColibriOta)


def exists(env):
    return True
