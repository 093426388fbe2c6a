// JetStream as an application sees it, with npm `nats`: read a stream, make one, publish to it.
//
//   node nats_stream.cjs MODULE SERVERS read STREAM [FILTER_SUBJECT]
//     Prints {"seq", "subject", "headers", "data"} (data in base64), one JSON line per message
//     the stream holds (on FILTER_SUBJECT only, when given), in stream order, read with an
//     ordered consumer: the kind an application writes.
//   node nats_stream.cjs MODULE SERVERS last STREAM SUBJECT
//     Prints the stream's last message on SUBJECT (wildcards allowed) as `read` does, or
//     nothing when it has none.
//   node nats_stream.cjs MODULE SERVERS add-stream NAME SUBJECT [MAX_BYTES]
//     Creates a stream (file storage, one replica); with MAX_BYTES it refuses new messages
//     once that full.
//   node nats_stream.cjs MODULE SERVERS purge STREAM SEQ
//     Removes the stream's messages before sequence SEQ, as its retention limits would.
//   node nats_stream.cjs MODULE SERVERS publish SUBJECT TEXT
//     Publishes one message into the stream that takes SUBJECT, without pgrelay's headers.
"use strict";

const [modulePath, servers, command, ...args] = process.argv.slice(2);
const nats = require(modulePath);  // npm nats: its node_modules/nats directory

async function read(nc, stream, filter) {
  const jsm = await nc.jetstreamManager();
  const info = await jsm.streams.info(stream);
  if (info.state.messages === 0) return;
  // One subject: nats-server 2.9 takes no list of them.
  const consumer = await nc.jetstream().consumers.get(stream, filter ? { filterSubjects: filter } : {});
  for (;;) {
    // An ordered consumer with nothing (left) to give ends its fetch empty-handed.
    const batch = await consumer.fetch({ max_messages: 1000, expires: 3000 });
    let got = 0;
    let pending = 1;
    for await (const m of batch) {
      got++;
      const headers = {};
      if (m.headers) {
        for (const [k, v] of m.headers) headers[k] = v.length === 1 ? v[0] : v;
      }
      process.stdout.write(JSON.stringify({ seq: m.seq, subject: m.subject, headers,
        data: Buffer.from(m.data).toString("base64") }) + "\n");
      pending = m.info.pending;
    }
    if (got === 0 || pending === 0) break;
  }
}

async function last(nc, stream, subject) {
  const jsm = await nc.jetstreamManager();
  let m;
  try {
    m = await jsm.streams.getMessage(stream, { last_by_subj: subject });
  } catch (e) {
    if (String(e).includes("no message found")) return;
    throw e;
  }
  const headers = {};
  if (m.header) {
    for (const [k, v] of m.header) headers[k] = v.length === 1 ? v[0] : v;
  }
  process.stdout.write(JSON.stringify({ seq: m.seq, subject: m.subject, headers,
    data: Buffer.from(m.data).toString("base64") }) + "\n");
}

async function addStream(nc, name, subject, maxBytes) {
  const jsm = await nc.jetstreamManager();
  const config = { name, subjects: [subject], storage: nats.StorageType.File, num_replicas: 1 };
  if (maxBytes) {
    config.max_bytes = Number(maxBytes);
    config.discard = nats.DiscardPolicy.New;
  }
  await jsm.streams.add(config);
}

async function main() {
  const nc = await nats.connect({ servers: servers.split(","), timeout: 10000 });
  if (command === "read") {
    await read(nc, args[0], args[1]);
  } else if (command === "last") {
    await last(nc, args[0], args[1]);
  } else if (command === "add-stream") {
    await addStream(nc, args[0], args[1], args[2]);
  } else if (command === "purge") {
    const jsm = await nc.jetstreamManager();
    await jsm.streams.purge(args[0], { seq: Number(args[1]) });
  } else if (command === "publish") {
    await nc.jetstream().publish(args[0], new TextEncoder().encode(args[1]));
  } else {
    throw new Error("unknown command " + command);
  }
  await nc.close();
}

main().catch((e) => {
  process.stderr.write(String((e && e.stack) || e) + "\n");
  process.exit(1);
});
