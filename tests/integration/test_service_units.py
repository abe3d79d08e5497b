"""The systemd units, the sysusers.d file and the example configs.

- `systemd-analyze verify` accepts both units with no warning at all (it
  exits 0 on unknown keys and bad values, so its output is checked too); the
  units are verified from a temp copy whose ExecStart= names the built
  binaries, since verify insists the binary exists. No running systemd is
  needed: verify works offline.
- `systemd-analyze security --offline` keeps each unit's exposure under a
  bound, so a lost hardening line fails the test.
- The settings the docs promise: dedicated users, StateDirectory matching the
  example configs' paths, ProtectSystem=strict, NoNewPrivileges,
  Restart=on-failure, SIGTERM with a stop timeout longer than the drain
  (shutdown_grace_sec / drain-timeout-sec), and for the agent none of the
  settings that would hide the GPUs.
- `systemd-sysusers --root` creates the users the units run as.
- conf/server.conf and conf/agent.conf parse (--print-config exits 0).

Needs systemd-analyze and systemd-sysusers (Debian package `systemd`); without
them the test fails and says so.
"""

import os
import re
import shutil
import subprocess
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE_DIR = os.environ.get("GPUPOOL_SOURCE_DIR") or os.path.abspath(os.path.join(HERE, "..", ".."))
BUILD_DIR = os.environ.get("GPUPOOL_BUILD_DIR") or os.path.join(SOURCE_DIR, "build")
CONF = os.path.join(SOURCE_DIR, "conf")
SERVER_BIN = os.path.join(BUILD_DIR, "src", "server", "gpupool-server")
AGENT_BIN = os.path.join(BUILD_DIR, "src", "agent", "gpupool-agent")
BINS = {"gpupool-server": SERVER_BIN, "gpupool-agent": AGENT_BIN}

# Overall exposure from `systemd-analyze security` (0-10, shown x10 for
# --threshold). Measured with systemd 252: server 1.6, agent 2.2.
EXPOSURE_MAX = {"gpupool-server": 20, "gpupool-agent": 30}


def need_tool(name, package):
    path = shutil.which(name)
    if not path:
        raise AssertionError("%s not found: install the Debian package '%s' "
                             "(apt-get install %s)" % (name, package, package))
    return path


def run(argv, timeout=60, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout, **kw)


def parse_unit(path):
    """{section: {key: [values...]}} of a unit file (no line continuations
    in ours; an empty assignment resets the list, as systemd does)."""
    out, sec = {}, None
    with open(path) as f:
        for raw in f:
            line = raw.strip()
            if not line or line[0] in "#;":
                continue
            m = re.match(r"^\[(.+)\]$", line)
            if m:
                sec = out.setdefault(m.group(1), {})
                continue
            k, _, v = line.partition("=")
            vals = sec.setdefault(k.strip(), [])
            if v.strip() == "":
                vals.clear()
            vals.append(v.strip())
    return out


def seconds(v):
    m = re.match(r"^(\d+)\s*(s|sec|min|m)?$", v)
    if not m:
        raise AssertionError("cannot read time span %r" % v)
    return int(m.group(1)) * (60 if m.group(2) in ("min", "m") else 1)


def print_config(binary, conf):
    r = run([binary, "--config", conf, "--print-config"])
    if r.returncode != 0:
        raise AssertionError("%s --config %s --print-config exited %d: %s"
                             % (os.path.basename(binary), conf, r.returncode, r.stderr.strip()))
    vals = {}
    for line in r.stdout.splitlines():
        m = re.match(r"^(\S+)\s+=\s+(.*?)\s+#\s+(\w+)$", line)
        if m:
            vals[m.group(1)] = (m.group(2), m.group(3))
    return vals


def copy_units(dst, bins=BINS, src_dir=CONF):
    """Copy both units into dst with ExecStart= pointing at `bins`."""
    paths = []
    for name, binary in bins.items():
        with open(os.path.join(src_dir, name + ".service")) as f:
            text = f.read()
        new = text.replace("=/usr/bin/%s " % name, "=%s " % binary)
        assert new != text, "%s.service: ExecStart=/usr/bin/%s not found" % (name, name)
        p = os.path.join(dst, name + ".service")
        with open(p, "w") as f:
            f.write(new)
        paths.append(p)
    return paths


def verify(units, cwd):
    """systemd-analyze verify; returns (rc, every line it printed)."""
    sa = need_tool("systemd-analyze", "systemd")
    r = run([sa, "verify", "--man=no"] + units, cwd=cwd)
    lines = [l for l in (r.stdout + r.stderr).splitlines() if l.strip()]
    return r.returncode, lines


class UnitsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gp-units-")
        for b in BINS.values():
            self.assertTrue(os.access(b, os.X_OK), "%s is not built" % b)

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_verify_clean(self):
        units = copy_units(self.tmp)
        rc, lines = verify(units, self.tmp)
        self.assertEqual(rc, 0, "\n".join(lines))
        self.assertEqual(lines, [], "systemd-analyze verify warned:\n" + "\n".join(lines))

    def test_verify_catches_a_bad_unit(self):
        # The check above can fail: a typo'd key and a bad value are reported
        # (verify still exits 0 on those, which is why output must be empty).
        units = copy_units(self.tmp)
        with open(units[0]) as f:
            text = f.read()
        text = text.replace("ProtectSystem=strict", "ProtectSystem=strictt\nProtectSytem=strict")
        with open(units[0], "w") as f:
            f.write(text)
        rc, lines = verify(units[:1], self.tmp)
        joined = "\n".join(lines)
        self.assertIn("ProtectSytem", joined)
        self.assertIn("strictt", joined)
        # A missing binary is an error (non-zero exit).
        with open(units[0], "w") as f:
            f.write(text.replace(SERVER_BIN, os.path.join(self.tmp, "no-such-binary")))
        rc, lines = verify(units[:1], self.tmp)
        self.assertNotEqual(rc, 0, "\n".join(lines))

    def test_security_exposure(self):
        sa = need_tool("systemd-analyze", "systemd")
        units = copy_units(self.tmp)
        for u in units:
            name = os.path.basename(u)[:-len(".service")]
            r = run([sa, "security", "--offline=yes", "--no-pager",
                     "--threshold=%d" % EXPOSURE_MAX[name], u], cwd=self.tmp)
            m = re.search(r"Overall exposure level for \S+: ([\d.]+)", r.stdout)
            self.assertIsNotNone(m, r.stdout + r.stderr)
            print("%s: exposure %s (bound %.1f)" % (name, m.group(1), EXPOSURE_MAX[name] / 10))
            self.assertEqual(r.returncode, 0, "%s exposure %s above %.1f:\n%s"
                             % (name, m.group(1), EXPOSURE_MAX[name] / 10, r.stdout))

    def common_checks(self, u, user):
        s = u["Service"]
        self.assertEqual(s["User"], [user])
        self.assertEqual(s["Group"], [user])
        self.assertEqual(s["StateDirectory"], [user])
        self.assertEqual(s["ProtectSystem"], ["strict"])
        self.assertEqual(s["ProtectHome"], ["yes"])
        self.assertEqual(s["PrivateTmp"], ["yes"])
        self.assertEqual(s["NoNewPrivileges"], ["yes"])
        self.assertEqual(s["ProtectKernelTunables"], ["yes"])
        self.assertEqual(s["LockPersonality"], ["yes"])
        self.assertEqual(s["Restart"], ["on-failure"])
        self.assertEqual(s["KillSignal"], ["SIGTERM"])
        self.assertEqual(sorted(s["RestrictAddressFamilies"][-1].split()),
                         ["AF_INET", "AF_INET6", "AF_UNIX"])
        self.assertEqual(s["CapabilityBoundingSet"], [""])
        self.assertEqual(u["Install"]["WantedBy"], ["multi-user.target"])
        return s

    def test_server_unit_settings(self):
        u = parse_unit(os.path.join(CONF, "gpupool-server.service"))
        s = self.common_checks(u, "gpupool")
        self.assertEqual(s["ExecStart"], ["/usr/bin/gpupool-server --config /etc/gpupool/server.conf"])
        self.assertEqual(s["PrivateDevices"], ["yes"])
        self.assertEqual(s["MemoryDenyWriteExecute"], ["yes"])
        # The stop timeout outlasts the drain, with the example config's
        # grace and with the built-in default.
        conf = print_config(SERVER_BIN, os.path.join(CONF, "server.conf"))
        default = print_config(SERVER_BIN, os.devnull)
        stop = seconds(s["TimeoutStopSec"][-1])
        for v in (conf, default):
            self.assertLess(int(v["shutdown_grace_sec"][0]) + 5, stop,
                            "TimeoutStopSec=%d leaves no room after shutdown_grace_sec" % stop)
        # The example's DB is in the state directory systemd creates.
        self.assertEqual(os.path.dirname(conf["db"][0]), "/var/lib/" + s["StateDirectory"][0])
        self.assertEqual(s["WorkingDirectory"], ["/var/lib/gpupool"])

    def test_agent_unit_settings(self):
        u = parse_unit(os.path.join(CONF, "gpupool-agent.service"))
        s = self.common_checks(u, "gpupool-agent")
        self.assertEqual(s["ExecStart"], ["/usr/bin/gpupool-agent --config /etc/gpupool/agent.conf"])
        # Settings that would hide /dev/nvidia* (PrivateDevices, and
        # ProtectClock's implied device allow-list) or break CUDA's JIT.
        for k in ("PrivateDevices", "ProtectClock", "MemoryDenyWriteExecute", "DevicePolicy",
                  "DeviceAllow", "ProcSubset", "PrivateUsers"):
            self.assertNotIn(k, s, "%s= would break GPU access for the agent" % k)
        self.assertEqual(sorted(s["SupplementaryGroups"][-1].split()), ["render", "video"])
        self.assertNotIn("ExecReload", s)  # the agent has no SIGHUP handler
        conf = print_config(AGENT_BIN, os.path.join(CONF, "agent.conf"))
        stop = seconds(s["TimeoutStopSec"][-1])
        self.assertLess(int(conf["drain-timeout-sec"][0]) + 5, stop)
        self.assertEqual(conf["state-dir"][0], "/var/lib/" + s["StateDirectory"][0])
        self.assertTrue(conf["model"][0].startswith(conf["state-dir"][0] + "/"),
                        "the example model must be readable under ProtectSystem=strict")

    def test_sysusers_creates_the_unit_users(self):
        su = need_tool("systemd-sysusers", "systemd")
        root = os.path.join(self.tmp, "root")
        os.makedirs(os.path.join(root, "etc"))
        r = run([su, "--root=" + root, os.path.join(CONF, "gpupool.sysusers")])
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(root, "etc", "passwd")) as f:
            users = {l.split(":")[0]: l.strip().split(":") for l in f if l.strip()}
        with open(os.path.join(root, "etc", "group")) as f:
            groups = {l.split(":")[0]: l.strip().split(":")[3].split(",") for l in f if l.strip()}
        for unit in ("gpupool-server", "gpupool-agent"):
            user = parse_unit(os.path.join(CONF, unit + ".service"))["Service"]["User"][0]
            self.assertIn(user, users)
            pw = users[user]
            self.assertLess(int(pw[2]), 1000, "%s must be a system user" % user)
            self.assertEqual(pw[5], "/var/lib/" + user)
            self.assertTrue(pw[6].endswith("nologin"), pw)
        self.assertIn("gpupool-agent", groups["video"])
        self.assertIn("gpupool-agent", groups["render"])
        self.assertNotIn("gpupool", groups["video"])

    def test_example_configs_parse(self):
        srv = print_config(SERVER_BIN, os.path.join(CONF, "server.conf"))
        self.assertEqual(srv["config"][1], "flag")
        self.assertEqual(srv["listen"], ("127.0.0.1:8080", "file"))
        self.assertEqual(srv["shutdown_grace_sec"][1], "file")
        ag = print_config(AGENT_BIN, os.path.join(CONF, "agent.conf"))
        self.assertEqual(ag["server"][1], "file")
        self.assertEqual(ag["model"][1], "file")
        # And a bad key is refused (so exit 0 above means every key is known).
        bad = os.path.join(self.tmp, "bad.conf")
        with open(bad, "w") as f:
            f.write("listen = 127.0.0.1:8080\nshutdown_grace = 30\n")
        r = run([SERVER_BIN, "--config", bad, "--print-config"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("shutdown_grace", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
