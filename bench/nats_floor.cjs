// What JetStream itself gives on this machine, beside pgrelay's figures in bench/nats.sh (npm `nats`).
//
//   node nats_floor.cjs MODULE SERVERS consume SUBJECT COUNT
//     Reads COUNT new messages (or those that come, until 3 s pass without one) on SUBJECT (pgrelay's change messages of table bench) with an
//     ordered consumer and prints "p50_ms=… p99_ms=… max_ms=…" of receipt time minus the row's
//     ts_us (its clock_timestamp() at INSERT, µs since 1970).
//   node nats_floor.cjs MODULE SERVERS baseline STREAM COUNT RATE
//     The floor JetStream itself sets: publishes COUNT messages at RATE/s into STREAM (its own
//     subject), each stamped with its send time, reads them back the same way, prints the same.
//   node nats_floor.cjs MODULE SERVERS flood STREAM COUNT SIZE WINDOW
//     Publishes COUNT messages of SIZE bytes into STREAM as fast as JetStream acks them, with
//     at most WINDOW acks outstanding (pgrelay's publisher keeps 256), and prints "msgs_per_s=…".
"use strict";

const [modulePath, servers, command, ...args] = process.argv.slice(2);
const nats = require(modulePath);  // npm nats: its node_modules/nats directory

const nowUs = () => (performance.timeOrigin + performance.now()) * 1000;

function report(samples) {
  samples.sort((a, b) => a - b);
  const at = (q) => samples[Math.min(samples.length - 1, Math.floor(q * samples.length))] / 1000;
  console.log(`n=${samples.length} p50_ms=${at(0.5).toFixed(2)} p99_ms=${at(0.99).toFixed(2)} ` +
              `max_ms=${(samples[samples.length - 1] / 1000).toFixed(2)}`);
}

async function consume(nc, stream, subject, count, stampOf) {
  const consumer = await nc.jetstream().consumers.get(stream, {
    filterSubjects: subject, deliver_policy: nats.DeliverPolicy.New });
  const samples = [];
  const messages = await consumer.consume();
  let last = Date.now();
  // Stops at `count`, or 3 s after the last message once some came (a writer may send fewer).
  const idle = setInterval(() => {
    if (samples.length > 0 && Date.now() - last > 3000) messages.stop();
  }, 500);
  console.error("ready");
  for await (const m of messages) {
    samples.push(nowUs() - stampOf(m));
    last = Date.now();
    if (samples.length >= count) break;
  }
  clearInterval(idle);
  return samples;
}

async function main() {
  const nc = await nats.connect({ servers: servers.split(","), timeout: 10000 });
  if (command === "consume") {
    const [subject, count] = args;
    const streams = await (await nc.jetstreamManager()).streams.find(subject);
    const samples = await consume(nc, streams, subject, Number(count),
      (m) => Number(JSON.parse(new TextDecoder().decode(m.data)).new.ts_us));
    report(samples);
  } else if (command === "baseline") {
    const [stream, count, rate] = args;
    const jsm = await nc.jetstreamManager();
    await jsm.streams.add({ name: stream, subjects: [stream + ".>"], storage: nats.StorageType.File,
                            num_replicas: Math.min(3, servers.split(",").length) });
    const js = nc.jetstream();
    const reading = consume(nc, stream, stream + ".x", Number(count),
      (m) => Number(new TextDecoder().decode(m.data)));
    await new Promise((r) => setTimeout(r, 500));
    const start = Date.now();
    for (let i = 0; i < Number(count); i++) {
      const due = start + (i * 1000) / Number(rate);
      const wait = due - Date.now();
      if (wait > 0) await new Promise((r) => setTimeout(r, wait));
      js.publish(stream + ".x", new TextEncoder().encode(String(nowUs()))).catch(() => {});
    }
    report(await reading);
  } else if (command === "flood") {
    const [stream, count, size, window] = args.map((a, i) => (i === 0 ? a : Number(a)));
    const jsm = await nc.jetstreamManager();
    await jsm.streams.add({ name: stream, subjects: [stream + ".>"], storage: nats.StorageType.File,
                            num_replicas: Math.min(3, servers.split(",").length) });
    const js = nc.jetstream();
    const payload = new Uint8Array(size).fill(120);
    const pending = new Set();
    const start = performance.now();
    for (let i = 0; i < count; i++) {
      while (pending.size >= window) await Promise.race(pending);
      const p = js.publish(stream + ".x", payload, { msgID: String(i) }).finally(() => pending.delete(p));
      pending.add(p);
    }
    await Promise.all(pending);
    console.log(`msgs_per_s=${Math.round(count / ((performance.now() - start) / 1000))}`);
  }
  await nc.close();
}

main().catch((e) => {
  process.stderr.write(String((e && e.stack) || e) + "\n");
  process.exit(1);
});
