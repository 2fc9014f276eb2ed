/**
 * A row another session holds (a reviewer, a revocation in progress, a migration) does not stall its
 * batch-mates: the evidence statement and the dispatch lock (the first statements of a dispatch batch, written
 * together) skip it and try it again in a later batch, and it is dispatched once it is let go. Real PostgreSQL, the sandbox provider and authorizer over mTLS, a real
 * Dispatcher; the stranger is a second connection holding `SELECT ... FOR UPDATE`.
 */
import t, { type Test } from 'tap';
import type { Pool, PoolClient } from '../../db/db.js';
import { ctx, dispatchEnv, dispatcherThroughProxy, evidenceRows, settled, statusOf } from '../helpers/fleet.js';

const args = (n: number) => ({ order_id: `ord-${n}`, amount: 100 + n, currency: 'EUR' });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function connect(t: Test, pool: Pool): Promise<PoolClient> {
  const c = await pool.connect();
  t.teardown(() => c.release());
  return c;
}

t.test(
  'a row held by another session when its evidence is recorded: its batch-mates are dispatched, it follows once let go',
  async (t) => {
    // Timeouts no answer here reaches: the mates' decisions wait for the held one's, then 300 ms more.
    const e = await dispatchEnv(t, { provider_http_timeout_seconds: 30, authorization_http_timeout_seconds: 30 });
    const held = await e.ledger.reserve(ctx('held'), 'issue_refund', args(0));
    const mates = [];
    for (let i = 1; i <= 6; i++) mates.push(await e.ledger.reserve(ctx(`mate-${i}`), 'issue_refund', args(i)));
    const holder = await connect(t, e.pool);
    // The held operation's row is locked by the stranger before its decision is answered, so before its evidence
    // statement; the others' decisions come after that.
    let markHeld!: () => void;
    const isHeld = new Promise<void>((r) => (markHeld = r));
    e.authorizer.decide = async (req): Promise<'allow'> => {
      if (req.operation_id === held.operation_id) {
        await holder.query('BEGIN');
        await holder.query('SELECT 1 FROM actionledger.operations WHERE operation_id = $1 FOR UPDATE', [
          held.operation_id,
        ]);
        markHeld();
      } else {
        await isHeld;
        await sleep(300);
      }
      return 'allow';
    };
    await e.dispatcher(8);
    for (const m of mates) {
      t.equal(
        (await settled(e.pool, m.operation_id)).status,
        'succeeded',
        'a batch-mate succeeded while the row is held',
      );
      t.equal(e.provider.requestsFor(m.effect_key), 1);
    }
    t.equal(await statusOf(e.pool, held.operation_id), 'executing', 'the held one waits, still claimed');
    t.equal(await evidenceRows(e.pool, held.operation_id), 0, 'its evidence was not recorded under the stranger');
    t.equal(e.provider.requestsFor(held.effect_key), 0, 'and it was not sent');
    await holder.query('ROLLBACK');
    t.equal((await settled(e.pool, held.operation_id)).status, 'succeeded', 'let go, it is dispatched');
    t.equal(e.provider.requestsFor(held.effect_key), 1, 'once');
  },
);

t.test(
  'a row held by another session when its dispatch batch locks: its batch-mates are dispatched, it follows once let go',
  async (t) => {
    // The dispatcher talks to the database through a proxy that passes the first dispatch batch's evidence
    // statement and holds the rest of its opening (BEGIN, the row locks, the final check) until the stranger has
    // taken the held operation's row once its evidence committed: nothing races the stranger for the row.
    const { e, d, proxy } = await dispatcherThroughProxy(t, { concurrency: 8 });
    const held = await e.ledger.reserve(ctx('held'), 'issue_refund', args(0));
    const mates = [];
    for (let i = 1; i <= 6; i++) mates.push(await e.ledger.reserve(ctx(`mate-${i}`), 'issue_refund', args(i)));
    const holder = await connect(t, e.pool);
    let markHeld!: () => void;
    const isHeld = new Promise<void>((r) => (markHeld = r));
    t.teardown(() => markHeld());
    e.authorizer.decide = async (req): Promise<'allow'> => {
      if (req.operation_id !== held.operation_id) {
        await isHeld;
        await sleep(300);
      }
      return 'allow';
    };
    const batch = proxy.holdNextRequests();
    await d.start();
    await batch.arrived;
    const deadline = Date.now() + 10_000;
    while ((await evidenceRows(e.pool, held.operation_id)) === 0 && Date.now() < deadline) await sleep(10);
    t.equal(await evidenceRows(e.pool, held.operation_id), 1, 'its evidence is recorded, its row not yet locked');
    await holder.query('BEGIN');
    await holder.query('SELECT 1 FROM actionledger.operations WHERE operation_id = $1 FOR UPDATE', [held.operation_id]);
    batch.release();
    markHeld();

    for (const m of mates) {
      t.equal(
        (await settled(e.pool, m.operation_id)).status,
        'succeeded',
        'a batch-mate succeeded while the row is held',
      );
      t.equal(e.provider.requestsFor(m.effect_key), 1);
    }
    t.equal(await statusOf(e.pool, held.operation_id), 'executing', 'the held one waits, still claimed');
    t.equal(e.provider.requestsFor(held.effect_key), 0, 'and it was not sent');
    await holder.query('ROLLBACK');
    t.equal((await settled(e.pool, held.operation_id)).status, 'succeeded', 'let go, it is dispatched');
    t.equal(e.provider.requestsFor(held.effect_key), 1, 'once');
  },
);
