"""`cmake --install BUILD --prefix TMP` puts every file where
docs/operations.md says (its ```layout block), with the installed units
naming the installed binaries and configs (checked by systemd-analyze verify,
which needs the ExecStart binary to exist), and the installed binaries run
with the installed example configs.

Needs cmake (the one that configured BUILD) and systemd-analyze (Debian
package `systemd`); without them the test fails and says so.
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
    """The absolute paths listed in docs/operations.md's ```layout block."""
    with open(os.path.join(SOURCE_DIR, "docs", "operations.md")) as f:
        text = f.read()
    m = re.search(r"^```layout\n(.*?)^```", text, re.S | re.M)
    assert m, "docs/operations.md has no ```layout block"
    paths = [l.strip() for l in m.group(1).splitlines() if l.strip()]
    assert paths and all(p.startswith(("/usr/", "/etc/")) for p in paths), paths
    return paths


CUDA_PLUGIN = "/usr/lib/gpupool/libgpupool-cuda.so"


def expected_files():
    """Layout paths plus every file of docs/ and migrations/."""
    paths = set(documented_layout())
    docs = os.path.join(SOURCE_DIR, "docs")
    for root, _, files in os.walk(docs):
        for f in files:
            rel = os.path.relpath(os.path.join(root, f), docs)
            paths.add("/usr/share/doc/gpupool/" + rel)
    for f in os.listdir(os.path.join(SOURCE_DIR, "migrations")):
        if f.endswith(".sql"):
            paths.add("/usr/share/gpupool/migrations/" + f)
    # A build with the CUDA backend also installs its plugin (the layout's
    # note in docs/operations.md).
    if os.path.isfile(os.path.join(BUILD_DIR, "src", "engine", "libgpupool-cuda.so")):
        paths.add(CUDA_PLUGIN)
    return sorted(paths)


def under_prefix(path, prefix):
    """Where a /usr-prefix path lands for another prefix (see the docs)."""
    if path.startswith("/etc/"):
        return prefix + path
    return prefix + path[len("/usr"):]


class InstallTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="gp-install-")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        cmake = need_tool("cmake", "cmake")
        r = run([cmake, "--install", BUILD_DIR, "--prefix", cls.prefix])
        cls.install_out = r.stdout + r.stderr
        cls.install_rc = r.returncode

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def setUp(self):
        self.assertEqual(self.install_rc, 0, "cmake --install failed:\n" + self.install_out)

    def test_files_where_the_docs_say(self):
        missing = [p for p in expected_files()
                   if not os.path.isfile(under_prefix(p, self.prefix))]
        self.assertEqual(missing, [], "not installed:\n" + "\n".join(missing))
        for b in ("gpupool-server", "gpupool-agent", "gpupool-run", "gpupoolctl"):
            self.assertTrue(os.access(os.path.join(self.prefix, "bin", b), os.X_OK), b)
        for c in ("server.conf", "agent.conf"):
            with open(os.path.join(SOURCE_DIR, "conf", c)) as a, \
                 open(os.path.join(self.prefix, "etc", "gpupool", c)) as b:
                self.assertEqual(a.read(), b.read(), c)
            mode = os.stat(os.path.join(self.prefix, "etc", "gpupool", c)).st_mode & 0o777
            self.assertEqual(mode, 0o644, c)

    def test_nothing_unexpected(self):
        # Only documented files: no test binaries, static libraries, headers.
        expected = {under_prefix(p, self.prefix) for p in expected_files()}
        got = set()
        for root, _, files in os.walk(self.prefix):
            got.update(os.path.join(root, f) for f in files)
        extra = sorted(got - expected)
        self.assertEqual(extra, [], "installed but not documented:\n" + "\n".join(extra))

    def test_units_point_at_the_install(self):
        unitdir = os.path.join(self.prefix, "lib", "systemd", "system")
        etc = os.path.join(self.prefix, "etc", "gpupool")
        for name in ("gpupool-server", "gpupool-agent"):
            with open(os.path.join(unitdir, name + ".service")) as f:
                text = f.read()
            conf = "server.conf" if name == "gpupool-server" else "agent.conf"
            self.assertIn("\nExecStart=%s/bin/%s --config %s/%s\n"
                          % (self.prefix, name, etc, conf), text)
            self.assertNotIn("/usr/bin/", text)
            self.assertNotIn("/etc/gpupool/", text.replace(etc + "/", ""))
        sa = need_tool("systemd-analyze", "systemd")
        units = [os.path.join(unitdir, n + ".service") for n in ("gpupool-server", "gpupool-agent")]
        r = run([sa, "verify", "--man=no"] + units, cwd=self.tmp)
        out = (r.stdout + r.stderr).strip()
        self.assertEqual(r.returncode, 0, out)
        self.assertEqual(out, "", "systemd-analyze verify warned:\n" + out)

    def test_installed_binaries_read_installed_configs(self):
        etc = os.path.join(self.prefix, "etc", "gpupool")
        for b, c in (("gpupool-server", "server.conf"), ("gpupool-agent", "agent.conf")):
            r = run([os.path.join(self.prefix, "bin", b), "--config", os.path.join(etc, c),
                     "--print-config"], timeout=30)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertRegex(r.stdout, r"(?m)^config\s+=\s+%s\s+# flag$" % re.escape(os.path.join(etc, c)))
        r = run([os.path.join(self.prefix, "bin", "gpupool-run"), "--help"], timeout=30)
        self.assertIn("gpupool-run", r.stdout + r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
