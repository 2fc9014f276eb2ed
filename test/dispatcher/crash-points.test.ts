/**
 * The crash point `after_provider_request_sent` fires when undici has written the provider request (headers
 * and body) to the socket, not on a timer: a real worker process SIGKILLs itself there, the provider has the
 * request, and the row stays `executing` for the reconciler.
 */
import t, { type Test } from 'tap';
import { spawn } from 'node:child_process';
import { postJson, type HttpOutcome } from '../../transport/http-client.js';
import { onRequestSent } from '../../core/request-sent.js';
import { BIN } from '../helpers/cli.js';
import { ctx, dispatchEnv, type DispatchEnv } from '../helpers/fleet.js';
import { startProvider, testAgent, testPki } from '../helpers/sandbox.js';
import { nodeCommand } from '../helpers/node-child.js';

const body = JSON.stringify({ order_id: 'ord-1', amount: 1000, currency: 'EUR' });
const call = (key: string) => ({ headers: { 'Idempotency-Key': key }, body, timeoutMs: 3_000, maxBytes: 64 * 1024 });

async function until(cond: () => boolean, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
  return true;
}

t.test(
  'onRequestSent: fires once the matching request is written, before any response; never for another request or one not sent',
  async (t) => {
    const provider = await startProvider(t);
    const agent = await testAgent(t);
    provider.inject({ kind: 'timeout' }, { when: (k) => k === 'held', times: Infinity });
    const events: string[] = [];
    const stop = onRequestSent({ url: provider.endpoint, headerName: 'idempotency-key', headerValue: 'held' }, () => {
      events.push(`sent (provider has ${provider.requestsFor('held')})`);
    });
    t.teardown(stop);

    const other = await postJson(agent, provider.endpoint, call('other'));
    t.equal(other.kind, 'response', 'another key on the same URL is answered');
    t.same(events, [], 'and does not match');

    const held = postJson(agent, provider.endpoint, call('held')).then((o: HttpOutcome) => {
      events.push(`settled ${o.kind}`);
      return o;
    });
    t.ok(await until(() => events.length > 0, 5_000), 'fired');
    t.same(events, ['sent (provider has 0)'], 'fired before the provider answered (it holds this request)');
    t.ok(await until(() => provider.requestsFor('held') === 1, 5_000), 'and the request reached the provider');
    t.equal((await held).kind, 'unknown', 'the held request then times out');
    t.same(events, ['sent (provider has 0)', 'settled unknown'], 'fired once');

    // A request refused during the TLS handshake (a client certificate from another CA) is never written.
    const p = await testPki();
    const intruder = await testAgent(t, p.otherClient);
    let fired = 0;
    const stop2 = onRequestSent(
      { url: provider.endpoint, headerName: 'Idempotency-Key', headerValue: 'refused' },
      () => fired++,
    );
    const refused = await postJson(intruder, provider.endpoint, call('refused'));
    stop2();
    t.equal(refused.kind, 'not_sent');
    t.equal(fired, 0, 'not fired for a request that was not sent');
    t.equal(provider.requestsFor('refused'), 0);

    // After stop(), nothing fires.
    let late = 0;
    onRequestSent({ url: provider.endpoint, headerName: 'Idempotency-Key', headerValue: 'late' }, () => late++)();
    t.equal((await postJson(agent, provider.endpoint, call('late'))).kind, 'response');
    t.equal(late, 0, 'not fired after stop');
  },
);

interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stderr: string;
}

/** Runs one `actionledger dispatcher` process armed at `crashAt` until it exits (SIGKILLed after 30 s at most). */
async function crashingWorker(t: Test, e: DispatchEnv, crashAt: string, concurrency = 1): Promise<Exit> {
  const env = {
    PATH: process.env.PATH,
    ...e.env,
    ACTIONLEDGER_CRASH_POINTS_ENABLED: '1',
    ACTIONLEDGER_CRASH_AT: crashAt,
  };
  const child = spawn(...nodeCommand([BIN, 'dispatcher', '--concurrency', String(concurrency)]), {
    env,
    stdio: ['ignore', 'ignore', 'pipe'],
  });
  let stderr = '';
  child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
  const timer = setTimeout(() => {
    t.fail(`the worker did not crash at ${crashAt} within 30 s`);
    child.kill('SIGKILL');
  }, 30_000);
  return new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stderr });
    });
  });
}

async function row(e: DispatchEnv, id: string): Promise<{ status: string; claim_token: string | null }> {
  const { rows } = await e.pool.query<{ status: string; claim_token: string | null }>(
    'SELECT status, claim_token FROM actionledger.operations WHERE operation_id = $1',
    [id],
  );
  return rows[0] ?? { status: 'missing', claim_token: null };
}

t.test(
  'a worker crashing at after_provider_request_sent: the provider has the request, the row stays executing',
  async (t) => {
    const e = await dispatchEnv(t, { provider_http_timeout_seconds: 30 });
    const r = await e.ledger.reserve(ctx('crash-sent'), 'issue_refund', {
      order_id: 'o-c',
      amount: 7,
      currency: 'EUR',
    });
    // The provider never answers this key: a crash can only come from the request being written, not a response.
    e.provider.inject({ kind: 'timeout' }, { when: (k) => k === r.effect_key, times: Infinity });
    const exit = await crashingWorker(t, e, 'after_provider_request_sent');
    t.equal(exit.signal, 'SIGKILL', 'the worker killed itself at the crash point');
    t.ok(await until(() => e.provider.requestsFor(r.effect_key) > 0, 5_000), 'the request reached the provider');
    t.equal(e.provider.requestsFor(r.effect_key), 1, 'exactly once');
    const req = e.provider.requests().find((q) => q.key === r.effect_key);
    t.equal(
      req?.body,
      JSON.stringify({ amount: 7, currency: 'EUR', order_id: 'o-c' }),
      'headers and the whole body arrived',
    );
    const now = await row(e, r.operation_id);
    t.equal(now.status, 'executing', 'left executing for the reconciler');
    t.not(now.claim_token, null);
    const ev = await e.pool.query('SELECT 1 FROM actionledger.authorization_evidence WHERE operation_id = $1', [
      r.operation_id,
    ]);
    t.equal(ev.rowCount, 1, 'evidence was recorded before the call');
    const hist = await e.pool.query<{ to_status: string }>(
      'SELECT to_status FROM actionledger.operation_history WHERE operation_id = $1 ORDER BY id',
      [r.operation_id],
    );
    t.same(
      hist.rows.map((h) => h.to_status),
      ['pending', 'executing'],
      'no outcome written',
    );
  },
);

t.test('after_provider_request_sent:2 crashes at the second provider request, after the first completed', async (t) => {
  const e = await dispatchEnv(t, { provider_http_timeout_seconds: 30 });
  const a = await e.ledger.reserve(ctx('crash-n-1'), 'issue_refund', { order_id: 'o-1', amount: 1, currency: 'EUR' });
  const b = await e.ledger.reserve(ctx('crash-n-2'), 'issue_refund', { order_id: 'o-2', amount: 2, currency: 'EUR' });
  const exit = await crashingWorker(t, e, 'after_provider_request_sent:2', 1);
  t.equal(exit.signal, 'SIGKILL');
  t.ok(
    await until(() => e.provider.requestsFor(a.effect_key) + e.provider.requestsFor(b.effect_key) === 2, 5_000),
    'both requests reached the provider',
  );
  const states = [(await row(e, a.operation_id)).status, (await row(e, b.operation_id)).status].sort();
  t.same(states, ['executing', 'succeeded'], 'the first finished; the second was cut off after it was sent');
  t.equal(e.provider.requestsFor(a.effect_key), 1);
  t.equal(e.provider.requestsFor(b.effect_key), 1);
});
