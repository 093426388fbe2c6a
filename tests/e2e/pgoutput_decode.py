# An independent pgoutput protocol v1 decoder for the e2e tests (written from the protocol docs).
"""Decodes pgoutput v1 messages: B, C, O, R, Y, I, U, D, T, M.

Kept independent of pgrelay's C++ decoder on purpose: the tests should not trust the code
under test to read its own output.
"""

import struct


class DecodeError(Exception):
    pass


class Incomplete(Exception):
    """The buffer ends inside a message (a writer has not finished it yet)."""


class Reader:
    def __init__(self, data, pos=0):
        self.data = data
        self.pos = pos

    def take(self, n):
        if self.pos + n > len(self.data):
            raise Incomplete()
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def u8(self):
        return self.take(1)[0]

    def i16(self):
        return struct.unpack("!h", self.take(2))[0]

    def i32(self):
        return struct.unpack("!i", self.take(4))[0]

    def u32(self):
        return struct.unpack("!I", self.take(4))[0]

    def u64(self):
        return struct.unpack("!Q", self.take(8))[0]

    def i64(self):
        return struct.unpack("!q", self.take(8))[0]

    def cstring(self):
        end = self.data.find(b"\0", self.pos)
        if end < 0:
            raise Incomplete()
        out = self.data[self.pos:end].decode("utf-8")
        self.pos = end + 1
        return out


def lsn_str(value):
    return "%X/%X" % (value >> 32, value & 0xFFFFFFFF)


def _tuple(r):
    n = r.i16()
    if n < 0:
        raise DecodeError("negative column count %d" % n)
    values = []
    for _ in range(n):
        kind = chr(r.u8())
        if kind == "n":
            values.append(None)
        elif kind == "u":
            values.append(UNCHANGED_TOAST)
        elif kind == "t":
            length = r.i32()
            if length < 0:
                raise DecodeError("negative value length %d" % length)
            values.append(r.take(length).decode("utf-8"))
        elif kind == "b":
            # binary 'true': the type's send format. Kept apart from text (a str), so that a
            # binary value where text belongs never compares equal to it.
            length = r.i32()
            if length < 0:
                raise DecodeError("negative value length %d" % length)
            values.append(Binary(r.take(length)))
        else:
            raise DecodeError("unknown tuple value kind %r" % kind)
    return values


class Binary(bytes):
    """A tuple value in binary format ('b')."""

    def __repr__(self):
        return "Binary(%s)" % bytes.__repr__(self)

    def __eq__(self, other):
        return isinstance(other, Binary) and bytes.__eq__(self, other)

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = bytes.__hash__


class _Unchanged:
    def __repr__(self):
        return "<unchanged toast>"


UNCHANGED_TOAST = _Unchanged()


STREAMED_TAGS = "RYIUDTM"


def decode_one(r, in_stream=False):
    """Decodes one message at r.pos; returns a dict with 'tag' and its fields. Inside a stream
    block (between Stream Start and Stream Stop), a change's messages carry the xid of its
    (sub)transaction first: it comes back as 'xid'."""
    tag = chr(r.u8())
    if in_stream and tag in STREAMED_TAGS:
        xid = r.u32()
        msg = _decode_body(tag, r)
        msg["xid"] = xid
        return msg
    return _decode_body(tag, r)


def _decode_body(tag, r):
    """The fields of a message after its type byte (and a streamed change's xid)."""
    if tag == "S":
        return {"tag": "S", "xid": r.u32(), "first": r.u8()}
    if tag == "E":
        return {"tag": "E"}
    if tag == "c":
        return {"tag": "c", "xid": r.u32(), "flags": r.u8(), "commit_lsn": r.u64(), "end_lsn": r.u64(),
                "commit_time": r.i64()}
    if tag == "A":
        msg = {"tag": "A", "xid": r.u32(), "subxid": r.u32()}
        if len(r.data) - r.pos >= 16:  # protocol 4, streaming = parallel
            msg["abort_lsn"], msg["abort_time"] = r.u64(), r.i64()
        return msg
    if tag == "B":
        return {"tag": "B", "final_lsn": r.u64(), "commit_time": r.i64(), "xid": r.u32()}
    if tag == "C":
        return {"tag": "C", "flags": r.u8(), "commit_lsn": r.u64(), "end_lsn": r.u64(),
                "commit_time": r.i64()}
    if tag == "O":
        return {"tag": "O", "lsn": r.u64(), "name": r.cstring()}
    if tag == "R":
        msg = {"tag": "R", "oid": r.u32(), "schema": r.cstring(), "name": r.cstring(),
               "replident": chr(r.u8())}
        cols = []
        for _ in range(r.i16()):
            flags = r.u8()
            name = r.cstring()
            cols.append({"flags": flags, "name": name, "type": r.u32(), "typmod": r.i32()})
        msg["columns"] = cols
        return msg
    if tag == "Y":
        return {"tag": "Y", "oid": r.u32(), "schema": r.cstring(), "name": r.cstring()}
    if tag == "I":
        relid = r.u32()
        kind = chr(r.u8())
        if kind != "N":
            raise DecodeError("Insert: expected 'N', got %r" % kind)
        return {"tag": "I", "relid": relid, "new": _tuple(r)}
    if tag == "U":
        relid = r.u32()
        kind = chr(r.u8())
        old_kind, old = None, None
        if kind in ("K", "O"):
            old_kind, old = kind, _tuple(r)
            kind = chr(r.u8())
        if kind != "N":
            raise DecodeError("Update: expected 'N', got %r" % kind)
        return {"tag": "U", "relid": relid, "old_kind": old_kind, "old": old, "new": _tuple(r)}
    if tag == "D":
        relid = r.u32()
        kind = chr(r.u8())
        if kind not in ("K", "O"):
            raise DecodeError("Delete: expected 'K' or 'O', got %r" % kind)
        return {"tag": "D", "relid": relid, "old_kind": kind, "old": _tuple(r)}
    if tag == "T":
        n = r.i32()
        options = r.u8()
        return {"tag": "T", "options": options, "relids": [r.u32() for _ in range(n)]}
    if tag == "M":
        flags = r.u8()
        lsn = r.u64()
        prefix = r.cstring()
        length = r.i32()
        return {"tag": "M", "transactional": bool(flags & 1), "lsn": lsn, "prefix": prefix,
                "content": r.take(length)}
    raise DecodeError("unknown pgoutput message type %r at offset %d" % (tag, r.pos - 1))


def decode_message(payload, in_stream=False):
    """One message that fills `payload` exactly (a psycopg2 msg.payload, an XLogData body);
    `in_stream`: it came inside a stream block."""
    r = Reader(payload)
    try:
        msg = decode_one(r, in_stream)
    except Incomplete:
        raise DecodeError("truncated %r message (%d bytes)" % (payload[:1], len(payload)))
    if r.pos != len(payload):
        raise DecodeError("%d bytes left after a %r message" % (len(payload) - r.pos, msg["tag"]))
    return msg


def decode_recvlogical(data, allow_partial=False):
    """Messages of a pg_recvlogical output file: each message's bytes then one '\\n'.

    With allow_partial, an incomplete last message is ignored (the writer is still running);
    otherwise it is an error. A missing separator is always an error.
    """
    r = Reader(data)
    out = []
    while r.pos < len(data):
        start = r.pos
        try:
            msg = decode_one(r)
            sep = r.take(1)
        except Incomplete:
            if allow_partial:
                break
            raise DecodeError("truncated message at offset %d" % start)
        if sep != b"\n":
            raise DecodeError("message %r at offset %d is followed by %r, not the '\\n' separator"
                              % (msg["tag"], start, sep))
        out.append(msg)
    return out


class Session:
    """Folds a message sequence into transactions, checking pgoutput's ordering rules.

    A transaction: {'xid', 'final_lsn', 'commit_lsn', 'end_lsn', 'changes': [...]}, each change
    ('I', table, new) / ('U', table, old_kind, old, new) / ('D', table, old_kind, old) /
    ('T', [tables], options) / ('M', prefix, content). `relations` maps oid to the last Relation.
    """

    def __init__(self):
        self.relations = {}
        self.relation_messages = []
        self.transactions = []
        self.errors = []
        self.current = None
        self.messages = []

    def feed(self, msg):
        self.messages.append(msg)
        tag = msg["tag"]
        if tag == "B":
            if self.current is not None:
                self.errors.append("Begin inside an open transaction (xid %d)" % self.current["xid"])
            self.current = {"xid": msg["xid"], "final_lsn": msg["final_lsn"], "changes": [],
                            "commit_time": msg["commit_time"]}
            return
        if tag == "C":
            if self.current is None:
                self.errors.append("Commit without Begin")
                return
            self.current["commit_lsn"] = msg["commit_lsn"]
            self.current["end_lsn"] = msg["end_lsn"]
            if msg["commit_lsn"] != self.current["final_lsn"]:
                self.errors.append("Begin.final_lsn %s != Commit.commit_lsn %s" % (
                    lsn_str(self.current["final_lsn"]), lsn_str(msg["commit_lsn"])))
            if msg["end_lsn"] <= msg["commit_lsn"]:
                self.errors.append("Commit.end_lsn %s is not after commit_lsn %s" % (
                    lsn_str(msg["end_lsn"]), lsn_str(msg["commit_lsn"])))
            if msg["commit_time"] != self.current["commit_time"]:
                self.errors.append("Commit time differs from Begin's")
            self.transactions.append(self.current)
            self.current = None
            return
        if tag == "R":
            self.relations[msg["oid"]] = msg
            self.relation_messages.append(msg)
            return
        if tag in ("Y", "O"):
            return
        if tag == "M" and not msg["transactional"]:
            self.transactions.append({"changes": [("M", msg["prefix"], msg["content"])],
                                      "non_transactional": True, "lsn": msg["lsn"]})
            return
        if self.current is None:
            self.errors.append("%s message outside a transaction" % tag)
            return
        if tag == "M":
            self.current["changes"].append(("M", msg["prefix"], msg["content"]))
            return
        if tag == "T":
            names = []
            for oid in msg["relids"]:
                if oid not in self.relations:
                    self.errors.append("Truncate of relation %d before its Relation message" % oid)
                names.append(self._name(oid))
            self.current["changes"].append(("T", names, msg["options"]))
            return
        oid = msg["relid"]
        if oid not in self.relations:
            self.errors.append("%s on relation %d before its Relation message" % (tag, oid))
        name = self._name(oid)
        ncols = len(self.relations[oid]["columns"]) if oid in self.relations else None
        for key in ("new", "old"):
            if msg.get(key) is not None and ncols is not None and len(msg[key]) != ncols:
                self.errors.append("%s on %s: %s tuple has %d columns, Relation has %d" % (
                    tag, name, key, len(msg[key]), ncols))
        if tag == "I":
            self.current["changes"].append(("I", name, msg["new"]))
        elif tag == "U":
            self.current["changes"].append(("U", name, msg["old_kind"], msg["old"], msg["new"]))
        elif tag == "D":
            self.current["changes"].append(("D", name, msg["old_kind"], msg["old"]))

    def _name(self, oid):
        rel = self.relations.get(oid)
        return "%s.%s" % (rel["schema"], rel["name"]) if rel else "?%d" % oid

    def changes(self):
        """The transactions' changes only: what a test compares with its expectation."""
        return [t["changes"] for t in self.transactions]


def session_of(messages):
    s = Session()
    for m in messages:
        s.feed(m)
    return s
