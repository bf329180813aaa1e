"""The A/B update agent (colibri/device/update_agent.py, docs/IMAGE.md section 7):
MCUboot slot trailers with direct-XIP revert semantics. The trailer layout is
checked against what MCUboot's imgtool writes.

The central test cuts the power at every single write of an update (before
the write, in the middle of it, and right after it), reboots, and checks that
the device boots a verified image (old or new), that the confirmed image is
never lost, and that the update can then be completed. Each boot's choice is
re-verified here with colibri.device.image directly, not trusted from the agent."""
from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from colibri import cli
from colibri.device import image as I
from colibri.device import keys, ota
from colibri.device import update_agent as U

V = I.Version.parse
SLOT = 4096
WRITE = 256          # bytes per flash write step: ~22 steps per update


@pytest.fixture(scope="module")
def key():
    return Ed25519PrivateKey.generate()


def image(key, version, counter, target="armv7", size=1000):
    payload = hashlib.sha256(version.encode()).digest() * (size // 32)
    return I.pack_image(payload, target, V(version), key, security_counter=counter)


@pytest.fixture(scope="module")
def v1(key):
    return image(key, "1.0.0", 1)


@pytest.fixture(scope="module")
def v2_package(key):
    return ota.pack_package([image(key, "2.0.0", 2)], key)


@pytest.fixture(scope="module")
def factory_flash(tmp_path_factory, key, v1):
    """The provisioned flash (v1 confirmed in A), as bytes to copy per run."""
    path = tmp_path_factory.mktemp("flash") / "factory.bin"
    U.init_flash(path, v1, key.public_key(), slot_size=SLOT, align=512, write_size=WRITE)
    return path.read_bytes()


@pytest.fixture
def fresh(tmp_path, factory_flash, key):
    """fresh(writer=...) -> an Agent over a new copy of the factory flash."""
    counter = [0]

    def make(writer=U.direct_writer):
        counter[0] += 1
        path = tmp_path / f"flash{counter[0]}.bin"
        path.write_bytes(factory_flash)
        return U.Agent(path, key.public_key(), writer)
    return make


def reopen(agent, key, writer=U.direct_writer):
    """The same flash after a reset: a new agent, nothing kept in memory."""
    agent.close()
    return U.Agent(agent.path, key.public_key(), writer)


def slot_version(agent, key, slot):
    """Independent check: the slot's image verifies; its version."""
    return I.verify_image(agent.slot_bytes(slot), key.public_key(), exact=False).version


# --- scenarios: each a sequence of agent calls, as the device would make them ------
def update_ok(agent, pkg, old, new):
    agent.install(pkg)
    b = agent.boot()
    assert b.trial and b.image.version == new
    agent.confirm()


def update_selftest_fails(agent, pkg, old, new):
    agent.install(pkg)
    assert agent.boot().trial
    agent.rollback()


def update_trial_never_confirms(agent, pkg, old, new):
    agent.install(pkg)
    assert agent.boot().trial
    b = agent.boot()               # reset during the trial: no confirm
    assert not b.trial and b.image.version == old


SCENARIOS = {"ok": update_ok, "selftest-fails": update_selftest_fails,
             "trial-never-confirms": update_trial_never_confirms}


@pytest.fixture(params=["from-factory", "second-update"])
def start(request, tmp_path, fresh, key, v2_package):
    """(make_agent, package, old version, new version). "second-update" starts
    from a device that already took one update (2.0.0 confirmed in slot B,
    1.0.0 left in A, older state records in both copies) and installs 3.0.0
    into slot A."""
    if request.param == "from-factory":
        return fresh, v2_package, V("1.0.0"), V("2.0.0")
    agent = fresh()
    update_ok(agent, v2_package, V("1.0.0"), V("2.0.0"))
    agent.close()
    base = agent.path.read_bytes()
    counter = [0]

    def make(writer=U.direct_writer):
        counter[0] += 1
        path = tmp_path / f"second{counter[0]}.bin"
        path.write_bytes(base)
        return U.Agent(path, key.public_key(), writer)
    return make, ota.pack_package([image(key, "3.0.0", 3)], key), V("2.0.0"), V("3.0.0")


def count_writes(make, scenario, *args) -> U.CutWriter:
    w = U.CutWriter(at=0)
    agent = make(w)
    scenario(agent, *args)
    agent.close()
    return w


def check_invariants(agent, key, old_slot: int, old_bytes: bytes, versions,
                     allowed_confirmed) -> U.Boot:
    """Boot and check: a verified image, old or new; the confirmed one intact."""
    b = agent.boot()
    assert slot_version(agent, key, b.slot) == b.image.version
    assert b.image.version in versions
    state = agent.read_state()
    assert state is not None
    confirmed = slot_version(agent, key, state.confirmed_slot)
    assert confirmed in allowed_confirmed
    if state.confirmed_slot == old_slot:
        # the confirmed slot is never written while it is confirmed
        assert agent.slot_bytes(old_slot) == old_bytes
    return b


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_power_cut_at_every_write(start, key, name):
    make, pkg, old, new = start
    scenario = SCENARIOS[name]
    final = new if name == "ok" else old
    w = count_writes(make, scenario, pkg, old, new)
    total = w.count
    assert total >= SLOT // WRITE + 3       # erase + program + trailer writes
    probe = make()
    old_slot = probe.read_state().confirmed_slot
    old_bytes = probe.slot_bytes(old_slot)
    # the write that sets image_ok in the new slot (the confirm), if any
    ok_at = next((i + 1 for i, (off, n) in enumerate(w.log)
                  if off == probe._slot_end(1 - old_slot) + U.IMAGE_OK_OFF), None)
    probe.close()
    tested = 0
    for at in range(1, total + 1):
        for mode in ("before", "torn", "after"):
            agent = make(U.CutWriter(at, mode))
            with pytest.raises(U.PowerCut):
                scenario(agent, pkg, old, new)
            # Only once image_ok is programmed may the new image be the
            # confirmed one (a torn write has programmed its first byte, the flag).
            confirm_done = ok_at is not None and (at > ok_at or (at == ok_at
                                                                 and mode != "before"))
            agent = reopen(agent, key)
            b = check_invariants(agent, key, old_slot, old_bytes, (old, new),
                                 {new} if confirm_done else {old})
            # Finish what the power cut interrupted, as the device would.
            if b.trial:
                if name == "ok":
                    agent.confirm()
                else:
                    agent.rollback()
            elif name == "ok" and b.image.version != final:
                scenario(agent, pkg, old, new)
            b = agent.boot()
            assert (b.image.version, b.trial) == (final, False), (at, mode)
            assert slot_version(agent, key, b.slot) == final
            agent.close()
            tested += 1
    assert tested == 3 * total


def test_double_power_cut_during_recovery(fresh, key, v2_package):
    """A second cut during the first boot after a cut (the boot writes too:
    copy_done, a revert's erase, the counter): still a verified image and the
    confirmed one kept."""
    w = count_writes(fresh, update_ok, v2_package, V("1.0.0"), V("2.0.0"))
    total = w.count
    probe = fresh()
    v1_slot_a = probe.slot_bytes(0)
    ok_at = next(i + 1 for i, (off, n) in enumerate(w.log)
                 if off == probe._slot_end(1) + U.IMAGE_OK_OFF)
    probe.close()
    for at in range(1, total + 1):
        agent = fresh(U.CutWriter(at, "torn"))
        with pytest.raises(U.PowerCut):
            update_ok(agent, v2_package, V("1.0.0"), V("2.0.0"))
        agent = reopen(agent, key, U.CutWriter(1, "torn"))
        try:
            agent.boot()
        except U.PowerCut:
            pass
        agent = reopen(agent, key)
        check_invariants(agent, key, 0, v1_slot_a, (V("1.0.0"), V("2.0.0")),
                         {V("1.0.0"), V("2.0.0")} if at >= ok_at else {V("1.0.0")})
        agent.close()


def test_trailer_and_counter_through_an_update(fresh, v2_package):
    """MCUboot's trailer at each step (boot_set_pending, the test boot's
    copy_done, boot_set_confirmed) and the counter's ping-pong copies."""
    agent = fresh()
    t = agent.trailer(0)
    assert (t.magic, t.image_ok, t.copy_done) == ("good", "set", "unset")   # factory: confirmed
    assert agent.trailer(1).magic == "unset"
    agent.install(v2_package)
    t = agent.trailer(1)
    assert (t.magic, t.image_ok, t.copy_done, t.swap_info) == ("good", "unset", "unset",
                                                                U.BOOT_SWAP_TYPE_TEST)
    assert agent.read_state().trial_state == U.TRIAL_PENDING
    agent.boot()
    assert agent.trailer(1).copy_done == "set"
    assert agent.read_state().trial_state == U.TRIAL_TRYING
    agent.confirm()
    t = agent.trailer(1)
    assert (t.magic, t.image_ok, t.copy_done) == ("good", "set", "set")
    st = agent.read_state()
    assert (st.confirmed_slot, st.trial_state, st.min_security_counter) == (1, U.TRIAL_NONE, 2)
    copies = agent._copies()
    assert [(c.seq, c.value) for c in copies] == [(1, 1), (2, 2)]   # newest and the one before
    # each trailer field is one byte programmed, then erased padding to 8
    raw = agent.slot_bytes(1)[-U.TRAILER_SIZE:]
    assert raw[-16:] == U.BOOT_MAGIC
    assert raw[-24:-16] == b"\x01" + b"\xff" * 7 and raw[-32:-24] == b"\x01" + b"\xff" * 7
    assert raw[-40:-32] == b"\x02" + b"\xff" * 7 and raw[:8] == b"\xff" * 8


def test_permanent_install_needs_no_test_boot(fresh, v2_package):
    agent = fresh()
    agent.install(v2_package, permanent=True)
    assert agent.trailer(1).swap_info == U.BOOT_SWAP_TYPE_PERM
    b = agent.boot()
    assert (b.slot, b.image.version, b.trial) == (1, V("2.0.0"), False)
    assert agent.read_state().min_security_counter == 2      # raised for a confirmed image


def test_damaged_newest_counter_copy_falls_back_then_is_repaired(fresh, key, v2_package):
    agent = fresh()
    update_ok(agent, v2_package, V("1.0.0"), V("2.0.0"))     # newest copy: counter 2
    newest = max(range(2), key=lambda i: agent._copies()[i].seq)
    agent._f.seek(U.NV_OFFSET + newest * U.NV_SIZE + 8)
    agent._f.write(b"\x07")                       # one byte: CRC fails
    agent._f.flush()
    agent = reopen(agent, key)
    assert agent.security_counter() == 1          # the previous record
    b = agent.boot()                              # the confirmed image raises it again
    assert (b.slot, b.trial) == (1, False) and agent.security_counter() == 2


def test_wiped_counter_area_is_restored_from_the_confirmed_image(fresh, key, v2_package):
    agent = fresh()
    update_ok(agent, v2_package, V("1.0.0"), V("2.0.0"))
    agent._f.seek(U.NV_OFFSET)
    agent._f.write(b"\xff" * (2 * U.NV_SIZE))
    agent._f.flush()
    agent = reopen(agent, key)
    b = agent.boot()
    assert (b.slot, b.image.version) == (1, V("2.0.0"))
    assert agent.read_state().min_security_counter == 2


def test_trailer_layout_matches_imgtool(tmp_path):
    """`imgtool sign --pad` (test) and `--pad --confirm` fill the end of the
    slot as MCUboot expects: our reader sees a pending and a confirmed image."""
    imgtool = Path(sys.executable).parent / "imgtool"
    if not imgtool.exists():
        pytest.skip("imgtool is not installed (test extra)")
    k = tmp_path / "k"
    keys.generate(k)
    (tmp_path / "fw.bin").write_bytes(b"\x11" * 200)
    for extra, want in (([], ("good", "unset", "unset", U.TRIAL_PENDING)),
                        (["--confirm"], ("good", "set", "unset", U.TRIAL_NONE))):
        out = tmp_path / "o.bin"
        subprocess.run([str(imgtool), "sign", "-k", str(k), "--header-size", "0x20",
                        "--pad-header", "-S", str(SLOT), "--align", "8", "-v", "1.0.0", "--pad",
                        "-s", "1", "--custom-tlv", "0x80a2", "0x04000000",
                        *extra, str(tmp_path / "fw.bin"), str(out)], check=True,
                       capture_output=True)
        slot = out.read_bytes()
        assert len(slot) == SLOT
        t = U.Trailer.unpack(slot[-U.TRAILER_SIZE:])
        assert (t.magic, t.image_ok, t.copy_done, t.trial) == want
        # flash-init takes the padded slot as it is, confirmed
        flash = tmp_path / "f.bin"
        U.init_flash(flash, slot, keys.load_public(str(k) + ".pub"), slot_size=SLOT, align=512)
        with U.Agent(flash, keys.load_public(str(k) + ".pub")) as agent:
            assert agent.slot_bytes(0)[:-U.TRAILER_SIZE] == slot[:-U.TRAILER_SIZE]
            assert agent.trailer(0).confirmed
            b = agent.boot()
            assert (b.slot, b.trial, b.image.version) == (0, False, V("1.0.0"))


def rot(agent, slot, at=200):
    agent._f.seek(agent.geometry.slot_offsets[slot] + at)
    agent._f.write(b"\x00")
    agent._f.flush()


def test_bit_rot_in_the_confirmed_slot_falls_back(fresh, key):
    agent = fresh()
    # 2.0.0 keeps security counter 1, so 1.0.0 in slot A stays acceptable
    update_ok(agent, ota.pack_package([image(key, "2.0.0", 1)], key), V("1.0.0"), V("2.0.0"))
    rot(agent, 1)
    agent = reopen(agent, key)
    b = agent.boot()
    assert (b.slot, b.image.version) == (0, V("1.0.0")) and "fell back" in b.note
    assert agent.read_state().confirmed_slot == 0
    # both slots damaged: refuse to boot rather than run an unverified image
    rot(agent, 0)
    with pytest.raises(U.NoBootableImageError, match="neither slot"):
        reopen(agent, key).boot()


def test_bit_rot_never_falls_back_to_a_revoked_image(fresh, key, v2_package):
    agent = fresh()
    update_ok(agent, v2_package, V("1.0.0"), V("2.0.0"))   # counter raised to 2: 1.0.0 is revoked
    rot(agent, 1)
    with pytest.raises(U.NoBootableImageError):
        reopen(agent, key).boot()


def test_install_refusals_leave_the_flash_untouched(fresh, key):
    cases = [(ota.pack_package([image(key, "0.9.0", 1)], key), I.DowngradeError),
             (ota.pack_package([image(key, "3.0.0", 0)], key), I.CounterError),
             (ota.pack_package([image(key, "3.0.0", 2, target="ppc")], key), I.TargetError),
             (ota.pack_package([image(key, "3.0.0", 2, size=SLOT)], key), I.SlotSizeError)]
    other = Ed25519PrivateKey.generate()
    cases.append((ota.pack_package([image(other, "3.0.0", 2)], other), I.KeyMismatchError))
    good = ota.pack_package([image(key, "3.0.0", 2)], key)
    cases.append((good[:-10], I.TruncatedError))
    cases.append((good[:500] + bytes([good[500] ^ 4]) + good[501:], I.DigestError))
    for pkg, err in cases:
        agent = fresh()
        before = agent.path.read_bytes()
        with pytest.raises(err):
            agent.install(pkg)
        assert agent.path.read_bytes() == before
        agent.close()


def test_anti_rollback_after_confirm(fresh, key, v2_package):
    agent = fresh()
    update_ok(agent, v2_package, V("1.0.0"), V("2.0.0"))
    # a newer version still carrying the revoked counter 1 is refused
    with pytest.raises(I.CounterError, match="counter 1 is below the installed 2"):
        agent.install(ota.pack_package([image(key, "2.1.0", 1)], key))
    agent.install(ota.pack_package([image(key, "2.1.0", 2)], key))
    with pytest.raises(U.UpdateError, match="already on trial"):
        agent.install(ota.pack_package([image(key, "2.2.0", 2)], key))
    with pytest.raises(U.UpdateError, match="nothing to confirm"):
        agent.confirm()                            # pending, not yet booted
    b = agent.boot()
    assert (b.slot, b.image.version, b.trial) == (0, V("2.1.0"), True)


def test_cli_flash_commands(tmp_path, capsys, key, v1, v2_package):
    from cryptography.hazmat.primitives import serialization
    pub = tmp_path / "k.pub"
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    (tmp_path / "v1.img").write_bytes(v1)
    (tmp_path / "v2.ota").write_bytes(v2_package)
    flash = tmp_path / "flash.bin"

    def run(*argv):
        status = cli.main([str(a) for a in argv])
        out = capsys.readouterr()
        return status, out.out + out.err

    assert run("fw", "flash-init", flash, "--image", tmp_path / "v1.img", "--key", pub,
               "--slot-size", "4K", "--write-size", "512")[0] == 0
    assert run("fw", "install", flash, tmp_path / "v2.ota", "--key", pub)[0] == 0
    status, out = run("fw", "boot", flash, "--key", pub)
    assert status == 0 and "boot slot B: test boot of slot B (2.0.0)" in out
    assert run("fw", "confirm", flash, "--key", pub)[0] == 0
    status, out = run("fw", "status", flash, "--key", pub)
    assert "confirmed slot B" in out and "slot B        2.0.0" in out
    status, out = run("fw", "install", flash, tmp_path / "v2.ota", "--key", pub)
    assert status == 0   # same version, same counter: reinstall allowed
    status, out = run("fw", "rollback", flash, "--key", pub)
    assert status == 0 and "no trial" in out
    status, out = run("fw", "status", flash, "--key", pub)
    assert "trailer: magic unset" in out and "trailer: magic good, image_ok set" in out
    (tmp_path / "old.ota").write_bytes(ota.pack_package([image(key, "1.5.0", 2)], key))
    status, out = run("fw", "install", flash, tmp_path / "old.ota", "--key", pub)
    assert status == I.DowngradeError.exit_status and "REJECTED (downgrade)" in out
    status, out = run("fw", "boot", tmp_path / "v1.img", "--key", pub)
    assert status == 2 and "not a Colibri flash image" in out
