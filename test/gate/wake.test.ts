/**
 * The gate reserves without a NOTIFY inside its transaction (PostgreSQL serializes the commits of transactions
 * that NOTIFY) and wakes the dispatchers once the decision has committed: a reservation through the gate is
 * heard on the outbox channel, a refusal is not, and a direct reservation over the API wakes them too.
 */
import t from 'tap';
import pg from 'pg';
import { apiFixture } from '../helpers/api.js';
import { gctx } from '../helpers/gate.js';

const TRANSFER = { to_account: 'ACC0000000002', amount: 25 };

t.test('a reservation through the gate or a direct one over the API wakes the dispatchers after commit', async (t) => {
  const f = await apiFixture(t);
  const listener = new pg.Client({ connectionString: f.url });
  await listener.connect();
  t.teardown(() => listener.end());
  const heard: string[] = [];
  listener.on('notification', (n) => heard.push(n.channel));
  await listener.query('LISTEN actionledger_outbox');
  const settle = () => new Promise((r) => setTimeout(r, 300));
  /** Waits (up to 10 s) until `n` wake-ups were heard, then long enough for an extra one to show. */
  const hear = async (n: number) => {
    for (const deadline = Date.now() + 10_000; heard.length < n && Date.now() < deadline;)
      await new Promise((r) => setTimeout(r, 10));
    await settle();
  };

  const refused = await f.gate.call(gctx({ task_id: 'w-0' }), 'transfer_funds', { to_account: 'nope' });
  t.match(refused, { ok: false, error: 'invalid_arguments' });
  await settle();
  t.same(heard, [], 'a refusal wakes nobody');

  const reserved = await f.gate.call(gctx({ task_id: 'w-1' }), 'transfer_funds', TRANSFER);
  t.match(reserved, { ok: true, status: 'reserved', created: true });
  await hear(1);
  t.same(heard, ['actionledger_outbox'], 'woken once the call committed');

  const svc = await f.token('svc-1', ['service']);
  const direct = await f.call('POST', '/v1/operations', {
    token: svc,
    body: {
      tool: 'transfer_funds',
      arguments: TRANSFER,
      task_id: 'w-2',
      workflow_step_id: 's-1',
      approval_id: 'a-1',
      policy_version: 'v-1',
    },
  });
  t.match(direct.body, { ok: true, created: true });
  await hear(2);
  t.same(heard, ['actionledger_outbox', 'actionledger_outbox'], 'and once the direct reservation committed');
});
