/**
 * Self-healing must never turn "not yet" into "never": a worker killed with its request still inside a slow
 * provider leaves an orphaned claim that the orphan watch reconciles at once, and a readback then finds no effect
 * yet. Taken as proof, a review policy would send the operation again and a provider that does not honour the
 * Idempotency-Key would apply it twice. The same holds for a request its client gave up on at the timeout and
 * the provider commits a moment later. The reconciler trusts "no effect" only twice the provider timeout (and a
 * margin) after the operation entered `unknown` or the claim was found; until then it stays `unknown`. Both
 * cases end with two effects when "no effect" is trusted a timeout sooner. And a fleet's parent marks stopped only the
 * worker it saw exit, by its id: another fleet's live worker with the same host name and pid is never touched.
 * Real parts: PostgreSQL, the sandbox provider and authorizer over mTLS, a dispatcher process SIGKILLed at a
 * named crash point.
 */
import t from 'tap';
import { spawn } from 'node:child_process';
import { Readable } from 'node:stream';
import type { IncomingMessage } from 'node:http';
import type { TLSSocket } from 'node:tls';
import { createLogger } from '../../core/log.js';
import { OrphanWatch } from '../../reconciler/index.js';
import { BIN } from '../helpers/cli.js';
import { ctx, dispatchEnv, patchProvider, settled, type DispatchEnv } from '../helpers/fleet.js';
import { nodeCommand } from '../helpers/node-child.js';

const silent = createLogger({ level: 'silent', name: 'attack' });

function noEffectPolicy(): Record<string, unknown> {
  return {
    name: 'retry-no-effect',
    tools: ['issue_refund'],
    reasons: ['no_effect_confirmed'],
    max_retries: 2,
    authorized_by: 'alice@example.com',
    authorized_at: '2026-12-01',
    note: 'readback proves no refund was made: dispatch again',
  };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function until(cond: () => Promise<boolean> | boolean, timeoutMs: number, what: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await cond())) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await sleep(25);
  }
}

/**
 * A provider that takes `delayMs` to process a POST (it has the whole request, then commits the effect): what any
 * real provider does for some of its requests. The readback (GET) answers at once from what is committed.
 */
function slowProvider(e: DispatchEnv, delayMs: number): { arrived: number } {
  const seen = { arrived: 0 };
  patchProvider(e.provider, (orig) => async (req, res) => {
    if (req.method !== 'POST') return orig(req, res);
    const chunks: Buffer[] = [];
    for await (const c of req as AsyncIterable<Buffer>) chunks.push(c);
    seen.arrived++;
    const cert = (req.socket as TLSSocket).getPeerCertificate();
    await sleep(delayMs);
    // The request as it arrived, replayed into the provider's own handler once "processing" is done (the client
    // may be gone by then: its connection is not needed to commit).
    const copy = Object.assign(Readable.from([Buffer.concat(chunks)]), {
      method: req.method,
      url: req.url,
      headers: req.headers,
      socket: { getPeerCertificate: () => cert },
    }) as unknown as IncomingMessage;
    return orig(copy, res);
  });
  return seen;
}

/** One `actionledger dispatcher` process armed to SIGKILL itself at `crashAt`; its pid and its exit. */
function crashingWorker(e: DispatchEnv, crashAt: string): { pid: number; exited: Promise<string | null> } {
  const child = spawn(...nodeCommand([BIN, 'dispatcher', '--concurrency', '1']), {
    env: { PATH: process.env.PATH, ...e.env, ACTIONLEDGER_CRASH_POINTS_ENABLED: '1', ACTIONLEDGER_CRASH_AT: crashAt },
    stdio: ['ignore', 'ignore', 'ignore'],
  });
  return { pid: child.pid!, exited: new Promise((resolve) => child.once('exit', (_code, signal) => resolve(signal))) };
}

async function history(e: DispatchEnv, id: string): Promise<{ to_status: string; reason: string }[]> {
  const { rows } = await e.pool.query<{ to_status: string; reason: string }>(
    'SELECT to_status, reason FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id',
    [id],
  );
  return rows;
}

t.test(
  'a worker dies with its request inside a slow provider: "no effect" at once is not proof; the operation waits, then is found applied',
  async (t) => {
    // The chaos provider: it does not honour the Idempotency-Key, so a second request is a second effect.
    const e = await dispatchEnv(
      t,
      { provider_http_timeout_seconds: 3 },
      { honorIdempotencyKey: false, extra: { review_policies: [noEffectPolicy()] } },
    );
    const slow = slowProvider(e, 2_000);
    const r = await e.ledger.reserve(ctx('died-mid-request'), 'issue_refund', {
      order_id: 'o-f1',
      amount: 100,
      currency: 'EUR',
    });
    // The worker writes the request, then dies (OOM kill, deploy, node crash) before any answer.
    const w = crashingWorker(e, 'after_provider_request_sent');
    t.equal(await w.exited, 'SIGKILL');
    await until(() => slow.arrived === 1, 5_000, 'the whole request at the provider (processing it)');

    // What the fleet's parent does when it sees its worker exit (bin/service.ts -> OrphanWatch.workerExited).
    const crashedAt = Date.now();
    const kit = await e.reconciler();
    const watch = new OrphanWatch({ config: e.config, pool: e.pool, log: silent, pass: () => kit.pass() });
    await watch.start();
    t.teardown(() => watch.stop());
    const { rows: ws } = await e.pool.query<{ pid: number }>('SELECT pid FROM actionledger.workers');
    t.same(
      ws.map((x) => x.pid),
      [w.pid],
      'the dead worker is the only one registered',
    );
    const { rows: ids } = await e.pool.query<{ worker_id: string }>('SELECT worker_id FROM actionledger.workers');
    watch.workerExited(ids[0]!.worker_id);
    await until(
      async () =>
        (
          await e.pool.query(
            "SELECT 1 FROM actionledger.operations WHERE operation_id = $1 AND status <> 'executing'",
            [r.operation_id],
          )
        ).rowCount === 1,
      5_000,
      'the orphan watch to resolve the claim',
    );
    const h = await history(e, r.operation_id);
    const trail = `${Date.now() - crashedAt} ms after the crash: ${h.map((x) => `${x.to_status}:${x.reason}`).join(', ')}`;
    // The request is still being processed: the readback's "no effect" is only "not yet".
    t.equal(e.provider.effectsFor(r.effect_key), 0, `at the readback the provider had not committed yet (${trail})`);
    t.match(
      h.at(-1),
      { to_status: 'unknown', reason: 'reconcile:no_effect_unsettled' },
      `unknown, not no_effect_confirmed: nothing for a policy to retry (${trail})`,
    );

    // The provider commits; once the provider timeout (3 s) and the margin have passed, a pass reads it back.
    await until(() => e.provider.effectsFor(r.effect_key) === 1, 5_000, 'the first request to commit');
    await until(
      async () => {
        await kit.pass();
        return (await settled(e.pool, r.operation_id, 1_000)).status !== 'unknown';
      },
      15_000,
      'a pass after the in-flight window',
    );
    const end = await settled(e.pool, r.operation_id);
    const all = await history(e, r.operation_id);
    t.equal(end.status, 'succeeded', `read back applied (${all.map((x) => `${x.to_status}:${x.reason}`).join(', ')})`);
    t.equal(slow.arrived, 1, 'invariant 1: one provider request per effect key');
    t.equal(e.provider.effectsFor(r.effect_key), 1, 'invariant 1: one effect');
    t.notOk(
      all.some((x) => x.reason === 'review:retry' || x.to_status === 'needs_review'),
      'never in review, never retried',
    );
  },
);

t.test(
  'a request its client gave up on, committed by the provider a little later: "no effect" before then is not proof',
  async (t) => {
    // A 1 s provider timeout; the provider commits 2.3 s after it has the request, so after the client gave up,
    // and it does not honour the key. Passes run every 200 ms with a policy that retries what has no effect.
    const e = await dispatchEnv(
      t,
      { provider_http_timeout_seconds: 1 },
      { honorIdempotencyKey: false, extra: { review_policies: [noEffectPolicy()] } },
    );
    const slow = slowProvider(e, 2_300);
    const r = await e.ledger.reserve(ctx('timed-out'), 'issue_refund', {
      order_id: 'o-t1',
      amount: 100,
      currency: 'EUR',
    });
    await e.dispatcher(1);
    const kit = await e.reconciler();
    const deadline = Date.now() + 20_000;
    for (;;) {
      await kit.pass();
      const { status } = await settled(e.pool, r.operation_id, 1_000).catch(() => ({ status: 'executing' }));
      if (status === 'succeeded' || status === 'needs_review' || status === 'failed') break;
      if (Date.now() > deadline) throw new Error(`operation ${r.operation_id} still ${status}`);
      await sleep(200);
    }
    await sleep(3_000); // any second request's processing ends
    const all = await history(e, r.operation_id);
    const trail = all.map((x) => `${x.to_status}:${x.reason}`).join(', ');
    t.equal((await settled(e.pool, r.operation_id)).status, 'succeeded', `read back applied (${trail})`);
    t.equal(slow.arrived, 1, 'one provider request');
    t.equal(e.provider.effectsFor(r.effect_key), 1, 'invariant 1: one effect');
    t.notOk(
      all.some((x) => x.reason === 'review:retry'),
      'never retried',
    );
  },
);

t.test(
  "another fleet's parent, whose exited worker had this host name and pid, never stops a live worker",
  async (t) => {
    const e = await dispatchEnv(t, {}, { dispatcher: { release_limit: 1 } });
    const d = await e.dispatcher(2);
    await until(
      async () =>
        (await e.pool.query('SELECT 1 FROM actionledger.workers WHERE worker_id = $1', [d.workerId])).rowCount === 1,
      5_000,
      'the worker row',
    );
    const kit = await e.reconciler();
    const watch = new OrphanWatch({ config: e.config, pool: e.pool, log: silent, pass: () => kit.pass() });
    await watch.start();
    t.teardown(() => watch.stop());
    // Fleet B (another container with the same host name, its own pid namespace) saw ITS worker with this pid
    // exit. Marked by host and pid, this live worker would be stopped for good (a heartbeat never clears
    // stopped_at) and every claim it made released as worker_lost, then reviewed.
    await e.pool.query(
      "INSERT INTO actionledger.workers (worker_id, pid, host, claim_tokens, claims_listed_at) SELECT $1, pid, host, '{}', now() FROM actionledger.workers WHERE worker_id = $2",
      ['fleet-b-worker', d.workerId],
    );
    watch.workerExited('fleet-b-worker');
    await sleep(1_500); // three heartbeats of the live worker
    const { rows } = await e.pool.query<{ stopped: boolean }>(
      'SELECT stopped_at IS NOT NULL AS stopped FROM actionledger.workers WHERE worker_id = $1',
      [d.workerId],
    );
    t.equal(rows[0]?.stopped, false, 'a live, heartbeating worker is not stopped');

    // Every claim of the live worker is now an orphan: with a decision that takes a moment, the reconciler takes
    // it before its evidence, again and again, until the operation is in review for a worker that was never lost.
    e.authorizer.inject({ kind: 'slow', delayMs: 1_500 }, { times: Infinity });
    const r = await e.ledger.reserve(ctx('live-but-stopped'), 'issue_refund', {
      order_id: 'o-f2',
      amount: 100,
      currency: 'EUR',
    });
    const end = await settled(e.pool, r.operation_id, 20_000);
    const h = await history(e, r.operation_id);
    t.comment(JSON.stringify(h.map((x) => `${x.to_status}:${x.reason}`)));
    t.equal(end.status, 'succeeded', 'a live worker completes what it claimed');
    t.notOk(
      h.some((x) => x.reason === 'released:worker_lost'),
      'no claim of a live worker is released as worker_lost',
    );
  },
);
