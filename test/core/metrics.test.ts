import t from 'tap';
import { Metrics } from '../../core/metrics.js';
import { createPool } from '../../core/db.js';
import { LedgerView } from '../../ledger/index.js';
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
