# Partitioned tables through `pgrelay serve`, both capture modes: refused with 0A000, never streamed with changes left out.
"""pgrelay cannot stream partitioned tables exactly yet, so it must never stream them inexactly.

On one wal_level=logical upstream, for trigger and for native capture (each in a database of its
own), with a partitioned table that has a default partition and a plain table beside it:
  - pgrelay serve starts (one partitioned table never stops the capture of the rest) and, in
    trigger mode, says which tables it leaves out;
  - START_REPLICATION of each publication that publishes the partitioned table or one of its
    partitions (FOR TABLE the root, via the root or not; FOR TABLE one partition; FOR ALL TABLES)
    is refused with 0A000, a message naming the publication and table, and a hint;
  - a publication of the plain table streams its rows, in the same pgrelay.
Without the refusal, trigger capture refused to start at all over rootpub (and, once started,
streams no write made through the partitioned table: those fire no trigger of its partitions),
and native capture streamed rootpub with every change of `m` left out: the checks below fail on
either.
"""

import os
import select
import time

import psycopg2
from psycopg2.extras import LogicalReplicationConnection

from e2e_support import expect, expect_eq, main, run_capture_modes
from pgoutput_decode import decode_message

LOGICAL_CONF = "wal_level = logical\nmax_replication_slots = 20\nmax_wal_senders = 20\n"
SCHEMA = """
CREATE TABLE m (id int, region text, v text, PRIMARY KEY (id, region)) PARTITION BY LIST (region);
CREATE TABLE m_eu PARTITION OF m FOR VALUES IN ('eu');
CREATE TABLE m_rest PARTITION OF m DEFAULT;
CREATE TABLE plain (id int PRIMARY KEY, v text);
CREATE PUBLICATION leafpub FOR TABLE m;
CREATE PUBLICATION rootpub FOR TABLE m WITH (publish_via_partition_root = true);
CREATE PUBLICATION partpub FOR TABLE m_eu;
CREATE PUBLICATION allpub FOR ALL TABLES;
CREATE PUBLICATION plainpub FOR TABLE plain;
"""
REFUSED = {  # publication: the table its refusal names
    "leafpub": "public.m_eu",
    "rootpub": "partitioned table public.m",
    "partpub": "public.m_eu, a partition of public.m",
    "allpub": "public.m_eu",
}


def start_replication(url, slot, publication, wait=2.0):
    """(the error START_REPLICATION got, or None; the pgoutput messages read meanwhile)."""
    conn = psycopg2.connect(url, connection_factory=LogicalReplicationConnection, connect_timeout=10)
    messages = []
    try:
        cur = conn.cursor()
        cur.create_replication_slot(slot, output_plugin="pgoutput")
        try:
            cur.start_replication(slot_name=slot, decode=False,
                                  options={"proto_version": "1", "publication_names": publication})
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                msg = cur.read_message()
                if msg is None:
                    select.select([cur], [], [], 0.2)
                else:
                    messages.append(decode_message(msg.payload))
        except psycopg2.Error as e:
            return e, messages
        return None, messages
    finally:
        conn.close()


class Mode:
    def __init__(self, env, name):
        self.env = env
        self.name = name
        self.db = "part_%s" % name
        self.relay = None

    def query(self, sql, args=None):
        return self.env.db_query(self.db, sql, args)

    def run(self):
        env, n = self.env, self.name

        def setup():
            env.psql_admin("CREATE DATABASE %s" % self.db, db="postgres")
            self.query(SCHEMA)
            upstream = env.upstream_url(self.db)
            self.relay = env.start_relay(data_dir=os.path.join(env.base, "relay-%s" % n), upstream=upstream,
                                         extra_args=["--no-tls", "--capture", n])
            if n == "trigger":
                with open(self.relay.log_path, "rb") as f:
                    log = f.read().decode(errors="replace")
                expect("cannot capture partitioned tables yet" in log and "public.m" in log,
                       "pgrelay says which tables it leaves out", got=log[-1500:])

        env.check("%s: pgrelay serve starts beside a partitioned table with a default partition" % n, setup)

        def refused():
            # Writes through the root and into a partition, each of which a stream would have to carry.
            self.query("INSERT INTO m VALUES (1, 'eu', 'via root'), (2, 'us', 'via root, default')")
            self.query("INSERT INTO m_eu VALUES (3, 'eu', 'direct')")
            for i, (pub, names) in enumerate(sorted(REFUSED.items())):
                error, messages = start_replication(self.relay.url, "refused_%s_%d" % (n, i), pub)
                expect(error is not None, "START_REPLICATION of %s refused (it streamed %d messages)"
                       % (pub, len(messages)))
                expect_eq(error.pgcode, "0A000", "the SQLSTATE for %s (%s)" % (pub, (error.pgerror or "").strip()))
                primary = error.diag.message_primary or ""
                expect('publication "%s"' % pub in primary and names in primary and "cannot stream exactly" in primary,
                       "the refusal of %s names it and %s" % (pub, names), got=primary)
                expect("ordinary tables" in (error.diag.message_hint or ""), "a hint for %s" % pub,
                       got=error.diag.message_hint)

        env.check("%s: START_REPLICATION of leafpub, rootpub, a partition's and FOR ALL TABLES publications: "
                  "0A000 naming the publication and table, with a hint" % n, refused)

        def plain_streams():
            conn = psycopg2.connect(self.relay.url, connection_factory=LogicalReplicationConnection)
            try:
                cur = conn.cursor()
                cur.create_replication_slot("plain_%s" % n, output_plugin="pgoutput")
                cur.start_replication(slot_name="plain_%s" % n, decode=False,
                                      options={"proto_version": "1", "publication_names": "plainpub"})
                self.query("INSERT INTO plain VALUES (1, 'one'), (2, 'two')")
                self.query("INSERT INTO m VALUES (10, 'eu', 'not in plainpub')")
                ids, deadline = [], time.monotonic() + 60
                while len(ids) < 2 and time.monotonic() < deadline:
                    msg = cur.read_message()
                    if msg is None:
                        select.select([cur], [], [], 0.2)
                        continue
                    m = decode_message(msg.payload)
                    if m["tag"] == "I":
                        ids.append(m["new"][0])
                expect_eq(ids, ["1", "2"], "the plain table's rows through plainpub")
            finally:
                conn.close()

        env.check("%s: a publication of the plain table streams in the same pgrelay" % n, plain_streams)


def body(env):
    run_capture_modes(env, Mode, LOGICAL_CONF)


if __name__ == "__main__":
    main("partitions", body)
