import * as diagnosticsChannel from 'node:diagnostics_channel';
import t, { type Test } from 'tap';
import { bindQueries, createPool, type Pool } from '../../db/db.js';
import { databaseKey, localWakeId, onLocalWake, wakeLocal } from '../../core/local-wake.js';
import { Metrics } from '../../core/metrics.js';
import { openDispatcher } from '../../dispatcher/index.js';
import type { ClaimEvent } from '../../dispatcher/producer.js';
import { dispatcherQueries } from '../../dispatcher/queries.js';
import { Gate } from '../../gate/index.js';
import { OutboxNotifier } from '../../ledger/notifier.js';
import { ctx, dispatchEnv, settled } from '../helpers/fleet.js';

const REFUND = { order_id: 'o-1', amount: 5, currency: 'EUR' };
/** Far longer than any test here waits, so only a wake-up can start a claim. */
const NO_POLL_MS = 60_000;
/** How long a woken dispatcher may take to finish the operation, on a loaded machine. */
const SETTLE_MS = 20_000;
/** Lets the claim a dispatcher makes as it starts land first, so it cannot be the one that finds the operation. */
const afterStartClaim = (): Promise<void> => new Promise((r) => setTimeout(r, 1000));

t.test('local wake-ups reach every listener of their channel, and none after it unsubscribes', (t) => {
  const heard: string[] = [];
  const offA = onLocalWake('s1_outbox', 'db-1', () => {
    heard.push('a');
  });
  const offB = onLocalWake('s1_outbox', 'db-1', () => {
    heard.push('b');
    throw new Error('a listener that throws does not stop the others');
  });
  let takes = true;
  const offC = onLocalWake('s2_outbox', 'db-1', (operationId) => {
    heard.push(`c:${operationId ?? '-'}`);
    return takes;
  });
  t.equal(wakeLocal('s1_outbox', 'db-1', 'op-1'), false, 'no listener took it');
  t.same(heard, ['a', 'b']);
  offA();
  offB();
  offB();
  t.equal(wakeLocal('s1_outbox', 'db-1', 'op-1'), false);
  t.same(heard, ['a', 'b'], 'nothing after unsubscribing');
  t.equal(wakeLocal('s2_outbox', 'db-1', 'op-1'), true, 'a listener took it');
  t.equal(wakeLocal('s2_outbox', 'db-1'), false, 'a wake-up for no one operation cannot be taken');
  t.equal(
    wakeLocal('s2_outbox', 'db-2', 'op-1'),
    false,
    'a listener of another database is woken, and its take does not count',
  );
  takes = false;
  t.equal(wakeLocal('s2_outbox', 'db-1', 'op-1'), false);
  t.same(
    heard,
    ['a', 'b', 'c:op-1', 'c:-', 'c:-', 'c:op-1'],
    'each with the operation, when there is one of its database',
  );
  offC();
  t.equal(wakeLocal('s2_outbox', 'db-1', 'op-1'), false, 'no listener at all');
  t.match(localWakeId, /^[0-9a-f]{16}$/);
  t.end();
});

t.test('a database is told by its pool settings', (t) => {
  const a = createPool('postgres://u:secret@db.example:5432/ledger', {
    max: 1,
    statementTimeoutMs: 1000,
    applicationName: 'k',
  });
  const b = createPool('postgres://u:secret@db.example:5432/ledger', {
    max: 1,
    statementTimeoutMs: 1000,
    applicationName: 'k',
  });
  const c = createPool('postgres://u:secret@db.example:5432/other', {
    max: 1,
    statementTimeoutMs: 1000,
    applicationName: 'k',
  });
  t.equal(databaseKey(a), databaseKey(b), 'the same settings, the same database');
  t.not(databaseKey(a), databaseKey(c));
  t.notMatch(databaseKey(a), /secret/, 'no password in the key');
  t.end();
});

/**
 * Every NOTIFY on the actionledger outbox channel of `pool`'s database, heard as another process's dispatcher would
 * hear it; `delivered` resolves once what committed before it was called has arrived.
 */
async function outboxListener(t: Test, pool: Pool) {
  const heard: string[] = [];
  const listener = await pool.connect();
  t.teardown(() => listener.release());
  listener.on('notification', (msg) => heard.push(msg.payload ?? ''));
  await listener.query('LISTEN actionledger_outbox');
  return {
    heard,
    /** Waits until one has been heard (10 s at most). */
    one: async (): Promise<void> => {
      for (const deadline = Date.now() + 10_000; heard.length === 0 && Date.now() < deadline;)
        await new Promise((r) => setTimeout(r, 10));
    },
    /** A round trip on the listener's own connection: a NOTIFY committed before it has been delivered by then. */
    delivered: (): Promise<unknown> => listener.query('SELECT 1'),
  };
}

/**
 * Operations reserved in one caller's transaction and committed with no wake-up at all (as work another process
 * reserved and whose NOTIFY was lost), one per step; with `availableInMs`, their outbox rows are available only
 * that much later (as a claim released by a worker that has stopped since: nothing announces that moment).
 */
async function reservedUnannounced(
  e: Awaited<ReturnType<typeof dispatchEnv>>,
  steps: string[],
  availableInMs = 0,
): Promise<string[]> {
  const client = await e.pool.connect();
  try {
    await client.query('BEGIN');
    const ids: string[] = [];
    for (const step of steps) {
      const op = await e.ledger.reserve(
        ctx(step),
        'issue_refund',
        { ...REFUND, order_id: step },
        { client, notifyOnCommit: false },
      );
      ids.push(op.operation_id);
    }
    if (availableInMs > 0)
      await client.query(
        `UPDATE actionledger.outbox SET available_at = now() + make_interval(secs => $2::float8 / 1000)
         WHERE operation_id = ANY($1::uuid[])`,
        [ids, availableInMs],
      );
    await client.query('COMMIT');
    return ids;
  } finally {
    client.release();
  }
}

/** A dispatcher of `concurrency` slots that polls only after the test, its start claim landed, and a listener. */
async function listeningBeside(t: Test, concurrency: number) {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  const outbox = await outboxListener(t, e.pool);
  await e.dispatcher(concurrency);
  await afterStartClaim();
  return { e, ...outbox };
}

t.test("the notifier's trailing NOTIFY is sent whatever a local dispatcher takes by then", async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  const outbox = await outboxListener(t, e.pool);
  let takes = false;
  const off = onLocalWake('actionledger_outbox', databaseKey(e.pool), () => takes);
  t.teardown(off);
  const notifier = new OutboxNotifier(e.pool, 'actionledger_outbox', 500);
  t.teardown(() => notifier.stop());
  notifier.poke('op-1');
  await outbox.one();
  t.same(outbox.heard, [localWakeId], 'not taken: announced at once');
  // Within the interval: coalesced into the trailing NOTIFY, which a take made before it is sent cannot cancel.
  notifier.poke();
  takes = true;
  await new Promise((r) => setTimeout(r, 700));
  await outbox.delivered();
  t.same(outbox.heard, [localWakeId, localWakeId], 'the trailing NOTIFY went');
  await new Promise((r) => setTimeout(r, 600));
  notifier.poke('op-2');
  await outbox.delivered();
  t.same(outbox.heard, [localWakeId, localWakeId], 'taken: nothing sent');
});

t.test('a reservation committed in this process wakes its dispatcher directly', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  await e.dispatcher();
  await afterStartClaim();
  // The start's own claim has found nothing; the NOTIFY this reservation sends carries this process's mark,
  // which its dispatcher skips: only the local wake-up can start the claim before the poll.
  const op = await e.ledger.reserve(ctx('local-wake'), 'issue_refund', REFUND);
  t.equal((await settled(e.pool, op.operation_id, SETTLE_MS)).status, 'succeeded');
});

t.test('a reservation the dispatcher of its process has a slot for sends no NOTIFY; the others do', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  const { heard, one: hearOne, delivered } = await outboxListener(t, e.pool);
  await e.dispatcher(1);
  await afterStartClaim();

  const first = await e.ledger.reserve(ctx('taken-1'), 'issue_refund', { ...REFUND, order_id: 'n-1' });
  t.equal((await settled(e.pool, first.operation_id, SETTLE_MS)).status, 'succeeded');
  await delivered();
  t.same(heard, [], 'taken by the dispatcher of this process: no NOTIFY');

  // Its one slot busy with a request that hangs until the client's timeout: the next reservation has no slot.
  const slow = await e.ledger.reserve(ctx('taken-2'), 'issue_refund', { ...REFUND, order_id: 'n-2' });
  e.provider.inject({ kind: 'hangHeaders', commit: true }, { when: (key) => key === slow.effect_key });
  for (const deadline = Date.now() + 10_000; e.provider.requestsFor(slow.effect_key) === 0 && Date.now() < deadline;)
    await new Promise((r) => setTimeout(r, 10));
  await delivered();
  t.same(heard, [], 'the slow one was taken too');
  const waiting = await e.ledger.reserve(ctx('not-taken'), 'issue_refund', { ...REFUND, order_id: 'n-3' });
  await hearOne();
  t.same(heard, [localWakeId], 'no slot free: the other processes are told');
  t.equal((await settled(e.pool, waiting.operation_id, SETTLE_MS)).status, 'succeeded', 'claimed once the slot frees');

  // A lifted kill switch makes any number of operations claimable: always told, whatever this process takes.
  const gate = new Gate({ config: e.config, pool: e.pool, ledger: e.ledger });
  await gate.engageKillSwitch('tenant-a', 'issue_refund', 'oncall', 'hold');
  const held = await e.ledger.reserve(ctx('held-n'), 'issue_refund', { ...REFUND, order_id: 'n-4' });
  await afterStartClaim();
  await delivered();
  heard.length = 0;
  t.equal(await gate.liftKillSwitch('tenant-a', 'issue_refund', 'oncall'), true);
  await hearOne();
  t.same(heard, [localWakeId], 'the lift is announced');
  t.equal((await settled(e.pool, held.operation_id, SETTLE_MS)).status, 'succeeded');
});

t.test('a taken reservation that older work kept from the claim is announced', async (t) => {
  const { e, heard, one } = await listeningBeside(t, 1);
  // Older work the dispatcher was never told about: reserved in a caller's transaction with no wake-up.
  const older = (await reservedUnannounced(e, ['older']))[0]!;
  // Taken (one slot free), so the ledger sends nothing; its claim takes the older operation and fills the slot.
  const taken = await e.ledger.reserve(ctx('taken'), 'issue_refund', { ...REFUND, order_id: 'k-2' });
  await one();
  t.same(heard, [localWakeId], 'the producer announced what its claim left');
  t.equal((await settled(e.pool, older, SETTLE_MS)).status, 'succeeded');
  t.equal((await settled(e.pool, taken.operation_id, SETTLE_MS)).status, 'succeeded');
});

t.test('a taken reservation whose claim failed is announced', async (t) => {
  const { e, heard, one } = await listeningBeside(t, 2);
  // The next claim fails: a trigger refuses the claim's update of the operation while a flag is set.
  await e.pool.query(`
    CREATE TABLE public.refuse_claims (on_ boolean);
    CREATE FUNCTION public.refuse_claim() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.status = 'executing' AND EXISTS (SELECT 1 FROM public.refuse_claims) THEN
        RAISE EXCEPTION 'claim refused by the test';
      END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER refuse_claim BEFORE UPDATE ON actionledger.operations FOR EACH ROW
      EXECUTE FUNCTION public.refuse_claim();
    INSERT INTO public.refuse_claims VALUES (true);`);
  const taken = await e.ledger.reserve(ctx('failed-claim'), 'issue_refund', { ...REFUND, order_id: 'f-1' });
  await one();
  t.same(heard, [localWakeId], 'the producer announced it');
  await e.pool.query('DELETE FROM public.refuse_claims');
  // The next wake-up (this reservation) claims both.
  const next = await e.ledger.reserve(ctx('after-failure'), 'issue_refund', { ...REFUND, order_id: 'f-2' });
  t.equal((await settled(e.pool, next.operation_id, SETTLE_MS)).status, 'succeeded');
  t.equal((await settled(e.pool, taken.operation_id, SETTLE_MS)).status, 'succeeded');
});

t.test('a NOTIFY from elsewhere still wakes the dispatcher', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  await e.dispatcher();
  await afterStartClaim();
  // Reserved in the caller's own transaction: the NOTIFY is sent at its commit (payload ''), with no local
  // wake-up, as a reservation made by another process reaches this one.
  const client = await e.pool.connect();
  let operationId: string;
  try {
    await client.query('BEGIN');
    const op = await e.ledger.reserve(ctx('remote-wake'), 'issue_refund', { ...REFUND, order_id: 'o-2' }, { client });
    operationId = op.operation_id;
    await client.query('COMMIT');
  } finally {
    client.release();
  }
  t.equal((await settled(e.pool, operationId, SETTLE_MS)).status, 'succeeded');
});

t.test('lifting a kill switch wakes the dispatcher for the operations it held', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  const gate = new Gate({ config: e.config, pool: e.pool, ledger: e.ledger });
  await gate.engageKillSwitch('tenant-a', 'issue_refund', 'oncall', 'hold');
  await e.dispatcher();
  const op = await e.ledger.reserve(ctx('held'), 'issue_refund', { ...REFUND, order_id: 'o-held' });
  // Woken by the reservation, the dispatcher's claim skips the held operation.
  await afterStartClaim();
  t.equal(
    (await e.pool.query<{ status: string }>('SELECT status FROM actionledger.operations')).rows[0]?.status,
    'pending',
  );
  t.equal(await gate.liftKillSwitch('tenant-a', 'issue_refund', 'oncall'), true);
  t.equal((await settled(e.pool, op.operation_id, SETTLE_MS)).status, 'succeeded');
});

t.test('a finished operation claims again only while work may be waiting', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  // Every claim statement the dispatcher got an answer to, heard on its diagnostics channel.
  let claims = 0;
  const d = await openDispatcher(
    { ...e.runtime, metrics: new Metrics({ defaultMetrics: false, ledger: false }) },
    e.env,
  );
  const onClaim = (message: unknown): void => {
    if ((message as ClaimEvent).workerId === d.workerId) claims++;
  };
  diagnosticsChannel.subscribe('actionledger:claim', onClaim);
  t.teardown(() => diagnosticsChannel.unsubscribe('actionledger:claim', onClaim));
  await d.start();
  t.teardown(() => d.stop());
  for (const deadline = Date.now() + 10_000; claims === 0 && Date.now() < deadline;)
    await new Promise((r) => setTimeout(r, 10));
  await afterStartClaim();
  t.equal(claims, 1, 'the claim at start, and no other');
  // One at a time: each reservation wakes one claim, which takes it and finds nothing more; its operation
  // finishing claims nothing, as nothing was left waiting.
  for (const step of ['b1', 'b2', 'b3']) {
    const op = await e.ledger.reserve(ctx(step), 'issue_refund', { ...REFUND, order_id: step });
    t.equal((await settled(e.pool, op.operation_id, SETTLE_MS)).status, 'succeeded');
  }
  await afterStartClaim();
  t.equal(claims, 4, 'one claim per reservation, none per finished operation');
});

/** Every claim statement answered (or failed) in this process from now until the test ends. */
function claimsHeard(t: Test): ClaimEvent[] {
  const heard: ClaimEvent[] = [];
  const onClaim = (message: unknown): void => void heard.push(message as ClaimEvent);
  diagnosticsChannel.subscribe('actionledger:claim', onClaim);
  t.teardown(() => diagnosticsChannel.unsubscribe('actionledger:claim', onClaim));
  return heard;
}

t.test('a claim that fills its one slot and sees nothing more waiting is not followed by an empty claim', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  const claims = claimsHeard(t);
  await e.dispatcher(1);
  await afterStartClaim();
  t.equal(claims.length, 1, 'the claim at start');
  // Each reservation wakes one claim of limit 1, which it fills; that claim saw nothing else waiting, so the
  // operation finishing claims nothing.
  for (const step of ['s1', 's2', 's3']) {
    const op = await e.ledger.reserve(ctx(step), 'issue_refund', { ...REFUND, order_id: step });
    t.equal((await settled(e.pool, op.operation_id, SETTLE_MS)).status, 'succeeded');
  }
  await afterStartClaim();
  t.same(
    claims.map((c) => [c.limit, c.rows.length, c.more]),
    [
      [1, 0, false],
      [1, 1, false],
      [1, 1, false],
      [1, 1, false],
    ],
    'one claim per reservation, each full, none after an operation finished',
  );
});

t.test('work queued behind a full claim is claimed as slots free, with no wake-up and no claim after it', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  // Three operations committed with no wake-up at all, before the dispatcher starts.
  const ids = await reservedUnannounced(e, ['q1', 'q2', 'q3']);
  const claims = claimsHeard(t);
  await e.dispatcher(1);
  for (const id of ids) t.equal((await settled(e.pool, id, SETTLE_MS)).status, 'succeeded');
  await afterStartClaim();
  // The claim at start takes one and sees two more; each finished operation claims the next; the last claim
  // sees nothing more, and its operation finishing claims nothing.
  t.same(
    claims.map((c) => [c.limit, c.rows.length, c.more]),
    [
      [1, 1, true],
      [1, 1, true],
      [1, 1, false],
    ],
  );
});

t.test('a claim that saw a row in its backoff wakes its worker when the row becomes available', async (t) => {
  const e = await dispatchEnv(t, {}, { pollIntervalMs: NO_POLL_MS });
  const claims = claimsHeard(t);
  await e.dispatcher(2);
  await afterStartClaim();
  const later = (await reservedUnannounced(e, ['later'], 2000))[0]!;
  // Woken by this reservation, a claim of limit 2 takes it alone: not full, so nothing would claim again but
  // the poll (a minute away), were it not for the row it saw in its backoff.
  const now = await e.ledger.reserve(ctx('now'), 'issue_refund', { ...REFUND, order_id: 'now' });
  t.equal((await settled(e.pool, now.operation_id, SETTLE_MS)).status, 'succeeded');
  t.equal((await settled(e.pool, later, SETTLE_MS)).status, 'succeeded');
  const taking = claims.filter((c) => c.rows.some((r) => r.operation_id === later));
  t.equal(taking.length, 1, 'claimed once');
  t.equal(claims.length, 3, 'the claim at start, the one the reservation woke, the one the backoff woke');
});

t.test('a row whose backoff ends while every slot is busy is claimed when a slot frees', async (t) => {
  const e = await dispatchEnv(
    t,
    { authorization_http_timeout_seconds: 30, provider_http_timeout_seconds: 30 },
    { pollIntervalMs: NO_POLL_MS },
  );
  await e.dispatcher(1);
  await afterStartClaim();
  const later = (await reservedUnannounced(e, ['later'], 2000))[0]!;
  // The reservation's claim fills the one slot and sees nothing more available; its operation outlasts the
  // backoff (a slow authorization), so the wake-up at the end of the backoff finds no free slot.
  const claims = claimsHeard(t);
  e.authorizer.inject({ kind: 'slow', delayMs: 3500 });
  const busy = await e.ledger.reserve(ctx('busy'), 'issue_refund', { ...REFUND, order_id: 'busy' });
  t.equal((await settled(e.pool, busy.operation_id, SETTLE_MS)).status, 'succeeded');
  t.equal((await settled(e.pool, later, SETTLE_MS)).status, 'succeeded', 'claimed once the slot freed');
  // Each by a claim of its own: the first saw the other still in its backoff (else it would have taken it first).
  t.same(
    claims.filter((c) => c.rows.length > 0).map((c) => c.rows.map((r) => r.operation_id)),
    [[busy.operation_id], [later]],
  );
});

t.test('the claim commits asynchronously, in its own transaction only', async (t) => {
  const e = await dispatchEnv(t);
  const q = bindQueries(dispatcherQueries, e.config.schemaQuoted);
  await e.ledger.reserve(ctx('async-claim'), 'issue_refund', { ...REFUND, order_id: 'o-3' });
  const client = await e.pool.connect();
  t.teardown(() => client.release());
  const setting = async (): Promise<string> =>
    (await client.query<{ s: string }>("SELECT current_setting('synchronous_commit') AS s")).rows[0]!.s;
  t.equal(await setting(), 'on', 'the session commits synchronously');
  await client.query('BEGIN');
  t.equal((await client.query(q.outboxClaimBatch, [10, 'w-async'])).rowCount, 1);
  t.equal(await setting(), 'off', "the claim's transaction commits without waiting for its WAL flush");
  await client.query('ROLLBACK');
  t.equal(await setting(), 'on', 'for that transaction only');
});
