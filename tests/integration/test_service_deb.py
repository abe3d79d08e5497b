"""`cpack -G DEB` in the build dir makes a .deb that holds what
docs/operations.md lists (binaries, units, sysusers.d, example configs as
conffiles, docs, migrations) with the run-time library Depends, and whose
unpacked binaries and units work.

cpack writes only into a temp dir (-B); it packs the binaries `cmake --build`
made (it does not build). Needs cpack (Debian package `cmake`), dpkg-deb
(`dpkg`) and systemd-analyze (`systemd`); without them the test fails and says
so. Takes a few seconds.
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

# Debian 12 package names of the libraries the binaries link.
REQUIRED_DEPENDS = ["libevent-2.1-7", "libsqlite3-0", "libjansson4", "libssl3", "libcurl4"]


def need_tool(name, package):
    path = shutil.which(name)
    if not path:
        raise AssertionError("%s not found: install the Debian package '%s' "
                             "(apt-get install %s)" % (name, package, package))
    return path


def run(argv, timeout=120, **kw):
    return subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=timeout, **kw)


def documented_layout():
    with open(os.path.join(SOURCE_DIR, "docs", "operations.md")) as f:
        text = f.read()
    m = re.search(r"^```layout\n(.*?)^```", text, re.S | re.M)
    assert m, "docs/operations.md has no ```layout block"
    return [l.strip() for l in m.group(1).splitlines() if l.strip()]


class DebTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gp-deb-")
        cpack = need_tool("cpack", "cmake")
        cfg = os.path.join(BUILD_DIR, "CPackConfig.cmake")
        if not os.path.isfile(cfg):
            raise AssertionError("%s missing: the build dir was configured without "
                                 "cmake/Packaging.cmake" % cfg)
        out = os.path.join(cls.tmp, "out")
        r = run([cpack, "-G", "DEB", "--config", cfg, "-B", out], cwd=BUILD_DIR, timeout=300)
        cls.cpack_out = r.stdout + r.stderr
        cls.cpack_rc = r.returncode
        cls.deb = None
        if r.returncode == 0:
            debs = [f for f in os.listdir(out) if f.endswith(".deb")]
            if len(debs) == 1:
                cls.deb = os.path.join(out, debs[0])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertEqual(self.cpack_rc, 0, "cpack failed:\n" + self.cpack_out)
        self.assertIsNotNone(self.deb, "cpack made no single .deb:\n" + self.cpack_out)
        self.dpkg_deb = need_tool("dpkg-deb", "dpkg")

    def field(self, name):
        r = run([self.dpkg_deb, "--field", self.deb, name])
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip()

    def test_contents(self):
        r = run([self.dpkg_deb, "--contents", self.deb])
        self.assertEqual(r.returncode, 0, r.stderr)
        entries = {}
        for line in r.stdout.splitlines():
            parts = line.split(None, 5)
            path = parts[5]
            if not path.endswith("/"):
                entries[path[1:]] = (parts[0], parts[1])  # "./usr/bin/x" -> "/usr/bin/x"
        expected = set(documented_layout())
        for f in os.listdir(os.path.join(SOURCE_DIR, "docs")):
            if os.path.isfile(os.path.join(SOURCE_DIR, "docs", f)):
                expected.add("/usr/share/doc/gpupool/" + f)
        missing = sorted(expected - set(entries))
        self.assertEqual(missing, [], "not in the .deb:\n" + "\n".join(missing))
        for b in ("gpupool-server", "gpupool-agent", "gpupool-run", "gpupoolctl"):
            mode, owner = entries["/usr/bin/" + b]
            self.assertEqual((mode, owner), ("-rwxr-xr-x", "root/root"), b)
        self.assertEqual(entries["/etc/gpupool/server.conf"], ("-rw-r--r--", "root/root"))
        # Nothing outside /usr and /etc (e.g. the build machine's paths).
        stray = [p for p in entries if not p.startswith(("/usr/", "/etc/gpupool/"))]
        self.assertEqual(stray, [])

    def test_control(self):
        self.assertEqual(self.field("Package"), "gpupool")
        deps = [d.strip().split()[0] for d in self.field("Depends").split(",") if d.strip()]
        for want in REQUIRED_DEPENDS:
            self.assertIn(want, deps, "Depends: " + self.field("Depends"))
        version = self.field("Version")
        with open(os.path.join(SOURCE_DIR, "CMakeLists.txt")) as f:
            m = re.search(r"project\(gpupool VERSION ([0-9.]+)", f.read())
        self.assertEqual(version, m.group(1))

    def test_maintainer_scripts(self):
        ctl = os.path.join(self.tmp, "control")
        r = run([self.dpkg_deb, "--control", self.deb, ctl])
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(os.path.join(ctl, "conffiles")) as f:
            conffiles = f.read().split()
        self.assertEqual(sorted(conffiles), ["/etc/gpupool/agent.conf", "/etc/gpupool/server.conf"])
        for s in ("postinst", "prerm", "postrm"):
            p = os.path.join(ctl, s)
            self.assertTrue(os.access(p, os.X_OK), s)
            r = run(["sh", "-n", p])
            self.assertEqual(r.returncode, 0, "%s: %s" % (s, r.stderr))
        with open(os.path.join(ctl, "postinst")) as f:
            postinst = f.read()
        self.assertIn("systemd-sysusers /usr/lib/sysusers.d/gpupool.conf", postinst)

    def test_unpacked_package_works(self):
        root = os.path.join(self.tmp, "root")
        r = run([self.dpkg_deb, "-x", self.deb, root])
        self.assertEqual(r.returncode, 0, r.stderr)
        # Units name the final paths; verify them with those paths moved
        # under the unpack dir (verify needs the ExecStart binary).
        units = []
        for name in ("gpupool-server", "gpupool-agent"):
            with open(os.path.join(root, "usr/lib/systemd/system", name + ".service")) as f:
                text = f.read()
            conf = "server.conf" if name == "gpupool-server" else "agent.conf"
            self.assertIn("\nExecStart=/usr/bin/%s --config /etc/gpupool/%s\n" % (name, conf), text)
            p = os.path.join(self.tmp, name + ".service")
            with open(p, "w") as f:
                f.write(text.replace("=/usr/bin/", "=%s/usr/bin/" % root))
            units.append(p)
            # The stripped binary runs and reads the packaged config.
            r = run([os.path.join(root, "usr/bin", name), "--config",
                     os.path.join(root, "etc/gpupool", conf), "--print-config"], timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
        sa = need_tool("systemd-analyze", "systemd")
        r = run([sa, "verify", "--man=no"] + units, cwd=self.tmp)
        out = (r.stdout + r.stderr).strip()
        self.assertEqual(r.returncode, 0, out)
        self.assertEqual(out, "", "systemd-analyze verify warned:\n" + out)

    def test_cuda_plugin_optional(self):
        """A CUDA build's package holds the CUDA plugin but depends on no CUDA
        library, no binary links one, and the binaries start and run on the
        CPU when the plugin cannot load: here a plugin whose dependency is
        missing (GPUPOOL_CUDA_PLUGIN), as libcudart is on a CPU-only machine.
        In a CPU build (no plugin) the same checks run against the reason
        "not built"."""
        r = run([self.dpkg_deb, "--contents", self.deb])
        self.assertEqual(r.returncode, 0, r.stderr)
        has_plugin = "./usr/lib/gpupool/libgpupool-cuda.so" in r.stdout
        depends = self.field("Depends")
        self.assertNotRegex(depends, "cuda|cublas", "Depends: " + depends)
        root = os.path.join(self.tmp, "root-cuda")
        r = run([self.dpkg_deb, "-x", self.deb, root])
        self.assertEqual(r.returncode, 0, r.stderr)
        readelf = need_tool("readelf", "binutils")
        for b in ("gpupool-server", "gpupool-agent", "gpupool-run", "gpupoolctl"):
            r = run([readelf, "-d", os.path.join(root, "usr/bin", b)])
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertNotRegex(r.stdout, r"NEEDED.*(cudart|cublas)", b)
        grun = os.path.join(root, "usr/bin/gpupool-run")
        model = os.path.join(SOURCE_DIR, "models", "stories260K.gguf")
        # As installed: the plugin is found in ../lib/gpupool (or is absent).
        r = run([grun, "selftest", "-m", model], timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        if not has_plugin:
            self.assertIn("not built", r.stdout)
        elif "CUDA self-test: ok" not in r.stdout:
            # no GPU here: the plugin loaded and said why there is no device
            self.assertIn("no CUDA device is visible", r.stdout)
        # A plugin that cannot load: 0 GPUs with the reason, the CPU runs.
        broken = os.path.join(BUILD_DIR, "tests", "unit", "engine",
                              "libgpe_test_needs_missing.so")
        self.assertTrue(os.path.isfile(broken), broken + " not built")
        env = dict(os.environ, GPUPOOL_CUDA_PLUGIN=broken)
        r = run([grun, "selftest", "-m", model], env=env, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("libgpe_test_phantom.so: cannot open shared object file", r.stdout)
        self.assertIn("testing the CPU backend", r.stdout)
        r = run([grun, "generate", "-m", model, "-n", "4", "-p", "Once upon"], env=env,
                timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        r = run([grun, "selftest", "--backend", "cuda"], env=env, timeout=60)
        self.assertEqual(r.returncode, 1)
        self.assertIn("cannot load " + broken, r.stderr)
        r = run([grun, "generate", "-m", model, "-n", "4", "-p", "Once", "--backend", "cuda"],
                env=env, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("CUDA backend unavailable: cannot load", r.stderr)
        # The agent starts (reads its config) with the plugin unloadable.
        r = run([os.path.join(root, "usr/bin/gpupool-agent"), "--config",
                 os.path.join(root, "etc/gpupool/agent.conf"), "--print-config"],
                env=env, timeout=30)
        self.assertEqual(r.returncode, 0, r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
