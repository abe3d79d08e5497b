"""Per-key limits end to end with real processes: gpupool-server, a real
gpupool-agent (openai backend) and the scripted upstream (upstream.py).

Covers: requests per minute (429 + Retry-After in the OpenAI, Anthropic and
native dialects), tokens per day (429 TOKEN_LIMIT, still spent after a
server restart, usage rows in key_usage), max_concurrent (extra jobs wait
in the queue and all finish, never more than N at the upstream at once,
while another key runs beside them), and the admin key the server
generates when auth is on.
"""

import os
import stat
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from harness import bearer, http_json  # noqa: E402

FAST = ["--poll_interval_sec", "1", "--work_wait_sec", "5"]


def create_key(h, db, role, *opts):
    r = subprocess.run([harness.SERVER_BIN, "keys", "create", "--role", role, "--db", h.store_uri(db),
                        "--name", "limits-test"] + list(opts),
                       capture_output=True, text=True, timeout=30, env=h.env())
    assert r.returncode == 0, "keys create failed: %s" % r.stderr
    return r.stdout.strip().splitlines()[-1]


def complete(srv, key, prompt="hello there", max_tokens=3):
    return http_json("POST", srv.url + "/v1/completions",
                     {"model": "m1", "prompt": prompt, "max_tokens": max_tokens},
                     headers=bearer(key), timeout=60)


class LimitsTest(harness.TestCase):

    def pool(self, db, agent_key, up_args=("--tokens", "6"), slots=4, port=0):
        self.up = self.h.start_upstream(list(up_args))
        # debug: test_max_concurrent_waits_in_queue reads job_submitted and
        # job_assigned, which are debug lines
        srv = self.h.start_server(FAST + ["--log_level", "debug"], db=db, port=port)
        self.h.start_agent(srv, upstream=self.up, model="m1", slots=slots, token=agent_key)
        return srv

    def wait_model(self, srv, key):
        srv.key = key
        srv.wait_model("m1")

    def test_rpm_in_every_dialect(self):
        db = self.h.path("rpm.db")
        ck = create_key(self.h, db, "client", "--rpm", "2")
        ak = create_key(self.h, db, "agent")
        srv = self.pool(db, ak)
        self.wait_model(srv, ck)  # /v1/models is no request of the limited kind
        for _ in range(2):
            st, _, body = complete(srv, ck)
            self.assertEqual(st, 200, body)
        st, hdr, body = complete(srv, ck)
        self.assertEqual(st, 429, body)
        self.assertGreaterEqual(int(hdr["retry-after"]), 1)
        self.assertLessEqual(int(hdr["retry-after"]), 31)
        self.assertEqual(body["error"]["code"], "rate_limited")  # OpenAI codes are lower case
        self.assertEqual(body["error"]["type"], "rate_limit_error")

        st, hdr, body = http_json("POST", srv.url + "/v1/messages",
                                  {"model": "m1", "max_tokens": 3,
                                   "messages": [{"role": "user", "content": "hi"}]},
                                  headers={"x-api-key": ck, "anthropic-version": "2023-06-01"})
        self.assertEqual(st, 429, body)
        self.assertEqual(body["type"], "error")
        self.assertEqual(body["error"]["type"], "rate_limit_error")
        self.assertIn("retry-after", hdr)

        st, hdr, body = http_json("POST", srv.url + "/v2/tasks",
                                  {"model": "m1", "prompt": "x", "max_tokens": 3},
                                  headers=bearer(ck))
        self.assertEqual(st, 429, body)
        self.assertEqual(body["error"]["code"], "RATE_LIMITED")
        self.assertIn("retry-after", hdr)

        # Another key is not affected by this one's limit.
        other = create_key(self.h, db, "client")
        srv.signal(__import__("signal").SIGHUP)  # the CLI wrote it behind the server's back
        harness.wait_until(lambda: complete(srv, other)[0] == 200, timeout=20,
                           what="the new key accepted after SIGHUP")

        # The refusals are counted for the metrics and the accounting.
        _, _, text = harness.http_request("GET", srv.url + "/metrics")
        self.assertIn('gpupool_rate_limited_total{reason="rpm"} 3', text.decode())

    def test_tokens_per_day_survive_restart(self):
        db = self.h.path("tpd.db")
        ck = create_key(self.h, db, "client", "--tokens-per-day", "5")
        ak = create_key(self.h, db, "agent")
        srv = self.pool(db, ak)
        self.wait_model(srv, ck)
        st, _, body = complete(srv, ck, max_tokens=6)
        self.assertEqual(st, 200, body)
        used = body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"]
        self.assertGreaterEqual(used, 6)
        st, hdr, body = complete(srv, ck)
        self.assertEqual(st, 429, body)
        self.assertEqual(body["error"]["code"], "token_limit")
        # Until the next UTC midnight.
        self.assertGreaterEqual(int(hdr["retry-after"]), 1)
        self.assertLessEqual(int(hdr["retry-after"]), 86400)

        # A restart on the same DB keeps today's spending.
        port = int(srv.url.rsplit(":", 1)[1])
        srv.stop()
        srv2 = self.h.start_server(FAST, db=db, port=port)
        self.wait_model(srv2, ck)
        st, _, body = complete(srv2, ck)
        self.assertEqual(st, 429, body)
        self.assertEqual(body["error"]["code"], "token_limit")

        srv2.stop()  # SIGTERM flushes the store
        rows = self.h.query(db, "SELECT k.name, u.requests, u.prompt_tokens + u.completion_tokens,"
                                " u.rate_limited FROM key_usage u JOIN api_keys k"
                                " ON k.id = u.key_id WHERE k.role = 'client'")
        self.assertEqual(len(rows), 1, rows)
        self.assertEqual(rows[0][1], 1)
        self.assertEqual(rows[0][2], used)
        self.assertEqual(rows[0][3], 2)

    def test_tokens_per_day_hold_under_concurrency(self):
        """Issue 25, finding 4: 30 concurrent requests of 50 tokens on a key
        with 100 tokens a day were all admitted (1,590 tokens spent): the
        check saw finished jobs only. Each now reserves its most at
        admission, so the budget overshoots by one request at most."""
        db = self.h.path("tpdc.db")
        ck = create_key(self.h, db, "client", "--tokens-per-day", "100")
        ak = create_key(self.h, db, "agent")
        adm = create_key(self.h, db, "admin")
        # The upstream holds every generation before its first token: all
        # 30 requests are in flight together, none has ended.
        srv = self.pool(db, ak, up_args=("--tokens", "50", "--first-delay-ms", "600000"),
                        slots=32)
        self.wait_model(srv, ck)
        results = []
        lock = threading.Lock()

        def run():
            r = complete(srv, ck, prompt="hello there", max_tokens=50)
            with lock:
                results.append(r)
        threads = [threading.Thread(target=run) for _ in range(30)]
        for t in threads:
            t.start()

        def refused():
            with lock:
                return len([r for r in results if r[0] == 429])
        harness.wait_until(lambda: refused() == 28, timeout=60,
                           what="28 of the 30 requests refused while two run")
        for r in results:
            self.assertEqual(r[2]["error"]["code"], "token_limit", r)
        # The key's usage shows what the two running ones hold.
        st, _, keys = http_json("GET", srv.url + "/admin/keys", headers=bearer(adm))
        self.assertEqual(st, 200, keys)
        mine = [k for k in keys["keys"] if k["role"] == "client"][0]
        self.assertGreaterEqual(mine["usage_today"]["reserved_tokens"], 100)
        self.up.control(first_delay_ms=0)
        for t in threads:
            t.join(120)
            self.assertFalse(t.is_alive(), "a request did not finish")
        ok = [r for r in results if r[0] == 200]
        self.assertEqual(len(ok), 2, [r[0] for r in results])
        spent = sum(r[2]["usage"]["prompt_tokens"] + r[2]["usage"]["completion_tokens"]
                    for r in ok)
        # At most one request over the budget.
        self.assertLessEqual(spent, 100 + max(r[2]["usage"]["prompt_tokens"] +
                                              r[2]["usage"]["completion_tokens"] for r in ok))
        st, _, keys = http_json("GET", srv.url + "/admin/keys", headers=bearer(adm))
        mine = [k for k in keys["keys"] if k["role"] == "client"][0]
        self.assertEqual(mine["usage_today"]["reserved_tokens"], 0)

    def test_max_concurrent_waits_in_queue(self):
        # The order is checked through the server's own state, never by
        # comparing clocks of two processes: the upstream holds every
        # request before its first token (first_delay_ms, released through
        # its control endpoint), so the limited key's first job stays
        # non-terminal in the server for as long as the test wants. While it
        # does, the key's two other jobs must stay held (never assigned),
        # although slots are free: the unlimited key's job, submitted after
        # them, reaches the upstream.
        db = self.h.path("conc.db")
        ck = create_key(self.h, db, "client", "--max-concurrent", "1")
        free = create_key(self.h, db, "client")
        ak = create_key(self.h, db, "agent")
        srv = self.pool(db, ak, up_args=("--tokens", "4", "--first-delay-ms", "600000"),
                        slots=4)
        self.wait_model(srv, ck)
        results = {}

        def run(tag, key):
            results[tag] = http_json("POST", srv.url + "/v1/completions",
                                     {"model": "m1", "prompt": "job " + tag, "max_tokens": 4},
                                     headers=dict(bearer(key), **{"X-Correlation-Id": tag}),
                                     timeout=120)

        def events(name, tags):
            return [e for e in srv.log_events(name) if e.get("correlation_id") in tags]
        limited = ("c0", "c1", "c2")
        threads = []
        for tag in limited:
            threads.append(threading.Thread(target=run, args=(tag, ck)))
            threads[-1].start()
        harness.wait_until(lambda: len(events("job_submitted", limited)) == 3, timeout=60,
                           what="the limited key's three jobs submitted")
        threads.append(threading.Thread(target=run, args=("free", free)))
        threads[-1].start()
        at_upstream = lambda: [e["prompt"] for e in self.up.log_entries()]  # noqa: E731
        harness.wait_until(lambda: "job free" in at_upstream(), timeout=60,
                           what="the unlimited key's job at the upstream")
        # One limited job runs (held upstream), the two others are held by
        # the server: submitted as held and not assigned.
        self.assertEqual(sorted(e["held"] for e in events("job_submitted", limited)),
                         [False, True, True])
        self.assertEqual(len(events("job_assigned", limited)), 1)
        self.assertEqual(len([p for p in at_upstream() if p.startswith("job c")]), 1)
        self.up.control(first_delay_ms=0)  # let everything go on
        for t in threads:
            t.join(120)
            self.assertFalse(t.is_alive(), "a request did not finish")
        for tag, (st, _, body) in results.items():
            self.assertEqual(st, 200, (tag, body))
        self.assertEqual(len(results), 4)
        self.assertEqual(len([p for p in at_upstream() if p.startswith("job c")]), 3)
        self.assertEqual(len(events("job_done", limited)), 3)

    def test_count_tokens_does_not_wait_for_max_concurrent(self):
        db = self.h.path("ct.db")
        ck = create_key(self.h, db, "client", "--max-concurrent", "1")
        ak = create_key(self.h, db, "agent")
        # The upstream holds the generation before its first token until the
        # test releases it: "still under way" is then a fact, not a race
        # between a 10 s generation and a loaded machine.
        srv = self.pool(db, ak, up_args=("--tokens", "50", "--first-delay-ms", "600000"),
                        slots=4)
        self.wait_model(srv, ck)
        out = {}
        t = threading.Thread(target=lambda: out.setdefault("r", complete(srv, ck, max_tokens=50)))
        t.start()
        harness.wait_until(lambda: any(e["outcome"] == "running" for e in self.up.log_entries()),
                           timeout=60, what="the long job running upstream")
        st, _, body = http_json("POST", srv.url + "/v1/messages/count_tokens",
                                {"model": "m1", "messages": [{"role": "user", "content": "a b c"}]},
                                headers={"x-api-key": ck}, timeout=60)
        self.assertEqual(st, 200, body)
        self.assertGreater(body["input_tokens"], 0)
        # The generation was still under way: count_tokens did not wait for it.
        self.assertTrue(any(e["outcome"] == "running" for e in self.up.log_entries()))
        self.up.control(first_delay_ms=0)
        t.join(120)
        self.assertFalse(t.is_alive())
        st, _, gen = out["r"]
        self.assertEqual(st, 200, gen)
        # Only the generation is charged to the key's daily tokens.
        srv.stop()
        spent = self.h.query(db, "SELECT sum(u.prompt_tokens + u.completion_tokens) FROM key_usage u"
                                 " JOIN api_keys k ON k.id = u.key_id WHERE k.role = 'client'")[0][0]
        self.assertEqual(spent, gen["usage"]["prompt_tokens"] + gen["usage"]["completion_tokens"])

    def test_keys_cli(self):
        db = self.h.path("cli.db")

        def run(*args):
            args = [self.h.store_uri(a) if a == db else a for a in args]
            return subprocess.run([harness.SERVER_BIN, "keys"] + args, capture_output=True,
                                  text=True, timeout=30, env=self.h.env())
        r = run("create", "--role", "enrollment", "--max-uses", "2", "--expires-in-sec", "600",
                "--db", db)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertTrue(r.stdout.strip().startswith("gpk_"))
        kid, role, max_uses, exp = self.h.query(
            db, "SELECT id, role, max_uses, expires_at FROM api_keys")[0]
        self.assertEqual((role, max_uses), ("enrollment", 2))
        self.assertGreater(exp, 0)
        r = run("revoke", kid, "--db", db)
        self.assertEqual(r.returncode, 0, r.stderr)
        r = run("revoke", kid, "--db", db)  # no active key of that id any more
        self.assertEqual(r.returncode, 1)
        self.assertIn("no active key", r.stderr)
        # Bad input: named, exit 2, nothing written.
        for args, needle in ((("--rpm", "-1"), "--rpm"), (("--rpm", "ten"), "--rpm"),
                             (("--bogus", "1"), "unknown option"), ((), "--role")):
            r = run("create", *(["--role", "client"] if args != () else []), *args, "--db", db)
            self.assertEqual(r.returncode, 2, (args, r.stderr))
            self.assertIn(needle, r.stderr)
        r = run("create", "--role", "root", "--db", db)
        self.assertEqual(r.returncode, 2)
        self.assertIn("role", r.stderr)
        self.assertEqual(self.h.query(db, "SELECT count(*) FROM api_keys")[0][0], 1)

    def test_generated_admin_key(self):
        db = self.h.path("adm.db")
        ak = create_key(self.h, db, "agent")  # any key turns auth on
        self.pool(db, ak)
        path = self.h.path("admin.key")
        harness.wait_until(lambda: os.path.exists(path), timeout=20, what="admin.key written")
        self.assertEqual(stat.S_IMODE(os.stat(path).st_mode), 0o600)
        with open(path) as f:
            key = f.read().strip()
        self.assertTrue(key.startswith("gpk_"))


if __name__ == "__main__":
    harness.main()
