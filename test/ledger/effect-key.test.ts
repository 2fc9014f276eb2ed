import t from 'tap';
import { Writable } from 'node:stream';
import { createLogger } from '../../core/log.js';
import { ctx, ledgerFixture, testKeyer, TEST_SECRET } from '../helpers/db.js';

t.test('the effect key depends only on the secret, its key id and the operation id', (t) => {
  const id = '1b4e28ba-2fa1-11d2-883f-0016d3cca427';
  const k = testKeyer();
  t.match(k.derive(id), /^v1\.k1\.[0-9a-f]{64}$/);
  t.equal(k.derive(id), testKeyer().derive(id), 'stable for the same secret, key id and operation');
  t.not(k.derive(id), k.derive('1b4e28ba-2fa1-11d2-883f-0016d3cca428'), 'another operation, another key');
  t.not(k.derive(id), testKeyer(TEST_SECRET + 'x').derive(id), 'another secret, another key');
  t.not(testKeyer(TEST_SECRET, 'k2').derive(id).slice(6), k.derive(id).slice(6), 'another key id, another MAC');
  t.ok(k.verify(id, k.derive(id)));
  t.notOk(k.verify(id, testKeyer(TEST_SECRET + 'x').derive(id)));
  t.notOk(k.verify(id, 'v1.k9.' + '0'.repeat(64)), 'unknown key id does not verify');
  t.end();
});

t.test('the secret never appears in a log line, an error or a row', async (t) => {
  const { ledger, pool } = await ledgerFixture(t);
  const lines: string[] = [];
  const log = createLogger({
    level: 'trace',
    name: 't',
    destination: new Writable({
      write(c, _e, cb) {
        lines.push(String(c));
        cb();
      },
    }),
  });
  const r = await ledger.reserve(ctx(), 'issue_refund', { amount: 1 });
  log.info({ reservation: r, keyer: ledger.keyer, secret: TEST_SECRET }, 'reserved');
  const err = await ledger.reserve(ctx(), 'issue_refund', { amount: 2 }).catch((e: unknown) => e);
  log.error({ err }, 'conflict');
  const dump = (
    await pool.query<{ all: string }>(
      `SELECT (SELECT json_agg(o)::text FROM actionledger.operations o) || (SELECT json_agg(h)::text FROM actionledger.operation_history h) AS all`,
    )
  ).rows[0]!.all;
  const hex = Buffer.from(TEST_SECRET).toString('hex');
  for (const [where, text] of [
    ['log', lines.join('')],
    ['error', JSON.stringify(err) + String(err) + (err as Error).stack],
    ['rows', dump],
  ] as const) {
    t.notOk(text.includes(TEST_SECRET) || text.includes(hex), `secret absent from ${where}`);
  }
  t.ok(lines.length >= 2);
});
