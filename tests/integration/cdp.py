"""A small driver for headless Chromium over the Chrome DevTools Protocol,
standard library only (the dashboard's browser test).

    b = Browser(tmpdir)              # chromium --headless, its own profile
    page = b.page()                  # the first tab, as a CDP session
    page.navigate(url)
    page.wait_js("document.querySelector('#x') !== null", timeout=30)
    page.js("document.title")        # evaluate, return the value
    page.screenshot(path)            # PNG
    b.close()                        # kills the browser's process group

The websocket client speaks just what CDP needs: the RFC 6455 handshake,
masked text frames out, text/close/ping frames in (unfragmented or
fragmented). Chromium is started with --remote-debugging-port=0 and writes
the port it chose to DevToolsActivePort in its profile directory.
"""

import base64
import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import urllib.request


def chromium_binary():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


class CDPError(Exception):
    pass


class _WebSocket:
    def __init__(self, url, timeout):
        assert url.startswith("ws://")
        hostport, _, path = url[5:].partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        req = ("GET /%s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n\r\n" % (path, hostport, key))
        self.sock.sendall(req.encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(4096)
            if not chunk:
                raise CDPError("websocket handshake: connection closed")
            head += chunk
        head, _, self.buf = head.partition(b"\r\n\r\n")
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise CDPError("websocket handshake refused: %r" % head[:200])

    def _read(self, n):
        while len(self.buf) < n:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise CDPError("websocket closed")
            self.buf += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def send(self, text):
        data = text.encode()
        hdr = bytearray([0x81])
        n = len(data)
        if n < 126:
            hdr.append(0x80 | n)
        elif n < 65536:
            hdr.append(0x80 | 126)
            hdr += struct.pack(">H", n)
        else:
            hdr.append(0x80 | 127)
            hdr += struct.pack(">Q", n)
        mask = os.urandom(4)
        hdr += mask
        self.sock.sendall(bytes(hdr) + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self, timeout):
        self.sock.settimeout(timeout)
        msg = b""
        while True:
            b0, b1 = self._read(2)
            op, n = b0 & 0x0F, b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            if op == 0x8:
                raise CDPError("websocket closed by the browser")
            if op == 0x9:   # ping: answer pong
                continue
            if op in (0x1, 0x0):
                msg += payload
                if b0 & 0x80:
                    return msg.decode()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


class Page:
    def __init__(self, ws_url, timeout=30):
        self.ws = _WebSocket(ws_url, timeout)
        self.next_id = 0
        self.events = []

    def call(self, method, params=None, timeout=30):
        self.next_id += 1
        mid = self.next_id
        self.ws.send(json.dumps({"id": mid, "method": method, "params": params or {}}))
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise CDPError("%s: no answer in %ss" % (method, timeout))
            m = json.loads(self.ws.recv(left))
            if m.get("id") == mid:
                if "error" in m:
                    raise CDPError("%s: %s" % (method, m["error"]))
                return m.get("result", {})
            if "method" in m and len(self.events) < 1000:
                self.events.append(m)

    def navigate(self, url):
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Page.navigate", {"url": url})

    def js(self, expr, timeout=30):
        r = self.call("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True}, timeout)
        if "exceptionDetails" in r:
            raise CDPError("js %r: %s" % (expr, r["exceptionDetails"].get("text")))
        return r.get("result", {}).get("value")

    def wait_js(self, expr, timeout=30, what=None):
        """Poll expr (every 100 ms, bounded by timeout) until it is truthy;
        returns its value."""
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            try:
                v = self.js(expr, timeout=max(1, deadline - time.monotonic()))
                if v:
                    return v
                last = v
            except CDPError as e:
                last = e
            time.sleep(0.1)
        raise AssertionError("timed out after %ss waiting for %s (last: %r)"
                             % (timeout, what or expr, last))

    def screenshot(self, path):
        r = self.call("Page.captureScreenshot", {"format": "png"}, timeout=60)
        with open(path, "wb") as f:
            f.write(base64.b64decode(r["data"]))

    def close(self):
        self.ws.close()


class Browser:
    def __init__(self, tmpdir, width=1400, height=1100, timeout=60):
        exe = chromium_binary()
        if not exe:
            raise CDPError("no chromium on PATH")
        self.profile = os.path.join(tmpdir, "chromium-profile")
        os.makedirs(self.profile, exist_ok=True)
        self.log = open(os.path.join(tmpdir, "chromium.log"), "wb")
        args = [exe, "--headless=new", "--no-sandbox", "--disable-gpu",
                "--disable-dev-shm-usage", "--no-first-run", "--no-default-browser-check",
                "--disable-extensions", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--metrics-recording-only",
                "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
                "--user-data-dir=" + self.profile,
                "--window-size=%d,%d" % (width, height), "about:blank"]
        # Its own process group: close() kills the renderers too.
        self.p = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
        port_file = os.path.join(self.profile, "DevToolsActivePort")
        deadline = time.monotonic() + timeout
        self.port = None
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise CDPError("chromium exited with %s (see chromium.log)" % self.p.returncode)
            try:
                with open(port_file) as f:
                    self.port = int(f.readline().strip())
                break
            except (OSError, ValueError):
                time.sleep(0.1)
        if not self.port:
            self.close()
            raise CDPError("chromium wrote no DevToolsActivePort in %ss" % timeout)

    def page(self, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/json/list" % self.port,
                                            timeout=5) as r:
                    targets = json.loads(r.read())
                pages = [t for t in targets if t.get("type") == "page"]
                if pages:
                    return Page(pages[0]["webSocketDebuggerUrl"], timeout)
            except OSError:
                pass
            time.sleep(0.1)
        raise CDPError("no page target in %ss" % timeout)

    def close(self):
        if self.p.poll() is None:
            try:
                os.killpg(self.p.pid, signal.SIGTERM)
                self.p.wait(timeout=10)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.p.wait(timeout=10)
        self.log.close()
