# End-to-end: a FOR ALL TABLES publication never breaks pgrelay, in either capture mode.
"""FOR ALL TABLES holds every table, pgrelay's bookkeeping tables too, and Postgres then refuses
UPDATE and DELETE on any of them without a replica identity. This script creates such a
publication before pgrelay installs, after it installs, and between two restarts, with trigger
capture and native capture against an upstream given by URL and on the embedded default, and
checks each time that:
- pgrelay starts, captures and logs no refused update of its own tables;
- every permanent table in pgrelay's schema has a usable replica identity;
- through pgrelay, pg_publication_tables and pg_get_publication_tables leave out pgrelay's own
  schema and publications (Postgres itself lists them);
- a consumer of the publication through pgrelay gets the user's inserts, updates and deletes,
  and no Relation of pgrelay's schema.
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from e2e_support import PG_BIN, expect, expect_eq, free_port, main, wait_until  # noqa: E402
from e2e_support import query_url as query  # noqa: E402
from test_embedded import PrivateRelay  # noqa: E402
from test_native_capture import LOGICAL_CONF, Consumer  # noqa: E402

import psycopg2  # noqa: E402
from psycopg2.extras import LogicalReplicationConnection  # noqa: E402

# What a refused write of pgrelay's own tables looks like in its log.
REFUSALS = ("does not have a replica identity", "could not mark a change of publications",
            "could not update the capture publications")

# Tables in pgrelay's schema that are logged (FOR ALL TABLES skips unlogged ones) and lack a
# replica identity UPDATE and DELETE could use.
NO_IDENTITY_SQL = """
SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = '_pgrelay' AND c.relkind = 'r' AND c.relpersistence = 'p'
  AND NOT (c.relreplident = 'f'
           OR (c.relreplident = 'd' AND EXISTS (SELECT 1 FROM pg_index i
                                               WHERE i.indrelid = c.oid AND i.indisprimary))
           OR (c.relreplident = 'i' AND EXISTS (SELECT 1 FROM pg_index i
                                               WHERE i.indrelid = c.oid AND i.indisreplident)))
ORDER BY 1
"""


def relay_log(relay):
    with open(relay.log_path, "rb") as f:
        return f.read().decode(errors="replace")


def expect_no_refusals(relay, what):
    lines = [l for l in relay_log(relay).splitlines() if any(r in l for r in REFUSALS)]
    expect_eq(lines[:5], [], "no refused write of pgrelay's own tables in its log (%s)" % what)


class Scenario:
    """One upstream database, its pgrelay (started and restarted by the caller) and checks."""

    def __init__(self, name, direct_url, start):
        self.name = name
        self.direct_url = direct_url  # straight to the upstream database, as its superuser
        self.start = start            # () -> a ready Relay on the same data dir each time
        self.relay = None
        self.next_id = 1
        self.slot = "all_" + name

    def url(self):
        return self.relay.url

    def restart(self):
        if self.relay:
            code, _ = self.relay.stop()
            expect_eq(code, 0, "pgrelay's exit code on SIGTERM")
        self.relay = self.start()

    def setup_tables(self):
        query(self.direct_url, "CREATE TABLE IF NOT EXISTS public.items (id int PRIMARY KEY, v text);"
                               "CREATE TABLE IF NOT EXISTS public.notes (id int, body text);"
                               "ALTER TABLE public.notes REPLICA IDENTITY FULL")

    def check_catalog(self, publication):
        expect_eq(query(self.direct_url, NO_IDENTITY_SQL), [],
                  "tables in _pgrelay without a usable replica identity")
        direct = query(self.direct_url, "SELECT count(*) FROM pg_publication_tables WHERE pubname = %s "
                                        "AND schemaname = '_pgrelay'", (publication,))[0][0]
        expect(direct > 0, "Postgres itself lists pgrelay's tables in %s (the case under test)" % publication,
               got=direct)
        listed = query(self.url(), "SELECT schemaname, tablename FROM pg_publication_tables "
                                   "WHERE pubname = %s ORDER BY 1, 2", (publication,))
        expect_eq(listed, [("public", "items"), ("public", "notes")],
                  "pg_publication_tables of %s through pgrelay" % publication)
        by_function = query(self.url(), "SELECT gpt.relid::regclass::text FROM "
                                        "pg_get_publication_tables(%s) gpt ORDER BY 1", (publication,))
        expect_eq(by_function, [("items",), ("notes",)],
                  "pg_get_publication_tables(%s) through pgrelay" % publication)
        hidden = query(self.url(), "SELECT DISTINCT pubname FROM pg_publication_tables "
                                   "WHERE pubname LIKE '\\_pgrelay%%'")
        expect_eq(hidden, [], "pgrelay's capture publications through pgrelay")

    def new_slot(self):
        """A fresh slot for each stream, so that nothing an earlier one left unconfirmed returns."""
        slot = "%s_%d" % (self.slot, self.next_id)
        conn = psycopg2.connect(self.url(), connection_factory=LogicalReplicationConnection)
        try:
            conn.cursor().create_replication_slot(slot, output_plugin="pgoutput")
        finally:
            conn.close()
        return slot

    def write_and_stream(self, publication, via_relay):
        """Inserts, updates and deletes in both tables; the stream must carry exactly them."""
        target = self.url() if via_relay else self.direct_url
        slot = self.new_slot()
        a, b = self.next_id, self.next_id + 1
        self.next_id += 2
        statements = [
            ("INSERT INTO items VALUES (%d, 'one'), (%d, 'two')" % (a, b)),
            ("UPDATE items SET v = 'uno' WHERE id = %d" % a),
            ("DELETE FROM items WHERE id = %d" % b),
            ("INSERT INTO notes VALUES (%d, 'n')" % a),
            ("UPDATE notes SET body = 'm' WHERE id = %d" % a),
            ("DELETE FROM notes WHERE id = %d" % a),
        ]
        consumer = Consumer(self.url(), slot, publication)
        try:
            for sql in statements:
                query(target, sql)
            consumer.pump(lambda: len(consumer.session.transactions) >= len(statements), 60,
                          "%d transactions on %s" % (len(statements), publication))
        finally:
            consumer.close()
        # The walsender ends once it sees the consumer gone.
        wait_until(lambda: query(self.url(), "SELECT pg_drop_replication_slot(%s)", (slot,)) or True,
                   10, "the slot %s free to drop" % slot)
        changes = consumer.session.changes()
        expect_eq(consumer.session.errors, [], "pgoutput ordering rules")
        tags = [[(c[0], c[1]) for c in t] for t in changes]
        expect_eq(tags, [[("I", "public.items"), ("I", "public.items")], [("U", "public.items")],
                         [("D", "public.items")], [("I", "public.notes")], [("U", "public.notes")],
                         [("D", "public.notes")]],
                  "the changes of the six transactions, in order")
        schemas = sorted({r["schema"] for r in consumer.session.relations.values()})
        expect_eq(schemas, ["public"], "schemas of the Relations sent")
        expect_eq(changes[1][0][4], [str(a), "uno"], "the updated row's new values")


class OtherDatabase(Scenario):
    """Another database of a scenario's upstream, reached only through the scenario's pgrelay."""

    def __init__(self, parent, db):
        super().__init__(parent.name + "_" + db, None, None)
        self.parent = parent
        self.db = db
        self.slot = "all_" + db

    def url(self):
        return self.parent.url().rsplit("/", 1)[0] + "/" + self.db

    def setup_tables(self):
        self.direct_url = self.url()
        super().setup_tables()


def run_scenario(env, scenario, before_install):
    """FOR ALL TABLES before the first start (where there is an upstream before pgrelay) and
    after it, then again between two restarts."""
    prefix = scenario.name + ": "

    def first():
        scenario.setup_tables()
        if before_install:
            query(scenario.direct_url, "CREATE PUBLICATION allpub FOR ALL TABLES")
        scenario.restart()
        query(scenario.url(), "CREATE PUBLICATION %s FOR ALL TABLES" %
              ("allpub_late" if before_install else "allpub"))
        # Writes to pgrelay's own tables (the publication marker, the catalog) now run under it.
        query(scenario.url(), "UPDATE items SET v = v WHERE false")
        for publication in ("allpub", "allpub_late") if before_install else ("allpub",):
            scenario.check_catalog(publication)
            scenario.write_and_stream(publication, via_relay=False)
            scenario.write_and_stream(publication, via_relay=True)
        expect_no_refusals(scenario.relay, "first start")

    def between_restarts():
        scenario.restart()
        query(scenario.direct_url, "CREATE PUBLICATION allpub2 FOR ALL TABLES")
        scenario.restart()
        scenario.check_catalog("allpub2")
        scenario.write_and_stream("allpub2", via_relay=False)
        # The first publication, created before, still streams.
        scenario.write_and_stream("allpub", via_relay=True)
        expect_no_refusals(scenario.relay, "after two restarts")

    def dump_and_restore():
        # pg_dump through pgrelay leaves pgrelay's schema, triggers, event triggers and capture
        # publications out; the dump restores through pgrelay into another database.
        dump = os.path.join(env.base, "dump-%s.fc" % scenario.name)
        r = subprocess.run([os.path.join(PG_BIN, "pg_dump"), "-Fc", "-f", dump, scenario.url()],
                           capture_output=True, text=True, timeout=120)
        expect_eq(r.returncode, 0, "pg_dump through pgrelay exit code (%s)" % r.stderr[-800:])
        listing = subprocess.run([os.path.join(PG_BIN, "pg_restore"), "-l", dump], capture_output=True,
                                 text=True, timeout=60).stdout
        entries = [l for l in listing.splitlines() if l and not l.startswith(";")]
        expect_eq([l for l in entries if "pgrelay" in l], [], "pgrelay's objects in the dump")
        expect(any(" TABLE DATA public items " in l for l in entries), "the dump holds the user's table",
               got=entries)
        expect(any("PUBLICATION - allpub " in l for l in entries), "the dump holds the user's publication",
               got=entries)
        target = "restored_" + scenario.name
        query(scenario.url(), "CREATE DATABASE %s" % target)
        restore_url = scenario.url().rsplit("/", 1)[0] + "/" + target
        r = subprocess.run([os.path.join(PG_BIN, "pg_restore"), "--exit-on-error", "-d", restore_url, dump],
                           capture_output=True, text=True, timeout=120)
        expect_eq(r.returncode, 0, "pg_restore through pgrelay exit code (%s)" % r.stderr[-800:])
        expect_eq(query(restore_url, "SELECT id, v FROM items ORDER BY id"),
                  query(scenario.url(), "SELECT id, v FROM items ORDER BY id"), "the restored table's rows")
        # pgrelay captures the new database too, from pg_restore's session on, in its own
        # _pgrelay; nothing of the dumped database's pgrelay came along (no pg_pgrelay_<oid>
        # schema, no capture publication, no trigger of pgrelay's on the restored table).
        expect_eq(query(restore_url, "SELECT nspname FROM pg_namespace WHERE nspname LIKE '%%pgrelay%%' "
                                     "AND nspname <> '_pgrelay'"),
                  [], "schemas named after pgrelay in the restored database, but its own")
        expect_eq(query(restore_url, "SELECT count(*) FROM pg_trigger t JOIN pg_proc p ON p.oid = t.tgfoid "
                                     "JOIN pg_namespace n ON n.oid = p.pronamespace "
                                     "WHERE t.tgrelid = 'public.items'::regclass AND NOT t.tgisinternal "
                                     "AND n.nspname <> '_pgrelay'"),
                  [(0,)], "triggers on the restored table but the restored database's own capture's")

    def other_database():
        # Every database is captured (--capture-database '*', the default), from its first
        # session through pgrelay: FOR ALL TABLES there holds pgrelay's tables of that database.
        other = OtherDatabase(scenario, "other_" + scenario.name)
        query(scenario.url(), "CREATE DATABASE %s" % other.db)
        other.setup_tables()
        query(other.url(), "CREATE PUBLICATION all_other FOR ALL TABLES")
        expect_eq(query(other.url(), NO_IDENTITY_SQL), [],
                  "tables in _pgrelay of the other database without a usable replica identity")
        other.write_and_stream("all_other", via_relay=True)
        expect_no_refusals(scenario.relay, "another database")

    env.check(prefix + "FOR ALL TABLES %s install" % ("before and after" if before_install else "after"),
              first)
    env.check(prefix + "FOR ALL TABLES created between two restarts", between_restarts)
    env.check(prefix + "pg_dump and pg_restore through pgrelay leave pgrelay out", dump_and_restore)
    env.check(prefix + "FOR ALL TABLES in another database of the upstream, captured as well",
              other_database)


def body(env):
    env.start_postgres(LOGICAL_CONF)
    base = env.upstream_url().rsplit("/", 1)[0]

    def upstream_scenario(name, db, capture):
        env.psql_admin("CREATE DATABASE %s" % db, db="postgres")
        data_dir = os.path.join(env.base, "data-" + name)
        port = free_port()
        upstream = base + "/" + db

        def start():
            return env.start_relay(data_dir=data_dir, port=port, upstream=upstream,
                                   extra_args=["--capture", capture])
        return Scenario(name, upstream, start)

    run_scenario(env, upstream_scenario("trigger", "e2e_trigger", "trigger"), before_install=True)
    run_scenario(env, upstream_scenario("native", "e2e_native", "native"), before_install=True)

    # The embedded default: pgrelay's own PostgreSQL, captured natively.
    cwd = tempfile.mkdtemp(prefix="all-tables-", dir=env.base)
    os.chmod(cwd, 0o755)
    port = free_port()

    def start_embedded():
        relay = PrivateRelay(env, cwd, port)
        relay.wait_ready(180)
        return relay
    embedded = Scenario("embedded", None, start_embedded)
    embedded.restart()
    # Its PostgreSQL listens only on a private socket, which root may enter.
    settings = {}
    with open(os.path.join(embedded.relay.cluster_dir(), "pgrelay.conf")) as f:
        for line in f:
            if "=" in line and not line.startswith("#"):
                key, value = line.split("=", 1)
                settings[key.strip()] = value.split("#")[0].strip().strip("'")
    embedded.direct_url = "host=%s port=%s user=postgres dbname=postgres" % (
        settings["unix_socket_directories"], settings["port"])
    run_scenario(env, embedded, before_install=False)


if __name__ == "__main__":
    main("all_tables", body)
