# NATS servers with JetStream for the tests: a cluster of nodes on loopback, or one alone.
import json
import os
import shutil
import signal
import urllib.request

from e2e_support import free_port, wait_until


class NatsCluster:
    """`size` nats-server processes with JetStream, clustered when more than one, their data in
    directories under env.base. `extra` is added to every node's configuration (e.g. an
    authorization block, or max_payload)."""

    def __init__(self, env, name, size=3, extra=""):
        self.env = env
        self.name = name
        self.size = size
        self.extra = extra
        self.ports = [free_port() for _ in range(size)]
        self.cluster_ports = [free_port() for _ in range(size)]
        self.http_ports = [free_port() for _ in range(size)]
        self.procs = [None] * size
        self.dir = os.path.join(env.base, "nats-" + name)
        os.makedirs(self.dir, exist_ok=True)

    def url(self, i):
        return "nats://127.0.0.1:%d" % self.ports[i]

    def urls(self):
        return ",".join(self.url(i) for i in range(self.size))

    def _config(self, i):
        path = os.path.join(self.dir, "n%d.conf" % i)
        store = os.path.join(self.dir, "n%d" % i)
        lines = ["server_name: %s-n%d" % (self.name, i), "listen: 127.0.0.1:%d" % self.ports[i],
                 "http: 127.0.0.1:%d" % self.http_ports[i],
                 "jetstream { store_dir: \"%s\", max_memory_store: 64MB, max_file_store: 1GB }" % store]
        if self.size > 1:
            routes = ", ".join("nats-route://127.0.0.1:%d" % p for p in self.cluster_ports)
            lines.append("cluster { name: %s, listen: 127.0.0.1:%d, routes: [%s] }"
                         % (self.name, self.cluster_ports[i], routes))
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n" + self.extra + "\n")
        return path

    def start_node(self, i):
        log = open(os.path.join(self.dir, "n%d.log" % i), "ab")
        self.procs[i] = self.env.spawn([shutil.which("nats-server") or "nats-server", "-c", self._config(i)],
                                       stdout=log, stderr=log)

    def stop_node(self, i, sig=signal.SIGKILL):
        p = self.procs[i]
        if p is not None and p.poll() is None:
            p.send_signal(sig)
            p.wait(15)
        self.procs[i] = None

    def jsz(self, i):
        with urllib.request.urlopen("http://127.0.0.1:%d/jsz" % self.http_ports[i], timeout=2) as r:
            return json.load(r)

    def ready(self):
        """Every running node answers, and the cluster has elected a JetStream meta leader."""
        try:
            for i in range(self.size):
                if self.procs[i] is None:
                    continue
                z = self.jsz(i)
                if self.size > 1 and not (z.get("meta_cluster") or {}).get("leader"):
                    return False
            return True
        except OSError:
            return False

    def start(self, timeout=60):
        for i in range(self.size):
            self.start_node(i)
        wait_until(self.ready, timeout, "NATS cluster %s ready (JetStream meta leader)" % self.name, 0.2)
        return self

    def log_tail(self, i, lines=20):
        try:
            with open(os.path.join(self.dir, "n%d.log" % i), "rb") as f:
                return b"\n".join(f.read().splitlines()[-lines:]).decode("utf-8", "replace")
        except OSError:
            return ""

    def stop(self):
        for i in range(self.size):
            self.stop_node(i, signal.SIGTERM)

