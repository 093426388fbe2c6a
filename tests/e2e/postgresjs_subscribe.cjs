// postgres.js client for the e2e test: one query through pass-through, then subscribe('*') and print changes as JSON lines.
'use strict'
const [modulePath, url] = process.argv.slice(2)
const postgres = require(modulePath)

const out = (obj) => process.stdout.write(JSON.stringify(obj) + '\n')

async function run() {
  const sql = postgres(url, { max: 2, onnotice: () => {}, ssl: false })
  // An ordinary query first: postgres.js uses the extended protocol with named statements.
  const [r] = await sql`SELECT ${41}::int + 1 AS answer, ${'text'}::text AS t, current_setting('wal_level') AS wal_level`
  out({ event: 'query', row: r })
  const { unsubscribe } = await sql.subscribe(
    '*',
    (row, info) => out({
      event: 'change',
      command: info.command,
      table: info.relation.schema + '.' + info.relation.table,
      keys: info.relation.keys.map(k => k.name),
      key: info.key === undefined ? null : info.key,
      row,
      old: info.old === undefined ? null : info.old
    }),
    () => out({ event: 'subscribed' }),
    (e) => out({ event: 'error', message: String(e) })
  )
  // The test closes our stdin when it is done: unsubscribe and end cleanly.
  process.stdin.on('end', async () => {
    unsubscribe()
    await sql.end({ timeout: 5 })
    out({ event: 'ended' })
    process.exit(0)
  })
  process.stdin.resume()
}

run().catch((e) => {
  out({ event: 'fatal', message: String((e && e.stack) || e) })
  process.exit(2)
})
