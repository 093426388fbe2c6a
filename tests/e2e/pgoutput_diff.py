# What the differential e2e tests share: slots read with psycopg2, and the rules comparing pgrelay's stream with a native slot's.
"""Reading pgoutput streams and comparing pgrelay's with a native slot's on the same upstream.

The rules are the narrow ones the README documents, each stated once here: a native slot also
carries pgrelay's own writes upstream (native_view drops them), trigger capture numbers its own
LSNs, xids and commit times (positionless), when an unchanged Relation is sent again is each
sender's choice (in_force), and so is whether, when and in how many blocks a transaction is
streamed before its commit (assembled).
"""

import select
import time

from psycopg2.extras import LogicalReplicationConnection
import psycopg2
import psycopg2.errors

from pgoutput_decode import decode_message

PGRELAY_OWN_MESSAGES = ("pgrelay.capture.barrier", "pgrelay.publications.changed")
# A stream with messages 'false' is read through the row a sync mark (mark(..., marks=True))
# inserts into this table, which its publication set then includes (p_marks).
MARKS_TABLE = "diff_marks"
MARKS_SETUP = ["CREATE TABLE %s (n bigserial PRIMARY KEY, prefix text)" % MARKS_TABLE,
               "CREATE PUBLICATION p_marks FOR TABLE %s" % MARKS_TABLE]


def marked(value):
    """A MARKS_TABLE row's prefix, read in text or binary mode (text's send format is its bytes)."""
    return bytes(value).decode() if isinstance(value, bytes) else value


def replication(url):
    # A guard against a hang, not a latency check: with 8 writers and two subscribers catching up
    # on the 2-core CI machine, an ASan pgrelay once took 3.3 s to authorize a session and more
    # than 10 s to be ready (e2e_partitions, the movers check).
    return psycopg2.connect(url, connection_factory=LogicalReplicationConnection, connect_timeout=30)


class Stream:
    """One slot's pgoutput stream, with logical messages, read as far as asked."""

    def __init__(self, url, slot, publication, options=None):
        self.what = "%s on %s" % (slot, publication)
        self.slot = slot
        self.opts = {"proto_version": "1", "publication_names": publication, "messages": "true"}
        self.opts.update(options or {})
        self.messages = []
        self.names = {}  # relation OID -> name, from the Relations read
        self.in_block = False  # between Stream Start and Stream Stop: changes carry an xid
        self.start(url, 0)

    def start(self, url, lsn):
        """Connects and starts streaming. A slot still active for the session this consumer just
        closed (its sender has not seen the close yet: Postgres has the same window) is tried
        again for a while, as subscribers do."""
        deadline = time.monotonic() + 10
        while True:
            self.in_block = False
            self.conn = replication(url)
            self.cur = self.conn.cursor()
            try:
                self.cur.start_replication(slot_name=self.slot, decode=False, start_lsn=lsn, options=self.opts)
                return
            except psycopg2.errors.ObjectInUse:
                self.conn.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def resume(self, url):
        """Connects again, as a consumer does that lost its connection: what it read after its
        last Commit is dropped (a transaction cut short, or one it never confirmed) and the
        stream starts again at that Commit's end. A stream that ended with an error stays so."""
        if self.messages and self.messages[-1]["tag"] == "error":
            return
        try:
            self.conn.close()
        except psycopg2.Error:
            pass
        last = max((i for i, m in enumerate(self.messages) if m["tag"] in ("C", "c")), default=None)
        lsn = 0 if last is None else self.messages[last]["end_lsn"]
        del self.messages[0 if last is None else last + 1:]
        self.start(url, lsn)

    def read_until(self, prefix, timeout=120):
        """Reads through the transactional message `prefix` and the Commit of its transaction,
        so that a consumer resuming from its last Commit (resume) goes on after it, never from
        before the schema change a read-through follows."""
        deadline = time.monotonic() + timeout
        found = False
        while time.monotonic() < deadline:
            msg = self.cur.read_message()
            if msg is None:
                select.select([self.cur], [], [], 0.2)
                continue
            m = decode_message(msg.payload, self.in_block)
            if m["tag"] in ("S", "E"):
                self.in_block = m["tag"] == "S"
            self.messages.append(m)
            if m["tag"] == "R":
                self.names[m["oid"]] = m["name"]
            if m["tag"] == "M" and m["prefix"] == prefix:
                found = True
            if m["tag"] == "I" and self.names.get(m["relid"]) == MARKS_TABLE and marked(m["new"][1]) == prefix:
                found = True
            if found and m["tag"] in ("C", "c"):
                return self.messages
        raise AssertionError("%s: no %r message in %d s (%d messages read)"
                             % (self.what, prefix, timeout, len(self.messages)))

    def close(self):
        self.conn.close()


def assembled(messages):
    """The stream with each streamed transaction whole, at its Stream Commit, as a subscriber
    applies it: Begin (its commit LSN, commit time, xid), the changes its blocks sent (without
    their xids; a subtransaction's Stream Abort drops from that subtransaction's first change on,
    as worker.c truncates its file), Commit. A Stream Abort of the whole transaction drops it;
    a first Stream Start starts it over (a consumer that reconnected is streamed it again).
    Whether and when a sender streams a transaction is its own choice: Postgres past
    logical_decoding_work_mem, pgrelay past its spill threshold."""
    streams, out, block = {}, [], None
    for m in messages:
        tag = m["tag"]
        if tag == "S":
            block = m["xid"]
            if m["first"] or block not in streams:
                streams[block] = []
        elif tag == "E":
            block = None
        elif tag == "A":
            changes = streams.get(m["xid"], [])
            if m["subxid"] == m["xid"]:
                streams.pop(m["xid"], None)
            else:
                first = next((i for i, (x, _) in enumerate(changes) if x == m["subxid"]), None)
                if first is not None:
                    del changes[first:]
        elif tag == "c":
            out.append({"tag": "B", "final_lsn": m["commit_lsn"], "commit_time": m["commit_time"], "xid": m["xid"]})
            out += [change for _, change in streams.pop(m["xid"], [])]
            out.append({"tag": "C", "flags": m["flags"], "commit_lsn": m["commit_lsn"], "end_lsn": m["end_lsn"],
                        "commit_time": m["commit_time"]})
        elif block is not None:
            streams[block].append((m.get("xid"), {k: v for k, v in m.items() if k != "xid"}))
        else:
            out.append(m)
    return out


def in_force(messages):
    """The messages with each data change carrying the Relation in force for its table instead
    of its OID, and no Relation or Type messages: the stream as a consumer applies it. A
    Relation carries the Types in force for its columns' types (a consumer keeps the Types it
    was sent). When a Relation, and the Types before it, are sent (again) is each sender's own
    choice; pgoutput repeats an unchanged one after any invalidation of the table (a DETACH, a
    TRUNCATE, say). This is the equivalence pgoutput_parity_test uses."""
    relations, types, out = {}, {}, []
    for m in messages:
        if m["tag"] == "Y":
            types[m["oid"]] = (m["schema"], m["name"])
        elif m["tag"] == "R":
            relation = {k: v for k, v in m.items() if k != "tag"}
            relation["types"] = {c["type"]: types[c["type"]] for c in m["columns"] if c["type"] in types}
            relations[m["oid"]] = relation
        elif m["tag"] in ("I", "U", "D"):
            out.append(dict(m, relid=relations.get(m["relid"], "no Relation sent")))
        elif m["tag"] == "T":
            out.append(dict(m, relids=[relations.get(r, "no Relation sent") for r in m["relids"]]))
        else:
            out.append(m)
    return out


def native_view(theirs):
    """A native slot's messages less pgrelay's own writes upstream, which no stream through
    pgrelay carries (README): the changes of its bookkeeping tables (in FOR ALL TABLES), its
    logical messages (native capture's barriers, the marks of publication changes), and the
    transactions that leaves empty. Also left out: a streamed transaction that published
    nothing, which Postgres 15 still streams (pgoutput_stream_start writes its Stream Start
    before any change; only transactions sent whole are skipped when empty), and pgrelay, which
    starts a stream at its first published change, does not."""
    own = {m["oid"] for m in theirs if m["tag"] == "R" and m["schema"] == "_pgrelay"}
    theirs = [m for m in theirs if m.get("relid") not in own and m.get("oid") not in own
              and not (m["tag"] == "M" and m["prefix"] in PGRELAY_OWN_MESSAGES)]
    theirs = assembled(theirs)
    return [m for i, m in enumerate(theirs)
            if not (m["tag"] == "B" and i + 1 < len(theirs) and theirs[i + 1]["tag"] == "C")
            and not (m["tag"] == "C" and i > 0 and theirs[i - 1]["tag"] == "B")]


def positionless(messages):
    """in_force() less what trigger capture numbers itself (README): LSNs, xids and commit
    times; transaction boundaries are kept."""
    out = []
    for m in in_force(messages):
        if m["tag"] in ("B", "C"):
            out.append({"tag": m["tag"]})
        elif m["tag"] == "M":
            out.append({k: v for k, v in m.items() if k != "lsn"})
        else:
            out.append(m)
    return out


def renamed_schemas(messages, renames):
    """Relations with each schema name a scenario renamed (`renames`: old name -> new) given
    as the name it has at the end. After ALTER SCHEMA .. RENAME, pgoutput keeps sending a
    table's old schema name until something invalidates that table's relation cache entry (the
    namespace invalidation only revalidates publications), and when that happens differs between
    a native slot and pgrelay's upstream slot (pgrelay's mirror publication, the upstream
    streaming a transaction to native capture): a consumer may learn the new name later or
    sooner, never a wrong one."""
    if not renames:
        return messages
    out = []
    for m in messages:
        if m["tag"] == "R":
            schema = m["schema"]
            while schema in renames:
                schema = renames[schema]
            m = dict(m, schema=schema)
        out.append(m)
    return out


def compared(mode, messages, schema_renames=None):
    """(the changes alone, the whole stream) as a mode's streams are compared with a native slot's."""
    messages = renamed_schemas(assembled(messages), schema_renames)
    whole = in_force(messages) if mode == "native" else positionless(messages)
    return [m for m in whole if m["tag"] not in ("B", "C")], whole


def transactions(whole):
    """A compared stream as its transactions (Begin..Commit), sorted: trigger capture orders the
    transactions one poll finds by their last write, which for concurrent ones that wrote no
    common row can differ from the upstream's commit order (README)."""
    out, current = [], []
    for m in whole:
        current.append(repr(m))
        if m["tag"] == "C" or (m["tag"] == "M" and not m["transactional"]):
            out.append("\n".join(current))
            current = []
    if current:
        out.append("\n".join(current))
    return sorted(out)


def mark(mode, cur, prefix, content="", transactional=True, marks=False):
    """A logical message in pgrelay's stream and in the native slot's: native capture decodes
    pg_logical_emit_message as the slot does; trigger capture sees only its own emit_message
    (which consumers' calls through pgrelay go to), so in that mode the statement makes both,
    each seen by one side. With `marks`, the same transaction inserts `prefix` into MARKS_TABLE,
    for streams without messages."""
    if mode == "native":
        sql, args = "SELECT pg_logical_emit_message(%s, %s, %s::text)", [transactional, prefix, content]
    else:
        sql = "SELECT _pgrelay.emit_message(%s, %s::text, %s::text), pg_logical_emit_message(%s, %s, %s::text)"
        args = [transactional, prefix, content, transactional, prefix, content]
    if marks:
        sql, args = sql + "; INSERT INTO %s (prefix) VALUES (%%s)" % MARKS_TABLE, args + [prefix]
    cur.execute(sql, args)


def first_difference(ours, theirs):
    for i, (a, b) in enumerate(zip(ours, theirs)):
        if a != b:
            return "message %d: pgrelay %r, native %r" % (i, a, b)
    return "pgrelay sent %d messages, native %d" % (len(ours), len(theirs))
