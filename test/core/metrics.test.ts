import t from 'tap';
import { Metrics } from '../../core/metrics.js';
import { createPool } from '../../db/db.js';
import { readGateStatus } from '../../gate/index.js';
import { LedgerView } from '../../ledger/index.js';
import { gateFixture, gctx } from '../helpers/gate.js';
import { createTestDatabase } from '../helpers/db.js';
import { freePort } from '../helpers/net.js';

t.test(
  'ledger gauges: read from PostgreSQL at scrape time, absent (database_up 0) while it cannot be read',
  async (t) => {
    const url = await createTestDatabase(t);
    const pool = createPool(url, { max: 2, statementTimeoutMs: 5_000, applicationName: 'metrics-test' });
    t.teardown(() => pool.end());
    const deadUrl = new URL(url);
    deadUrl.port = String(await freePort()); // nothing listens there: refused, as when PostgreSQL is down
    const dead = createPool(deadUrl.toString(), { max: 1, statementTimeoutMs: 5_000, applicationName: 'metrics-test' });
    t.teardown(() => dead.end());
    const m = new Metrics({ defaultMetrics: false });

    const before = await m.exposition();
    t.notMatch(before, /^actionledger_outbox_depth /m, 'never read: no ledger gauge at all, not a zero');

    await m.readLedger(() => new LedgerView(pool, '"actionledger"').status());
    const up = await m.exposition();
    t.match(up, /^actionledger_database_up 1$/m);
    t.match(up, /^actionledger_outbox_depth 0$/m);
    t.match(up, /^actionledger_operations\{status="pending"\} 0$/m);
    t.match(up, /^actionledger_outbox_oldest_age_seconds 0$/m);

    await t.rejects(
      m.readLedger(() => new LedgerView(dead, '"actionledger"').status()),
      /ECONNREFUSED|connect/,
    );
    const down = await m.exposition();
    t.match(down, /^actionledger_database_up 0$/m);
    for (const name of [
      'actionledger_outbox_depth',
      'actionledger_outbox_oldest_age_seconds',
      'actionledger_operations',
    ])
      t.notMatch(down, new RegExp(`^${name}[ {]`, 'm'), `${name} is absent, not its last value`);

    await m.readLedger(() => new LedgerView(pool, '"actionledger"').status());
    t.match(await m.exposition(), /^actionledger_outbox_depth 0$/m, 'back when the database answers again');
  },
);

t.test('a dispatcher worker (ledger: false) exposes no ledger gauge and no database_up', async (t) => {
  const m = new Metrics({ defaultMetrics: false, ledger: false });
  await m.readLedger(() => Promise.resolve({ by_status: { pending: 3 }, outbox_depth: 3, oldest_pending_age_s: 1 }));
  t.notMatch(await m.exposition(), /actionledger_(outbox_depth|database_up|operations)/);
});

t.test(
  'gate gauges: pending approvals, overdue ones, open proposals and holds, kill switches and their age',
  async (t) => {
    // A per-conversation cap above the approval threshold, so a refund over it waits for a person.
    const f = await gateFixture(t, {
      gate: { tools: { issue_refund: { limits: { per_conversation: { max_count: 3, max_value: 5000 } } } } },
    });
    const m = new Metrics({ defaultMetrics: false });
    const read = async () => {
      await m.readLedger(async () => ({
        ...(await new LedgerView(f.pool, '"actionledger"').status()),
        gate: await readGateStatus(f.pool, '"actionledger"'),
      }));
      return m.exposition();
    };
    t.match(await read(), /^actionledger_gate_approvals_pending 0$/m);

    const held = await f.gate.call(gctx({ task_id: 'm-1' }), 'issue_refund', {
      order_id: 'O-1',
      amount: 900,
      currency: 'GBP',
    });
    t.match(held, { ok: false, error: 'approval_required' });
    const proposed = await f.gate.call(gctx({ task_id: 'm-2' }), 'send_email', {
      to: 'a@b.c',
      subject: 's',
      body: 'b',
    });
    t.match(proposed, { ok: false, error: 'confirmation_required' });
    await f.gate.engageKillSwitch('tenant-a', 'transfer_funds', 'ops', 'drill');
    await f.pool.query("UPDATE actionledger.gate_kill_switches SET engaged_at = now() - interval '3 hours'");
    const up = await read();
    t.match(up, /^actionledger_gate_approvals_pending 1$/m);
    t.match(up, /^actionledger_gate_approvals_overdue 0$/m);
    t.match(up, /^actionledger_gate_proposals_open 1$/m);
    t.match(up, /^actionledger_gate_cap_holds_open [1-9]/m, 'the approval holds its share of the cap');
    t.match(up, /^actionledger_gate_kill_switches_engaged 1$/m);
    const age = Number(/^actionledger_gate_oldest_kill_switch_age_seconds (\S+)$/m.exec(up)?.[1]);
    t.ok(age >= 3 * 3600 && age < 3 * 3600 + 600, `the oldest switch is three hours old (${age} s)`);

    await f.pool.query(
      "UPDATE actionledger.gate_approvals SET expires_at = now(), created_at = now() - interval '1 hour'",
    );
    t.match(
      await read(),
      /^actionledger_gate_approvals_overdue 1$/m,
      'past its TTL and not yet expired by housekeeping',
    );
  },
);
