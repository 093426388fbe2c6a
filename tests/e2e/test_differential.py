# Differential fuzzing: random schemas, publications and workloads from a seed, pgrelay's streams against native pgoutput slots, in both capture modes.
"""Differential fuzzing against native pgoutput (first slice of the generator and runner).

A seed makes a scenario (Scenario): tables of random column types (every family the palette
holds, arrays, a domain, an enum, a composite, a range; NULLs, empty strings, extreme numbers,
TOASTed values), keys (primary key, a unique index as REPLICA IDENTITY, none with FULL),
generated and dropped columns, sometimes a partitioned table; publications (FOR ALL TABLES, FOR
TABLE with column lists and row filters, insert-only, TABLES IN SCHEMA, via the root); and one
writer's workload of single statements and transactions with savepoints rolled back, UPDATEs
that change keys, TRUNCATE, ADD/DROP/RENAME COLUMN and ALTER TYPE, transactional and
non-transactional logical messages, writes to unlogged and temporary tables (never
published), writer sessions with other TimeZone and DateStyle. Generator version 2 adds table
inheritance, REPLICA IDENTITY NOTHING, renames of tables and schemas, tables dropped and made
again, ALTER PUBLICATION, and prepared transactions (some committed late); version 3 adds faults:
pgrelay killed with -9 and started again, consumers that reconnect from their last Commit;
version 4 adds large transactions (12 MB; some roll a savepoint back inside, some roll back
whole) and publication sets read with `streaming` (protocol 2+), which native slots and pgrelay
then stream before the commit: streams are compared assembled (pgoutput_diff.assembled);
version 5 adds list and range partitions with a default partition, partitions partitioned again
(hash too), ATTACH and DETACH; two writers' transactions open at once (Scenario.interleaved); a
second database with its own tables, publications and streams, written between and beside the
first (in_second); and a restart of the upstream as a fault.

The runner plays it on a throwaway database of one wal_level=logical upstream, once per capture
mode, with a pgrelay slot and a native slot per publication set and pgoutput options (proto
1-3, as PostgreSQL 15 has them; binary or text): each stream through pgrelay equals the native slot's, message by message,
under the narrow rules of pgoutput_diff (LSNs, xids and commit times too in native capture);
a stream that Postgres ends with an error must end with the same one. A laggard, a consumer of
the first publication set whose slots are made with the others but read only once the workload
is done, catches up across every publication change and must be sent what a native slot sends. The text stream of FOR
ALL TABLES, replayed, equals the upstream's tables that have a key, partitions included
(REPLICA IDENTITY FULL and NOTHING are judged by their streams alone).

    test_differential.py PGRELAY [--seeds N | --seed S | --seconds T [--first S] | --script F] [--shrink]

By default it plays the regression scripts of differential/ and then runs seeds from 1 for
about 150 s in all (the test command's budget); bench/differential.sh runs it for hours. A
failing seed prints the one command that reproduces it; with --shrink, the workload is cut down
group by group to what still fails, and written to differential/ as a script (Scenario.script)
that names the first differing message, for the suite to play from then on. The replayed end
state is judged from the catalog, not from the generator's model, so a script or a shrunk
workload is judged as exactly as a whole seed.
"""

import argparse
import copy
import glob
import itertools
import os
import random
import re
import shutil
import sys
import time

import psycopg2

from e2e_support import expect, expect_eq, main, query_url, with_db
from pgoutput_decode import UNCHANGED_TOAST
from pgoutput_diff import (MARKS_SETUP, MARKS_TABLE, Stream, assembled, compared, first_difference, mark, native_view,
                           replication)

# A small logical_decoding_work_mem: native slots stream generator 4's large transactions to
# consumers that ask for streaming (and the upstream streams them to native capture).
LOGICAL_CONF = ("wal_level = logical\nmax_replication_slots = 60\nmax_wal_senders = 60\n"
                "max_prepared_transactions = 10\nlogical_decoding_work_mem = 1MB\n")
# Seeds that found something, run first in every bounded run (the suite's regressions). A seed
# makes the same scenario only under the generator version it was found with: each entry is
# (seed, version). Version 1 is the first slice's generator; version 2 (GENERATOR, what new seeds
# are made with) adds the extras of Scenario.extra.
#  10, 1: a column list naming every column of a table stayed "no list" in pgrelay after ADD
#         COLUMN (the new column was streamed; Postgres leaves it out); fixed by the fingerprint
#         marking the table's relnatts.
#   9, 1: two publications giving a table different column lists: the stream must end with the
#         same error as Postgres's at the table's first change.
#   2, 2: an UPDATE of an inheritance parent that changed its child's rows: trigger capture took
#         them from the parent's transition tables as the parent's rows; now row triggers.
#  13, 2: a column list naming every live column of a table with a dropped column, and a second
#         publication without a list: Postgres 15 counts dropped columns (relnatts), so the lists
#         differ and the stream ends with its error; pgrelay counted live columns and streamed.
#         Also: native capture's mirror publication now adds inheritance tables with ONLY (it
#         failed to start on any scenario with inheritance). It failed again in CI, a race: a
#         stream re-read the publications where a DROP TABLE of a published table marked their
#         change, before that commit was visible upstream, and kept the name published for the
#         table created under it; now the walsender waits for the marker's transaction (a
#         check of test_native_capture holds commits invisible to show it).
#   8, 3: a transaction writing an unpublished table, then a published one, both with an enum
#         column: the log stores the enum's Type once, before the first Relation, and a view that
#         dropped that Relation sent the second without its Type (trigger capture, p_ins).
#   2, 5: an upstream restart while pgrelay converted values for a stream in binary mode: the
#         consumer's session ended with 08006 (could not connect); now the conversion waits for
#         the upstream (up to 30 s). Seeds 9 and 13 of generator 5 found it too.
# 105, 5: a transaction whose third change met different column lists for its table, streamed
#         in binary mode: pgrelay sent the error before the two changes preceding it in the
#         same conversion batch, which Postgres sends first (pgrelay's text mode did).
# 138, 5: a TRUNCATE of an inheritance parent whose child has different column lists in two
#         publications: Postgres sends Begin and the parent's Relation, then the error;
#         pgrelay sent the error alone (seed 160 too).
REGRESSIONS = [(10, 1), (9, 1), (2, 2), (13, 2), (8, 3), (2, 5), (105, 5), (138, 5)]
# Version 3 adds faults: pgrelay killed with -9 and started again, consumers that reconnect.
# Version 4 adds large transactions (past pgrelay's spill threshold, some with a savepoint
# rolled back inside, some rolled back whole) and streams that ask for `streaming`. Version 5
# adds list/range partitions with ATTACH/DETACH, two writers at once, a second database and
# upstream restarts.
GENERATOR = 5
BULK_ROWS = 20000  # of 600 bytes each: 12 MB, past pgrelay's 8 MiB spill and a 2 MiB block

DONE = "differential-done"
ARGS = None


# ---- values ----

def lit(s):
    return "'" + s.replace("'", "''") + "'"


def toast(rng):
    # Random hex in 2 KB steps: too random to compress under the TOAST threshold.
    return "(SELECT string_agg(md5(g::text || %s), '') FROM generate_series(1, %d) g)" % (
        lit(str(rng.random())), rng.choice([80, 200]))


TEXTS = ["", "a", "ünïcödé ✓", "it's \\ \"quoted\"", "line\nbreak\ttab", " padded "]
PALETTE = {
    "int4": lambda r: r.choice(["0", "-2147483648", "2147483647", str(r.randint(-999, 999))]),
    "int8": lambda r: r.choice(["-9223372036854775808", "9223372036854775807", str(r.randint(-10**12, 10**12))]),
    "int2": lambda r: r.choice(["-32768", "32767", "0"]),
    "numeric": lambda r: r.choice(["'NaN'", "1e-30", "-0.000", "123456789012345678901234567890.123", "42"]),
    "float8": lambda r: r.choice(["'Infinity'", "'-Infinity'", "'NaN'", "1e308", "'-0'", "0.1", "2.5e-300"]),
    "float4": lambda r: r.choice(["3.4e38", "1.5", "'NaN'"]),
    "bool": lambda r: r.choice(["true", "false"]),
    "text": lambda r: toast(r) if r.random() < 0.15 else lit(r.choice(TEXTS)),
    "varchar(20)": lambda r: lit(r.choice(TEXTS[:4])),
    "bytea": lambda r: r.choice(["'\\x00ff10'", "''::bytea", "'\\x'"]),
    "timestamptz": lambda r: r.choice(["'2026-01-01 00:00:00+00'", "'infinity'", "'1999-12-31 23:59:59.999999-08'",
                                       "'2000-02-29 12:00+05:30'"]),
    "timestamp": lambda r: r.choice(["'2026-06-01 10:00'", "'-infinity'", "'0044-03-15 12:00 BC'"]),
    "date": lambda r: r.choice(["'2026-12-01'", "'infinity'", "'4713-01-01 BC'"]),
    "time": lambda r: r.choice(["'23:59:59.999999'", "'00:00'"]),
    "interval": lambda r: r.choice(["'1 year 2 mons -3 days 04:05:06.7'", "'-178000000 years'", "'0'"]),
    "jsonb": lambda r: r.choice(["'{\"a\": [1, null, \"x\"], \"b\": {}}'", "'[]'", "'\"s\"'", "'1.50'"]),
    "json": lambda r: r.choice(["'{\"b\":1,  \"a\":2}'", "'null'"]),
    "uuid": lambda r: r.choice(["'00000000-0000-0000-0000-000000000000'", "'a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11'"]),
    "inet": lambda r: r.choice(["'10.0.0.1/8'", "'::1'"]),
    "int4[]": lambda r: r.choice(["'{1,NULL,3}'", "'{}'", "'{{1,2},{3,4}}'"]),
    "text[]": lambda r: r.choice(["'{\"a b\",NULL,\"\"}'", "'{}'"]),
    "int4range": lambda r: r.choice(["'[1,5)'", "'empty'", "'(,3]'"]),
    "mood": lambda r: r.choice(["'happy'", "'sad'", "'ok'"]),
    "posint": lambda r: str(r.randint(0, 50)),
    "pair": lambda r: r.choice(["ROW(1, 'x')::pair", "ROW(NULL, '')::pair"]),
    "money": lambda r: r.choice(["12.34", "-0.01"]),
}
TYPES_SQL = """
CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int4 CHECK (VALUE >= 0);
CREATE TYPE pair AS (a int4, b text);
CREATE SCHEMA other;
CREATE UNLOGGED TABLE unlogged0 (id int PRIMARY KEY, v text);
"""
# Written by the workload, never published (FOR ALL TABLES leaves them out in Postgres).
UNPUBLISHED = [
    "INSERT INTO unlogged0 SELECT coalesce(max(id), 0) + 1, 'unlogged' FROM unlogged0",
    "CREATE TEMP TABLE IF NOT EXISTS temp0 (id int, v text); INSERT INTO temp0 VALUES (1, 'temp')",
]


def value(rng, typ):
    return "NULL" if rng.random() < 0.12 else PALETTE[typ](rng)


# ---- scenario ----

class Table:
    def __init__(self, name, key, columns, partitioned):
        self.name, self.key, self.columns, self.partitioned = name, key, columns, partitioned
        self.inheritance = False  # a parent or child of table inheritance (its DDL spreads)
        self.parent = None  # an inheritance child's parent (TRUNCATE of it truncates the child)
        self.ids = set()
        self.next_id = 1
        self.listed = set()  # columns in a publication's column list (not to be dropped)
        self.kind = None  # partitioned: by hash, list or range
        self.bounds = {}  # partition -> (its bound, the id from which no insert reaches it)
        self.detached = {}  # partitions detached now -> their bound (ATTACHed again with it)
        self.attached = 0  # tables made and ATTACHed as new partitions


class Scenario:
    """Everything one seed plays: setup SQL, publication sets with options, and the workload."""

    def __init__(self, seed, version=GENERATOR):
        rng = random.Random(seed)
        self.seed, self.version = seed, version
        self.extras = version >= 2
        self.setup = [TYPES_SQL]
        self.tables = []
        for i in range(rng.randint(2, 4)):
            self.tables.append(self.make_table(rng, "t%d" % i, i == 0 and rng.random() < 0.5))
        self.tables.append(self.make_table(rng, "other.s0", False))
        self.schema = "other"  # its name now (ALTER SCHEMA ... RENAME)
        self.renamed = 0
        self.pending = None  # (gid, table) of a prepared transaction not yet committed
        self.prepared = 0
        self.bulk_next = 1  # the next id of table bulk (version 4)
        self.schema_renames = {}  # old name -> new name, of ALTER SCHEMA .. RENAME
        if version >= 4:
            self.setup.append("CREATE TABLE bulk (id int PRIMARY KEY, v text)")
        if self.extras:
            self.make_extra_tables(rng)
        self.pubs = self.make_publications(rng)
        self.second = self.make_second_database(rng) if version >= 5 and rng.random() < 0.5 else None
        self.workload = self.make_workload(rng)
        if version >= 5:
            self.without_messages(random.Random("messages %d" % seed))

    def without_messages(self, rng):
        """Generator 5: some streams with messages 'false' (drawn from their own generator, so
        the rest of a seed's scenario is what it was before), read through a row each sync mark
        inserts (pgoutput_diff.MARKS_TABLE, published by p_marks, which their sets include)."""
        for setup, pubs in [(self.setup, self.pubs)] + ([(self.second["setup"], self.second["pubs"])] if self.second else []):
            setup += MARKS_SETUP
            for i, (names, opts) in enumerate(pubs):
                if rng.random() < 0.25:
                    pubs[i] = (names + ",p_marks", dict(opts, messages="false"))

    def make_second_database(self, rng):
        """Generator 5: a second database of the same upstream, with tables of its own, a FOR ALL
        TABLES publication and one for a table; its workload groups (in_second) run between and
        beside the first database's."""
        setup = [TYPES_SQL]
        tables = [self.make_table(rng, "b%d" % i, False, setup) for i in range(rng.randint(1, 2))]
        setup.append("CREATE PUBLICATION p_all FOR ALL TABLES")
        setup.append("CREATE PUBLICATION p_b FOR TABLE %s" % tables[0].name)
        pubs = [(s, {"proto_version": str(rng.randint(1, 3)), "binary": rng.choice(["false", "true"])})
                for s in ("p_all", "p_b")]
        return {"setup": setup, "tables": tables, "pubs": pubs}

    def make_extra_tables(self, rng):
        """Table inheritance (a parent published with its child) and a table with REPLICA IDENTITY
        NOTHING (only inserted into and truncated: it publishes no update or delete)."""
        types = rng.sample(sorted(PALETTE), rng.randint(1, 3))
        columns = [("c%d" % j, t) for j, t in enumerate(types)]
        self.setup.append("CREATE TABLE ih (id int PRIMARY KEY, %s)" % ", ".join("%s %s" % c for c in columns))
        self.setup.append("CREATE TABLE ih_c (extra text, PRIMARY KEY (id)) INHERITS (ih)")
        parent, child = Table("ih", "pk", list(columns), False), Table("ih_c", "pk", columns + [("extra", "text")], False)
        child.next_id = 10**6  # its rows are the parent's rows too: keep their ids apart
        parent.inheritance = child.inheritance = True
        child.parent = parent
        self.tables += [parent, child]
        self.setup.append("CREATE TABLE noid (id int, v text)")
        self.setup.append("ALTER TABLE noid REPLICA IDENTITY NOTHING")

    def make_table(self, rng, name, partitioned, setup=None):
        setup = self.setup if setup is None else setup
        key = "pk" if partitioned else rng.choice(["pk", "pk", "index", "full"])
        types = rng.sample(sorted(PALETTE), rng.randint(2, 5))
        columns = [("c%d" % j, t) for j, t in enumerate(types)]
        defs = ["id int NOT NULL"] + ["%s %s" % (c, t) for c, t in columns]
        if rng.random() < 0.3:
            defs.append("gone int")  # dropped below
        if rng.random() < 0.3:
            defs.append("g int GENERATED ALWAYS AS (id * 2) STORED")
        if key == "pk":
            defs.append("PRIMARY KEY (id)")
        sql = "CREATE TABLE %s (%s)" % (name, ", ".join(defs))
        table = Table(name, key, columns, partitioned)
        if partitioned:
            table.kind = rng.choice(["hash", "list", "range"]) if self.version >= 5 else "hash"
            sql += " PARTITION BY %s (id)" % table.kind.upper()
        setup.append(sql)
        if partitioned:
            self.make_partitions(rng, table, setup)
        if "gone int" in defs:
            setup.append("ALTER TABLE %s DROP COLUMN gone" % name)
        if key == "index":
            setup.append("CREATE UNIQUE INDEX %s_id ON %s (id)" % (name.replace(".", "_"), name))
            setup.append("ALTER TABLE %s REPLICA IDENTITY USING INDEX %s_id" % (name, name.replace(".", "_").split(".")[-1]))
        elif key == "full":
            setup.append("ALTER TABLE %s REPLICA IDENTITY FULL" % name)
        return table

    def make_partitions(self, rng, t, setup):
        """Hash partitions (generator 5: one of them partitioned again), or list or range ones
        with a default partition (generator 5), the second of them sometimes partitioned again
        by hash. t.bounds: the list and range partitions DETACH may take, each with its bound
        and the next id from which no insert reaches it any more."""
        name = t.name
        if t.kind == "hash":
            nested = self.version >= 5 and rng.random() < 0.5
            for p in range(3):
                setup.append("CREATE TABLE %s_p%d PARTITION OF %s FOR VALUES WITH (MODULUS 3, REMAINDER %d)%s"
                             % (name, p, name, p, " PARTITION BY HASH (id)" if nested and p == 2 else ""))
            if nested:
                for h in range(2):
                    setup.append("CREATE TABLE %s_p2_h%d PARTITION OF %s_p2 FOR VALUES WITH (MODULUS 2, REMAINDER %d)"
                                 % (name, h, name, h))
            return
        if t.kind == "range":
            bounds = [("FROM (MINVALUE) TO (20)", 20), ("FROM (20) TO (40)", 40)]
        else:
            bounds = [("IN (1, 3, 5, 7, 9)", 10), ("IN (2, 4, 6, 8, 10)", 11)]
        nested = rng.random() < 0.5
        for p, (bound, past) in enumerate(bounds):
            part = "%s_p%d" % (name, p)
            t.bounds[part] = (bound, past)
            setup.append("CREATE TABLE %s PARTITION OF %s FOR VALUES %s%s"
                         % (part, name, bound, " PARTITION BY HASH (id)" if nested and p == 1 else ""))
        if nested:
            for h in range(2):
                setup.append("CREATE TABLE %s_p1_h%d PARTITION OF %s_p1 FOR VALUES WITH (MODULUS 2, REMAINDER %d)"
                             % (name, h, name, h))
        setup.append("CREATE TABLE %s_pd PARTITION OF %s DEFAULT" % (name, name))

    def make_publications(self, rng):
        pubs = {"p_all": "FOR ALL TABLES"}
        some = rng.sample(self.tables, rng.randint(1, len(self.tables)))
        via_root = any(t.partitioned for t in some) and rng.random() < 0.5
        self.via_root = via_root
        items = []
        for t in some:
            # A parent stands for its child too, unless ONLY: with both listed, the child's own
            # column list and row filter would conflict with the parent's.
            item = ("ONLY " if t.name == "ih" and any(c.name == "ih_c" for c in some) else "") + t.name
            # A partitioned table takes a column list or row filter only via the root.
            narrow = not t.partitioned or via_root
            if narrow and t.key != "full" and rng.random() < 0.4:
                keep = ["id"] + [c for c, _ in rng.sample(t.columns, rng.randint(1, len(t.columns)))]
                t.listed.update(keep)
                item += " (%s)" % ", ".join(dict.fromkeys(keep))
            if narrow and rng.random() < 0.4:
                item += " WHERE (%s)" % rng.choice(["id > 3", "id <> 5", "id < 4 OR id > 8", "id IN (1, 2, 3, 9)"])
            items.append(item)
        pubs["p_some"] = "FOR TABLE %s%s" % (", ".join(items),
                                              " WITH (publish_via_partition_root = true)" if via_root else "")
        ins = rng.choice(self.tables)
        # The tables of p_ins now (ALTER PUBLICATION); FOR TABLE a parent takes its child too.
        self.ins = [ins] + [t for t in self.tables if ins.name == "ih" and t.name == "ih_c"]
        self.ins_publish = "insert, truncate"
        pubs["p_ins"] = "FOR TABLE %s WITH (publish = 'insert, truncate')" % ins.name
        pubs["p_schema"] = "FOR TABLES IN SCHEMA other"
        for name, what in pubs.items():
            self.setup.append("CREATE PUBLICATION %s %s" % (name, what))
        sets = ["p_all", "p_some", "p_ins", "p_schema", "p_some,p_ins"]
        out = [(s, {"proto_version": str(rng.randint(1, 3)), "binary": rng.choice(["false", "true"])})
               for s in sets]
        if self.version >= 4:
            for _, opts in out:
                if opts["proto_version"] != "1" and rng.random() < 0.6:
                    opts["streaming"] = "on"
        return out

    def make_workload(self, rng):
        out = []
        bulky = 0
        for _ in range(rng.randint(25, 60)):
            if self.version >= 3 and rng.random() < 0.03:
                faults = ["FAULT kill", "FAULT reconnect"] + (["FAULT upstream"] if self.version >= 5 else [])
                out.append([rng.choice(faults)])
                continue
            if self.version >= 5:
                pick = rng.random()
                parted = [t for t in self.free(self.tables) if t.kind in ("list", "range")]
                if pick < 0.07:
                    out.append(self.interleaved(rng))
                    continue
                if pick < 0.11 and parted:
                    out.append(self.partition_change(rng, parted[0]))
                    continue
                if pick < 0.19 and self.second:
                    out.append(self.in_second(rng))
                    continue
            if self.version >= 4 and bulky < 2 and rng.random() < 0.03:
                bulky += 1
                out.append(self.bulk(rng))
                continue
            if self.extras and rng.random() < 0.2:
                out.append(self.extra(rng))
                continue
            roll = rng.random()
            if roll < 0.12:
                stmts = [self.statement(rng) for _ in range(rng.randint(2, 4))]
                if rng.random() < 0.5:
                    stmts.insert(1, "SAVEPOINT s1")
                    stmts.insert(rng.randint(2, len(stmts)), "ROLLBACK TO SAVEPOINT s1")
                out.append(["BEGIN"] + stmts + ["COMMIT"])
            elif roll < 0.16:
                out.append([rng.choice(["SET TimeZone = 'Asia/Kolkata'", "SET DateStyle = 'SQL, DMY'",
                                        "SET TimeZone = 'America/St_Johns'", "RESET ALL"])])
            elif roll < 0.18:
                out.append(["MARK %s" % lit("message %d" % len(out))])
            elif roll < 0.20:
                out.append(["MARKNT %s" % lit("non-transactional %d" % len(out))])
            elif roll < 0.22:
                out.append([rng.choice(UNPUBLISHED)])
            elif roll < 0.25:
                out.append([self.ddl(rng)])
            else:
                out.append([self.statement(rng)])
        if self.pending:
            out.append(self.finish_prepared(rng))
        return out

    def free(self, tables):
        """The tables that DDL or TRUNCATE may lock: not the one a pending prepared transaction
        wrote, nor its inheritance parent (TRUNCATE of the parent truncates it): that would wait
        for the prepared transaction forever."""
        held = self.pending[1] if self.pending else None
        return [t for t in tables if held is None or not (held is t or held.parent is t)]

    def interleaved(self, rng):
        """Generator 5: two writers' transactions at once. The second writer's begins first, on
        one table, and commits after the first writer's transaction on other tables commits; its
        last write comes after that commit too (trigger capture orders the transactions one poll
        finds by their last write, README)."""
        x = rng.choice(self.tables)
        others = [t for t in self.tables if t is not x and not (t.inheritance and x.inheritance)]
        group = ["@2 BEGIN", "@2 " + self.statement(rng, x), "BEGIN"]
        group += [self.statement(rng, rng.choice(others)) for _ in range(rng.randint(1, 3))]
        return group + ["COMMIT", "@2 " + self.insert(rng, x), "@2 COMMIT"]

    def in_second(self, rng):
        """Generator 5: a group of the second database: a statement, a transaction, a column
        added, or a transaction open in each database at once, committed one after the other."""
        tables = self.second["tables"]
        roll = rng.random()
        if roll < 0.1:
            return ["@b " + self.ddl(rng, tables)]
        if roll < 0.4:
            return ["@b BEGIN"] + ["@b " + self.statement(rng, rng.choice(tables)) for _ in range(rng.randint(1, 3))] + ["@b COMMIT"]
        if roll < 0.6:
            here, there = rng.sample(["", "@b "], 2)
            def stmt(prefix):
                return prefix + self.statement(rng, rng.choice(tables if prefix else self.tables))
            return [here + "BEGIN", stmt(here), there + "BEGIN", stmt(there), here + "COMMIT", stmt(there),
                    there + "COMMIT"]
        return ["@b " + self.statement(rng, rng.choice(tables))]

    def partition_change(self, rng, t):
        """Generator 5, a list or range partitioned table: DETACH of a partition that no insert
        reaches any more (then written while it stands alone), ATTACH of it again with its bound,
        or a table made like the root, filled, and ATTACHed as a new partition above the others."""
        if t.detached and rng.random() < 0.6:
            part = sorted(t.detached)[0]
            return ["ALTER TABLE %s ATTACH PARTITION %s FOR VALUES %s" % (t.name, part, t.detached.pop(part))]
        ready = [p for p, (_, past) in sorted(t.bounds.items()) if past <= t.next_id and p not in t.detached]
        if ready and rng.random() < 0.6:
            part = rng.choice(ready)
            t.detached[part] = t.bounds[part][0]
            c, typ = rng.choice(t.columns)
            return ["ALTER TABLE %s DETACH PARTITION %s" % (t.name, part),
                    "UPDATE %s SET %s = %s WHERE id %% 2 = %d" % (part, c, value(rng, typ), rng.randint(0, 1)),
                    "DELETE FROM %s WHERE id %% 3 = 0" % part]
        t.attached += 1
        part = "%s_a%d" % (t.name, t.attached)
        t.next_id = first = max(t.next_id, 40)
        width = 10 if t.kind == "range" else 5
        bound = ("FROM (%d) TO (%d)" % (first, first + width) if t.kind == "range"
                 else "IN (%s)" % ", ".join(str(first + i) for i in range(width)))
        group = ["CREATE TABLE %s (LIKE %s INCLUDING ALL)" % (part, t.name), self.insert(rng, t, into=part),
                 "ALTER TABLE %s ATTACH PARTITION %s FOR VALUES %s" % (t.name, part, bound)]
        t.next_id = first + width
        return group

    def finish_prepared(self, rng):
        gid, _ = self.pending
        self.pending = None
        return ["%s PREPARED %s" % (rng.choice(["COMMIT", "COMMIT", "ROLLBACK"]), lit(gid))]

    def extra(self, rng):
        """One group of what version 2 adds: renames of tables and schemas, a table dropped and
        made again under its name, ALTER PUBLICATION, prepared transactions (some committed
        late), and writes to the table without a replica identity."""
        roll = rng.random()
        plain = self.free([t for t in self.tables if not t.partitioned and not t.inheritance])
        if self.pending and (roll < 0.5 or rng.random() < 0.3):
            return self.finish_prepared(rng)
        if roll < 0.12:
            # Not a root published via itself: pgoutput keeps sending its changes under the
            # Relation sent before the rename (its cache is the partitions'), where pgrelay sends
            # the renamed one (README).
            t = rng.choice(self.free([t for t in self.tables if not (t.partitioned and self.via_root)]))
            self.renamed += 1
            bare = "%s_r%d" % (t.name.split(".")[-1].split("_r")[0], self.renamed)
            sql = "ALTER TABLE %s RENAME TO %s" % (t.name, bare)
            t.name = (t.name.split(".")[0] + "." if "." in t.name else "") + bare
            return [sql]
        if roll < 0.17:
            self.renamed += 1
            new = "other_r%d" % self.renamed
            sql = "ALTER SCHEMA %s RENAME TO %s" % (self.schema, new)
            self.schema_renames[self.schema] = new
            for t in self.tables:
                if t.name.startswith(self.schema + "."):
                    t.name = new + t.name[len(self.schema):]
            self.schema = new
            return [sql]
        if roll < 0.27:
            t = rng.choice(plain)
            types = rng.sample(sorted(PALETTE), rng.randint(1, 4))
            t.columns = [("c%d" % j, typ) for j, typ in enumerate(types)]
            t.key, t.ids, t.listed = "pk", set(), set()
            if t in self.ins:
                self.ins.remove(t)  # a dropped table leaves its publications
            return ["DROP TABLE %s" % t.name,
                    "CREATE TABLE %s (id int PRIMARY KEY, %s)" % (t.name, ", ".join("%s %s" % c for c in t.columns)),
                    self.statement(rng, t)]
        if roll < 0.45:
            out = [t for t in self.tables if t not in self.ins]
            pick = rng.random()
            # ONLY: an inheritance parent alone, without its child.
            if pick < 0.4 and out:
                t = rng.choice(out)
                self.ins.append(t)
                return ["ALTER PUBLICATION p_ins ADD TABLE ONLY %s" % t.name]
            if pick < 0.7 and len(self.ins) > 1:
                t = rng.choice(self.ins)
                self.ins.remove(t)
                return ["ALTER PUBLICATION p_ins DROP TABLE ONLY %s" % t.name]
            self.ins_publish = rng.choice([p for p in ("insert, truncate", "insert, update, delete, truncate",
                                                       "update, delete", "insert") if p != self.ins_publish])
            return ["ALTER PUBLICATION p_ins SET (publish = %s)" % lit(self.ins_publish)]
        if roll < 0.75 and not self.pending:
            self.prepared += 1
            gid = "@GID_%d" % self.prepared
            t = rng.choice(self.tables)
            stmts = [self.insert(rng, t) for _ in range(rng.randint(1, 3))]
            group = ["BEGIN"] + stmts + ["PREPARE TRANSACTION %s" % lit(gid)]
            if rng.random() < 0.5:
                self.pending = (gid, t)  # committed by a later group: a transaction that commits late
                return group
            return group + ["%s PREPARED %s" % (rng.choice(["COMMIT", "ROLLBACK"]), lit(gid))]
        if rng.random() < 0.85:
            return ["INSERT INTO noid SELECT (SELECT coalesce(max(id), 0) FROM noid) + g, %s FROM generate_series(1, %d) g"
                    % (value(rng, "text"), rng.randint(1, 3))]
        return ["TRUNCATE noid"]

    def bulk_insert(self, rows):
        first = self.bulk_next
        self.bulk_next += rows
        return ("INSERT INTO bulk SELECT g, repeat(chr(97 + g %% 26), 600) FROM generate_series(%d, %d) g"
                % (first, first + rows - 1))

    def bulk(self, rng):
        """A transaction large enough to be streamed: some roll a savepoint back after writing
        past it, some roll back whole; committed ones may write other tables as well."""
        group = ["BEGIN", self.bulk_insert(BULK_ROWS)]
        roll = rng.random()
        if roll < 0.2:
            return group + [self.bulk_insert(BULK_ROWS // 4), "ROLLBACK"]
        if roll < 0.6:
            group += ["SAVEPOINT s1", self.bulk_insert(BULK_ROWS // 2),
                      rng.choice(["ROLLBACK TO SAVEPOINT s1", "RELEASE SAVEPOINT s1"])]
        if rng.random() < 0.5:
            group.append(self.insert(rng, rng.choice(self.tables)))
        return group + [self.bulk_insert(rng.randint(1, 100)), "COMMIT"]

    def insert(self, rng, t, into=None):
        rows = []
        for _ in range(rng.randint(1, 3)):
            i = t.next_id
            t.next_id += 1
            t.ids.add(i)
            rows.append("(%d, %s)" % (i, ", ".join(value(rng, typ) for _, typ in t.columns)))
        return "INSERT INTO %s (id, %s) VALUES %s" % (into or t.name, ", ".join(c for c, _ in t.columns), ", ".join(rows))

    def statement(self, rng, t=None):
        t = t or rng.choice(self.tables)
        roll = rng.random()
        if roll < 0.45 or not t.ids:
            return self.insert(rng, t)
        if roll < 0.75:
            c, typ = rng.choice(t.columns)
            if t.key != "full" and rng.random() < 0.15:
                old = rng.choice(sorted(t.ids))
                new = t.next_id
                t.next_id += 1
                t.ids.discard(old)
                t.ids.add(new)
                return "UPDATE %s SET id = %d WHERE id = %d" % (t.name, new, old)
            where = rng.choice(["id = %d" % rng.choice(sorted(t.ids)), "id %% 2 = %d" % rng.randint(0, 1), "true"])
            return "UPDATE %s SET %s = %s WHERE %s" % (t.name, c, value(rng, typ), where)
        if roll < 0.93:
            i = rng.choice(sorted(t.ids))
            t.ids.discard(i)
            return "DELETE FROM %s WHERE id = %d" % (t.name, i)
        if not self.free([t]):
            return self.insert(rng, t)
        t.ids.clear()
        return "TRUNCATE %s%s" % (t.name, rng.choice(["", " RESTART IDENTITY", " CASCADE"]))

    def ddl(self, rng, tables=None):
        tables = tables or self.tables
        t = rng.choice(self.free([t for t in tables if not t.partitioned and not t.inheritance]) or tables)
        roll = rng.random()
        if roll < 0.5 or len(t.columns) < 2:
            typ = rng.choice(sorted(PALETTE))
            name = "a%d" % rng.randint(0, 10**6)
            t.columns.append((name, typ))
            return "ALTER TABLE %s ADD COLUMN %s %s" % (t.name, name, typ)
        c, typ = rng.choice(t.columns)
        # Postgres refuses ALTER TYPE of a column in a publication's column list (its error says
        # WHERE clause); generators before 4 could make that statement (none of their seeds did).
        if roll < 0.6 and typ != "text" and (self.version < 4 or c not in t.listed):
            # Into text, keeping each value's output text (what its stream carried before).
            t.columns = [(n, "text" if n == c else ty) for n, ty in t.columns]
            return ("ALTER TABLE %s ALTER COLUMN %s TYPE text USING CASE WHEN num_nonnulls(%s) = 1 "
                    "THEN format('%%s', %s) END" % (t.name, c, c, c))
        if t.key == "full" or roll < 0.8 or c in t.listed:
            new = c + "_r"  # end_state follows a RENAME COLUMN by this suffix
            t.columns = [(new if n == c else n, ty) for n, ty in t.columns]
            return "ALTER TABLE %s RENAME COLUMN %s TO %s" % (t.name, c, new)
        t.columns = [(n, ty) for n, ty in t.columns if n != c]
        return "ALTER TABLE %s DROP COLUMN %s" % (t.name, c)

    def script(self, found=None):
        """The scenario as an SQL script that from_script plays again: its streams (publication
    sets and options) and setup, each database's, then the workload, group by group. MARK and
    MARKNT stand for a transactional and a non-transactional logical message, FAULT for a fault,
    @GID for the database's name in prepared transactions' ids (which are global); a statement
    prefixed @2 runs on the second writer's session, one prefixed @b in the second database."""
        lines = ["-- seed %d, generator %d" % (self.seed, self.version)]
        if found:
            lines.append("-- found: " + " ".join(found.split()))
        dbs = [("", self.setup, self.pubs)] + ([("@b", self.second["setup"], self.second["pubs"])] if self.second else [])
        for tag, _, pubs in dbs:
            lines += ["-- stream%s: %s %s" % (tag, s, " ".join("%s=%s" % kv for kv in sorted(o.items()))) for s, o in pubs]
        for tag, setup, _ in dbs:
            lines.append("-- setup" + tag)
            lines += [s + ";" for sql in setup for s in statements(sql)]
        for group in self.workload:
            lines.append("-- group")
            lines += [s + ";" for sql in group for s in statements(sql)]
        return "\n".join(lines) + "\n"

    @classmethod
    def from_script(cls, text):
        """The scenario a script (script()) describes: what a regression file holds."""
        sc = cls.__new__(cls)
        sc.setup, sc.pubs, sc.workload, sc.second, sc.tables = [], [], [], None, []
        section = None
        for kind, item in split_sql(text):
            if kind == "sql":
                if section is None:
                    raise ValueError("a statement before the first -- setup or -- group line: %r" % item)
                section.append(item)
                continue
            head, _, rest = item[3:].partition(" ")
            if head == "seed":
                seed, version = re.fullmatch(r"(\d+), generator (\d+)", rest).groups()
                sc.seed, sc.version = int(seed), int(version)
            elif head in ("stream:", "stream@b:"):
                pubs, *opts = rest.split()
                if head == "stream@b:":
                    sc.second = sc.second or {"setup": [], "pubs": [], "tables": []}
                (sc.second["pubs"] if head == "stream@b:" else sc.pubs).append((pubs, dict(o.split("=", 1) for o in opts)))
            elif head in ("setup", "setup@b"):
                section = sc.setup if head == "setup" else sc.second["setup"]
            elif head == "group":
                sc.workload.append([])
                section = sc.workload[-1]
        sc.extras = sc.version >= 2
        sc.schema_renames = {}
        for group in sc.workload:
            for sql in group:
                m = re.fullmatch(r"ALTER SCHEMA (\w+) RENAME TO (\w+)", sql)
                if m:
                    sc.schema_renames[m.group(1)] = m.group(2)
        return sc


def statements(sql):
    """The statements of one workload or setup string, each with the string's session prefix."""
    prefix = sql[:3] if sql[:3] in ("@2 ", "@b ") else ""
    return [s if s.startswith(prefix) else prefix + s for kind, s in split_sql(sql + ";") if kind == "sql" and s]


def split_sql(text):
    """A script's statements, split at semicolons outside single-quoted literals, and its
    directives: lines starting '-- ' between statements. Yields ("sql", text) and ("--", line)."""
    buf, quoted = [], False
    for line in text.splitlines(keepends=True):
        if not quoted and not "".join(buf).strip() and line.startswith("-- "):
            yield "--", line.strip()
            continue
        for ch in line:
            if ch == "'":
                quoted = not quoted
            if ch == ";" and not quoted:
                yield "sql", "".join(buf).strip()
                buf = []
            else:
                buf.append(ch)
    if "".join(buf).strip():
        raise ValueError("the script ends inside a statement: %r" % "".join(buf)[:80])


# ---- runner ----

class Played:
    """One database a play writes: two writers' sessions on it, and its publication sets, each
    read from a pgrelay slot and from a native slot."""

    def __init__(self, env, db, setup):
        self.env, self.db = env, db
        # Sync marks insert a row too, for streams without messages (generator 5 on).
        self.marks = any(sql.startswith("CREATE TABLE %s " % MARKS_TABLE) for sql in setup)
        env.psql_admin("DROP DATABASE IF EXISTS %s WITH (FORCE)" % db, db="postgres")
        env.psql_admin("CREATE DATABASE %s" % db, db="postgres")
        self.url = env.upstream_url(db)
        self.pairs = []  # (publication set, options, pgrelay's stream, native's stream)
        # A consumer that stays away: its slots are made with the others, read only at the end.
        self.laggard = None  # (publication set, options, slot)
        self.late = []  # its streams, once read
        self.connect()
        for sql in setup:
            self.cur.execute(sql)

    def connect(self):
        self.conns = [psycopg2.connect(self.url) for _ in range(2)]
        for c in self.conns:
            c.autocommit = True
        self.cur, self.cur2 = (c.cursor() for c in self.conns)

    def disconnect(self):
        for c in self.conns:
            c.close()

    def open_streams(self, relay_url, pubs):
        ours = with_db(relay_url, self.db)
        for i, (names, opts) in enumerate(pubs):
            slot = "d_%s_%d" % (self.db, i)
            self.create_slots(ours, slot)
            self.pairs.append((names, opts, Stream(ours, slot, names, opts), Stream(self.url, slot, names, opts)))
        # The laggard reads the first publication set in text (binary conversion goes through
        # the upstream's types as they are now: README), from before the workload, only after
        # it: every publication change is behind it, and the changes before each are judged by
        # the publications as they stood then, as Postgres's historic catalog judges them.
        names, opts = pubs[0]
        self.laggard = (names, dict(opts, binary="false"), "d_%s_lag" % self.db)
        self.create_slots(ours, self.laggard[2])

    def create_slots(self, ours, slot):
        for url in (ours, self.url):
            c = replication(url)
            try:
                c.cursor().create_replication_slot(slot, output_plugin="pgoutput")
            finally:
                c.close()

    def read_laggard(self, relay_url):
        """The laggard's pair, connected now: (publication set, options, pgrelay's, native's)."""
        names, opts, slot = self.laggard
        pair = (names, opts, Stream(with_db(relay_url, self.db), slot, names, opts), Stream(self.url, slot, names, opts))
        self.late = [pair]
        return pair

    def streams(self):
        return [s for _, _, ours, theirs in self.pairs + self.late for s in (ours, theirs)]

    def sync_mark(self, mode, prefix):
        mark(mode, self.cur, prefix, marks=self.marks)

    def read_through(self, mode, prefix):
        self.sync_mark(mode, prefix)
        for s in self.streams():
            read(s, prefix)

    def drop(self):
        """Closes the streams; rolls back a prepared transaction a failure left (it would keep the
        database from being dropped) and drops the native slots (they would outlive it)."""
        for s in self.streams():
            s.close()
        self.disconnect()
        self.connect()  # a fault may have ended the writers' sessions
        self.cur.execute("SELECT gid FROM pg_prepared_xacts WHERE database = current_database()")
        for (gid,) in self.cur.fetchall():
            self.cur.execute("ROLLBACK PREPARED %s", (gid,))
        self.cur.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
                         "WHERE database = current_database() AND NOT active")
        self.disconnect()
        self.env.psql_admin("DROP DATABASE IF EXISTS %s WITH (FORCE)" % self.db, db="postgres")


def run(env, scenario, mode):
    """Plays `scenario` in capture `mode`; returns None or the first difference found."""
    db = "diff_%s_%d_g%d" % (mode, scenario.seed, scenario.version)
    dbs = {}
    relay = None
    try:
        dbs[""] = Played(env, db, scenario.setup)
        if scenario.second:
            dbs["@b"] = Played(env, db + "_b", scenario.second["setup"])
        relay_dir = os.path.join(env.base, "relay-%s" % db)
        shutil.rmtree(relay_dir, ignore_errors=True)  # a shrinker's earlier play of the seed
        relay_args = ["--no-tls", "--capture", mode, "--max-replication-slots", "30"]
        relay = env.start_relay(data_dir=relay_dir, upstream=dbs[""].url, extra_args=relay_args)
        for tag, p in dbs.items():
            p.open_streams(relay.url, scenario.second["pubs"] if tag else scenario.pubs)
        for n, group in enumerate(scenario.workload):
            if group[0].startswith("FAULT "):
                relay = fault(env, group[0], dbs, relay, relay_dir, relay_args)
                continue
            if group[0].split()[1:2] == ["PREPARED"]:
                # A prepared transaction committed late: its writes came before the transactions
                # committed since, which trigger capture would put after it if one poll found
                # them all (README); a consumer that has read those meanwhile sees commit order.
                dbs[""].read_through(mode, "before-%d" % n)
            for sql in group:
                p, cur, sql = session(dbs, sql)
                sql = sql.replace("@GID", db)
                if sql.startswith("MARK "):
                    mark(mode, cur, "fuzz", sql[5:].strip("'"))
                elif sql.startswith("MARKNT "):
                    mark(mode, cur, "fuzz", sql[7:].strip("'"), transactional=False)
                else:
                    cur.execute(sql)
            if any(session(dbs, sql)[2].split()[0] in ("ALTER", "DROP") for sql in group):
                # Exact while consumers keep up with schema changes (README): read through it.
                for p in dbs.values():
                    p.read_through(mode, "step-%d" % n)
        for p in dbs.values():
            p.sync_mark(mode, DONE)
        for tag, p in dbs.items():
            for pair in p.pairs + [None]:
                late = pair is None
                problem = compare(mode, scenario, tag, p, p.read_laggard(relay.url) if late else pair, late)
                if problem:
                    return problem
        return None
    finally:
        if relay:
            relay.stop()
            env.relays.remove(relay)
        for p in dbs.values():
            p.drop()


def compare(mode, scenario, tag, p, pair, late):
    """None, or how the pair's streams (read through DONE) differ."""
    pubs, opts, ours_stream, theirs_stream = pair
    ours = read(ours_stream, DONE)
    theirs = native_view(read(theirs_stream, DONE))
    # Generator 4 on: schema names compared through the renames (pgoutput_diff).
    renames = scenario.schema_renames if scenario.version >= 4 else None
    (a, whole_a), (b, whole_b) = compared(mode, ours, renames), compared(mode, theirs, renames)
    what = "%s %s%s%s (%s)" % (mode, tag and tag + " ", "the laggard on " if late else "", pubs,
                               ", ".join("%s=%s" % kv for kv in sorted(opts.items())))
    if a != b:
        return "%s: changes differ: %s" % (what, first_difference(a, b))
    if whole_a != whole_b:
        return "%s: transactions differ: %s" % (what, first_difference(whole_a, whole_b))
    everything = "p_all" in pubs.split(",")
    if everything and not tag and not any(
            m["tag"] == "T" or m["tag"] in ("I", "U", "D") and m["relid"]["name"] != MARKS_TABLE for m in a):
        return "%s: the FOR ALL TABLES stream carried no change at all" % what
    if everything and opts["binary"] == "false":
        problem = end_state(p.url, assembled(ours))
        if problem:
            return "%s: end state: %s" % (what, problem)
    return None


def session(dbs, sql):
    """(database, cursor, statement) of a workload statement: @b runs it in the second
    database, @2 on the second writer's session."""
    if sql.startswith("@b "):
        return dbs["@b"], dbs["@b"].cur, sql[3:]
    if sql.startswith("@2 "):
        return dbs[""], dbs[""].cur2, sql[3:]
    return dbs[""], dbs[""].cur, sql


def fault(env, what, dbs, relay, relay_dir, relay_args):
    """pgrelay's streams reconnect from their last Commit; after a kill -9, to a pgrelay started
    again on the same data directory. An upstream restart (fast shutdown) ends every writer's
    session and native slot's stream, which connect again; pgrelay's capture must reconnect on
    its own, and its consumers' sessions go on."""
    if what == "FAULT upstream":
        # The native slots' consumers go first: a walsender whose consumer reads nothing would
        # hold the shutdown until it has sent everything.
        for p in dbs.values():
            for _, _, _, theirs in p.pairs:
                theirs.close()
            p.disconnect()
        env.restart_postgres()
        for p in dbs.values():
            p.connect()
            for _, _, _, theirs in p.pairs:
                theirs.resume(p.url)
        return relay
    if what == "FAULT kill":
        relay.proc.kill()
        relay.proc.wait()
        env.relays.remove(relay)
        relay = env.start_relay(data_dir=relay_dir, upstream=dbs[""].url, extra_args=relay_args)
    for p in dbs.values():
        url = with_db(relay.url, p.db)
        for _, _, ours, _ in p.pairs:
            ours.resume(url)
    return relay


def read(stream, prefix):
    """The stream's messages through `prefix`, or up to the error that ended it, which then
    ends the list as {"tag": "error", ...}: Postgres raises some publication errors while it
    decodes (different column lists for one table, say), and pgrelay must raise the same."""
    if stream.messages and stream.messages[-1]["tag"] == "error":
        return stream.messages
    try:
        return stream.read_until(prefix)
    except psycopg2.Error as e:
        stream.messages.append({"tag": "error", "sqlstate": e.pgcode,
                                "message": e.diag.message_primary if e.diag else str(e)})
        return stream.messages


def replayed(row, column):
    """A replayed row's value of a column of the table's, by the name it had in the row's last
    Relation: a RENAME COLUMN (to c_r) after the table's last change sent no Relation."""
    name = column
    while name not in row and name.endswith("_r"):
        name = name[:-2]
    return row.get(name)


def end_state(upstream, messages):
    """The FOR ALL TABLES stream replayed, against the tables (text values, by column name),
    without the generator's model: a script or a shrunk workload is judged as a full one.

    Rows are kept by relation OID, so a table renamed, or dropped and made again, is followed. A
    Relation that names a column c_r where the one before named c is the generator's RENAME
    COLUMN: rows read before keep their values under the new name (a rename after the table's
    last change is followed at the end, by name). Judged: every permanent table
    with a key as its replica identity (partitions too, under their own OIDs: p_all is not via
    the root), rows keyed by its replica identity's columns; an inheritance parent by its own
    rows (ONLY). REPLICA IDENTITY FULL and NOTHING have no key to replay by: their streams alone
    judge them."""
    relations, state = {}, {}
    for m in messages:
        if m["tag"] == "R":
            before = relations.get(m["oid"])
            if before:
                old = {c["name"] for c in before["columns"]}
                new = {c["name"] for c in m["columns"]}
                for name in new:
                    if name.endswith("_r") and name[:-2] in old and name[:-2] not in new:
                        for row in state.get(m["oid"], {}).values():
                            row[name] = row.pop(name[:-2], None)
            relations[m["oid"]] = m
        elif m["tag"] in ("I", "U", "D"):
            rel = relations[m["relid"]]
            table = state.setdefault(m["relid"], {})
            cols = [c["name"] for c in rel["columns"]]
            keys = [c["name"] for c in rel["columns"] if c["flags"] & 1]
            prev = {}
            if m["tag"] in ("U", "D") and m["old"] is not None:
                old = dict(zip(cols, m["old"]))
                prev = table.pop(tuple(old[k] for k in keys), {})
            if m["tag"] in ("I", "U"):
                new = dict(zip(cols, m["new"]))
                key = tuple(new[k] for k in keys)
                prev = prev or table.get(key, {})
                # An unchanged TOASTed value ('u') keeps the row's value.
                table[key] = {c: (prev.get(c) if v is UNCHANGED_TOAST else v) for c, v in new.items()}
        elif m["tag"] == "T":
            for r in m["relids"]:
                state[r] = {}
    judged = query_url(upstream, """
        SELECT c.oid, format('%I.%I', n.nspname, c.relname),
               (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_attribute a
                 WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped AND a.attgenerated = ''),
               (SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_index i
                  JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey::int2[])
                 WHERE i.indrelid = c.oid AND CASE c.relreplident WHEN 'i' THEN i.indisreplident ELSE i.indisprimary END)
          FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
         WHERE c.relkind = 'r' AND c.relpersistence = 'p' AND c.relreplident IN ('d', 'i')
           AND n.nspname NOT IN ('pg_catalog', 'information_schema', '_pgrelay') AND n.nspname NOT LIKE 'pg_toast%'
           AND EXISTS (SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND (i.indisprimary OR i.indisreplident))""")
    if not judged:
        return "no table to judge (the catalog query found none)"
    for oid, name, cols, keys in judged:
        # format('%s') prints a value with its type's output function, as pgoutput does (a
        # cast to text may not: true::text is 'true', its output 't'); num_nonnulls asks whether
        # the value is NULL, where IS NOT NULL of a composite asks it of every field.
        out = ", ".join("CASE WHEN num_nonnulls(%s) = 1 THEN format('%%s', %s) END" % (c, c) for c in cols)
        rows = [dict(zip(cols, r)) for r in query_url(upstream, "SELECT %s FROM ONLY %s" % (out, name))]
        want = {tuple(r[k] for k in keys): r for r in rows}
        got = {k: {c: replayed(v, c) for c in cols} for k, v in state.get(int(oid), {}).items()}
        if got != want:
            keys = sorted(set(got) | set(want))
            k = next(k for k in keys if got.get(k) != want.get(k))
            return "%s: replayed %d rows, the table has %d; row %s replayed %r, in the table %r" % (
                name, len(got), len(want), k, got.get(k), want.get(k))
    return None


def shrink(env, scenario, mode, failure):
    """Drops workload groups while the scenario still fails; returns the smallest found."""
    step = max(1, len(scenario.workload) // 2)
    while step >= 1:
        i = 0
        while i < len(scenario.workload):
            trial = copy.copy(scenario)
            trial.workload = scenario.workload[:i] + scenario.workload[i + step:]
            try:
                got = run(env, trial, mode)
            except psycopg2.Error:
                got = None  # not a scenario any more (a COMMIT PREPARED without its PREPARE)
            # Only the same failure counts: the same stream, differing the same way (a trial
            # that fails otherwise is another finding, not this one made smaller).
            if got and got.split(": ")[:2] == failure.split(": ")[:2]:
                scenario, failure = trial, got
            else:
                i += step
        step //= 2
    return scenario, failure


REGRESSION_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "differential")


def play(env, scenario, name, mode, again):
    """Runs one scenario in one mode as a check; with --shrink, a failing one is shrunk and
    written to the regression directory, where every bounded run plays it first."""
    def check():
        failure = run(env, scenario, mode)
        if failure and ARGS.shrink:
            small, failure = shrink(env, scenario, mode, failure)
            os.makedirs(REGRESSION_DIR, exist_ok=True)
            path = os.path.join(REGRESSION_DIR, "seed-%d-g%d-%s.sql" % (scenario.seed, scenario.version, mode))
            with open(path, "w") as f:
                f.write(small.script(failure))
            print("-- shrunk to %d workload groups, written to %s (git add it: the suite plays it):\n%s"
                  % (len(small.workload), path, small.script(failure)))
        expect(failure is None, "%s plays the same through pgrelay as from native slots (reproduce: %s)"
               % (name, " ".join([sys.executable, os.path.abspath(__file__), env.pgrelay] + again)), got=failure)
    env.check("%s: %s (%d workload groups%s)" % (mode, name, len(scenario.workload),
                                                 ", two databases" if scenario.second else ""), check)


def body(env):
    env.start_postgres(LOGICAL_CONF)
    scripts = sorted(glob.glob(os.path.join(REGRESSION_DIR, "*.sql")))
    regressions = 0
    if ARGS.script:
        scripts, seeds, budget = [ARGS.script], [], None
    elif ARGS.seed is not None:
        scripts, seeds, budget = [], [(ARGS.seed, ARGS.generator)], None
    elif ARGS.seeds:
        scripts, seeds, budget = [], [(s, ARGS.generator) for s in range(1, ARGS.seeds + 1)], None
    else:
        again = {s for s, v in REGRESSIONS if v == ARGS.generator and ARGS.first == 1}
        rest = ((s, ARGS.generator) for s in range(ARGS.first, ARGS.first + 10**7) if s not in again)
        seeds, budget = itertools.chain(REGRESSIONS if ARGS.first == 1 else [], rest), ARGS.seconds
        regressions = len(REGRESSIONS) if ARGS.first == 1 else 0
        if ARGS.first != 1:
            scripts = []
    started = time.monotonic()
    for path in scripts:
        # Shrunk scripts of what the fuzzer found: each plays in both modes.
        with open(path) as f:
            scenario = Scenario.from_script(f.read())
        for mode in ("trigger", "native"):
            play(env, scenario, os.path.basename(path), mode, ["--script", path])
    ran = 0
    for seed, version in seeds:
        # The regressions always run; new seeds while the budget lasts.
        if budget is not None and ran >= regressions and time.monotonic() - started > budget:
            break
        scenario = Scenario(seed, version)
        if ran == 0:
            # The script a regression file holds describes its scenario exactly; the first seed
            # plays from its script, as a regression file does.
            text = scenario.script()
            env.check("seed %d, generator %d: its script read back writes the same script" % (seed, version),
                      lambda: expect_eq(Scenario.from_script(text).script(), text, "the script read back"))
            scenario = Scenario.from_script(text)
        for mode in ("trigger", "native"):
            play(env, scenario, "seed %d, generator %d" % (seed, version), mode,
                 ["--seed", str(seed), "--generator", str(version), "--shrink"])
        ran += 1
    elapsed = time.monotonic() - started
    print("differential: %d seeds in %.0f s (%.2f seeds/s, both modes)" % (ran, elapsed, ran / elapsed))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pgrelay")
    parser.add_argument("--seed", type=int, help="run this seed only")
    parser.add_argument("--seeds", type=int, help="run seeds 1..N")
    parser.add_argument("--seconds", type=float, default=150, help="run seeds for about this long")
    parser.add_argument("--first", type=int, default=1, help="the first seed --seconds runs")
    parser.add_argument("--shrink", action="store_true",
                        help="shrink a failing scenario and write it to %s as a regression" % REGRESSION_DIR)
    parser.add_argument("--script", help="play this script (a regression file) only")
    parser.add_argument("--generator", type=int, default=GENERATOR,
                        help="the generator version seeds are made with (default %d)" % GENERATOR)
    ARGS, rest = parser.parse_known_args()
    sys.argv = [sys.argv[0], ARGS.pgrelay] + rest
    main("differential", body)
