"""SCons tool: the cross toolchain of env['COLIBRI_TARGET'] (a targets.Target)
built with env['COLIBRI_OPTIONS'] (colibri.buildsteps.toolchain.Options).

Sets CC/AR/RANLIB/OBJCOPY with the target's prefix and the flags of
colibri.buildsteps.toolchain.flags. Reproducible output: -ffile-prefix-map (in
the flags), deterministic archives (ar D, ranlib -D), no timestamps.
A missing compiler stops the build naming the Debian package.
"""
from SCons.Action import Action
import SCons.Errors

from colibri.buildsteps import toolchain


def generate(env):
    target = env["COLIBRI_TARGET"]
    opts = env["COLIBRI_OPTIONS"]
    missing = toolchain.missing_tools(target)
    if missing:
        raise SCons.Errors.StopError("; ".join(missing))
    fl = toolchain.flags(target, opts, env.Dir("#").abspath)
    env.Replace(
        CC=target.tool("gcc"),
        LINK=target.tool("gcc"),
        AS=target.tool("as"),
        AR=target.tool("ar"),
        RANLIB=target.tool("ranlib"),
        OBJCOPY=target.tool("objcopy"),
        ARFLAGS=["rcD"],
        RANLIBFLAGS=["-D"],
        CCFLAGS=list(fl.ccflags),
        ASFLAGS=list(target.arch_flags),
        CPPDEFINES=list(fl.cppdefines),
        LINKFLAGS=list(fl.linkflags),
        LIBS=list(fl.libs),
        COLIBRI_KERNEL_CCFLAGS=fl.kernel_ccflags,
    )
    if not env.get("COLIBRI_VERBOSE"):
        t = target.name
        env.Replace(CCCOMSTR=f"  CC    [{t}] $TARGET", ASPPCOMSTR=f"  AS    [{t}] $TARGET",
                    ARCOMSTR=f"  AR    [{t}] $TARGET",
                    RANLIBCOMSTR=f"  RANLIB [{t}] $TARGET",
                    LINKCOMSTR=f"  LINK  [{t}] $TARGET")


def exists(env):
    return True
