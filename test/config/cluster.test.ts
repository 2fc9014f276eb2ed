import t from 'tap';
import { Writable } from 'node:stream';
import { createLogger } from '../../core/log.js';
import { Metrics } from '../../core/metrics.js';
import { DispatchMetrics } from '../../dispatcher/metrics.js';
import { httpStatus } from '../../server/api/errors.js';
import { count, gateFixture, gctx } from '../helpers/gate.js';
import { testConfig } from '../helpers/db.js';

const URL_ = 'postgres://localhost/unused';
const refund = { order_id: 'O-1', amount: 243.71, currency: 'GBP' };

t.test('the cluster name: from the file or ACTIONLEDGER_CLUSTER; a tenant map needs one', (t) => {
  t.equal(testConfig(URL_).cluster, null, 'none by default');
  t.equal(testConfig(URL_, { cluster: 'eu-1' }).cluster, 'eu-1');
  t.equal(
    testConfig(URL_, { cluster: 'eu-1' }, { ACTIONLEDGER_CLUSTER: 'eu-2' }).cluster,
    'eu-2',
    'the environment wins',
  );
  t.same(
    [...testConfig(URL_, { cluster: 'eu-1', tenant_clusters: { 'tenant-b': 'us-1' } }).tenantClusters],
    [['tenant-b', 'us-1']],
  );
  t.throws(() => testConfig(URL_, { tenant_clusters: { 'tenant-b': 'us-1' } }), {
    code: 'config_invalid',
    details: { issues: [{ path: '/cluster' }] },
  });
  t.throws(() => testConfig(URL_, {}, { ACTIONLEDGER_CLUSTER: 'EU 1' }), {
    code: 'config_invalid',
    details: { issues: [{ path: 'ACTIONLEDGER_CLUSTER' }] },
  });
  t.throws(() => testConfig(URL_, { cluster: 'eu-1', tenant_clusters: { 'tenant-b': 'US_1' } }), {
    code: 'config_invalid',
  });
  t.equal(httpStatus('tenant_wrong_cluster'), 421, 'HTTP 421 Misdirected Request');
  t.end();
});

t.test('every series carries the cluster label, every log line the cluster field', async (t) => {
  const m = new Metrics({ cluster: 'eu-1' });
  DispatchMetrics.on(m.registry).outcomes.inc({ tool: 'issue_refund', provider: 'billing', outcome: 'succeeded' });
  m.reservations.inc({ tool: 'issue_refund', outcome: 'created' });
  await m.readLedger(() =>
    Promise.resolve({
      by_status: { pending: 1 },
      outbox_depth: 1,
      oldest_pending_age_s: 2,
      fleet: { schedule: { queue: 'q', last_completed_at_s: 1 }, workers: [{ worker: 'h:1:a', heartbeat_age_s: 1 }] },
    }),
  );
  const samples = (await m.exposition()).split('\n').filter((l) => l !== '' && !l.startsWith('#'));
  t.ok(samples.length > 20, `${samples.length} samples`);
  for (const s of samples) if (!/cluster="eu-1"/.test(s)) t.fail(`no cluster label: ${s}`);
  t.match(samples.join('\n'), /^actionledger_worker_heartbeat_age_seconds\{worker="h:1:a",cluster="eu-1"\} 1$/m);
  const none = (await new Metrics({ defaultMetrics: false }).exposition()).split('\n');
  t.notOk(
    none.some((l) => l.includes('cluster=')),
    'no cluster named: no label',
  );

  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(chunk.toString());
      done();
    },
  });
  const log = createLogger({ level: 'info', name: 'test', destination: sink, cluster: 'eu-1' });
  log.info({ operation_id: 'x' }, 'one');
  log.child({ worker: 1 }).warn('two');
  await new Promise((r) => setImmediate(r));
  t.equal(lines.length, 2);
  for (const l of lines) t.equal((JSON.parse(l) as { cluster?: string }).cluster, 'eu-1');
});

t.test(
  'a reservation or gate call for a tenant mapped to another cluster is refused, and nothing is written',
  async (t) => {
    const { gate, ledger, pool } = await gateFixture(t, {
      extra: { cluster: 'eu-1', tenant_clusters: { 'tenant-a': 'eu-1', 'tenant-b': 'us-1' } },
    });
    const refused = await gate.call(gctx({ tenant_id: 'tenant-b' }), 'issue_refund', refund);
    t.match(refused, {
      ok: false,
      error: 'tenant_wrong_cluster',
      details: { tenant_id: 'tenant-b', cluster: 'us-1', this_cluster: 'eu-1' },
    });
    t.equal(
      await count(pool, `actionledger.gate_audit WHERE outcome = 'tenant_wrong_cluster'`),
      1,
      'the refusal is audited',
    );
    const ctx = {
      tenant_id: 'tenant-b',
      principal_id: 'svc',
      task_id: 'task-1',
      workflow_step_id: 'step-1',
      approval_id: 'a1',
      policy_version: 'v1',
    };
    await t.rejects(ledger.reserve(ctx, 'issue_refund', refund), {
      code: 'tenant_wrong_cluster',
      details: { cluster: 'us-1' },
    });
    t.equal(await count(pool, 'actionledger.operations'), 0, 'nothing reserved');

    // Its own tenant is served as before, through the gate and directly.
    const own = await gate.call(gctx({ workflow_step_id: 'own' }), 'lookup_order', { order_id: 'O-1' });
    t.not((own as { error?: string }).error, 'tenant_wrong_cluster');
    const direct = await ledger.reserve({ ...ctx, tenant_id: 'tenant-a' }, 'issue_refund', refund);
    t.equal(direct.status, 'pending');
  },
);
