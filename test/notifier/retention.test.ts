/**
 * What the outbox keeps: events and deliveries are removed once they are older than the retention period and
 * none of their deliveries is pending; a pending one is kept, unless its destination is in no configuration
 * (then it is ended as failed, audited, and removed with its event); a process whose configuration names no
 * destination writes no events at all. Age is set by moving rows' timestamps back, never by waiting.
 */
import { randomBytes } from 'node:crypto';
import t, { type Test } from 'tap';
import { AuditWriter } from '../../gate/index.js';
import { compileConfig } from '../../config/index.js';
import { createPool } from '../../db/db.js';
import { createLogger } from '../../core/log.js';
import { NotificationDelivery } from '../../notifier/index.js';
import { auditRows, count, gateFixture, gateRoutes, gateSection, gctx, type GateFixture } from '../helpers/gate.js';
import { receiverPki, WebhookReceiver } from '../helpers/notify-receivers.js';

const SECRET = `whsec_${randomBytes(32).toString('base64')}`;

async function setup(
  t: Test,
  retentionDays?: number,
): Promise<{ g: GateFixture; receiver: WebhookReceiver; delivery: NotificationDelivery }> {
  const pki = await receiverPki();
  const receiver = await new WebhookReceiver(pki, [SECRET]).start(t);
  const g = await gateFixture(t, {
    extra: {
      notifications: {
        destinations: {
          ops: {
            type: 'webhook',
            url: `${receiver.url}/hooks`,
            secret_envs: ['WH'],
            ca_file: pki.paths.caCert,
            allow_private_network: true, // the receiver listens on loopback
          },
        },
        routes: [{ destinations: ['ops'] }],
        delivery: {
          backoff_initial_ms: 10,
          backoff_max_ms: 20,
          timeout_ms: 2000,
          lease_ms: 3000,
          ...(retentionDays === undefined ? {} : { retention_days: retentionDays }),
        },
      },
    },
  });
  const log = createLogger({ level: 'silent', name: 'retention' });
  const delivery = new NotificationDelivery({
    config: g.config,
    pool: g.pool,
    audit: new AuditWriter({ config: g.config, pool: g.pool, log }),
    log,
    env: { WH: SECRET },
  });
  t.teardown(() => delivery.stop());
  return { g, receiver, delivery };
}

async function requestApproval(g: GateFixture, step: string): Promise<string> {
  const held = await g.gate.call(
    gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: step }),
    'update_document',
    { document_id: 'DOC-1', status: 'published' },
  );
  if (held.ok || held.request_id === undefined) throw new Error(JSON.stringify(held));
  return held.request_id;
}

async function drain(g: GateFixture, delivery: NotificationDelivery): Promise<void> {
  for (let i = 0; i < 200; i++) {
    await delivery.tick();
    const pending =
      (await count(g.pool, "actionledger.notification_deliveries WHERE status = 'pending'")) +
      (await count(g.pool, 'actionledger.notification_events WHERE fanned_out_at IS NULL'));
    if (pending === 0) return;
    await new Promise((r) => setTimeout(r, 15));
  }
  throw new Error('deliveries still pending');
}

/** Moves the events of these approvals (and their deliveries' ends) `days` into the past. */
async function age(g: GateFixture, approvalIds: string[], days: number): Promise<void> {
  await g.pool.query(
    `UPDATE actionledger.notification_events SET created_at = created_at - make_interval(days => $2)
     WHERE subject_id = ANY($1)`,
    [approvalIds, days],
  );
  await g.pool.query(
    `UPDATE actionledger.notification_deliveries d SET ended_at = ended_at - make_interval(days => $2)
     FROM actionledger.notification_events e WHERE e.event_id = d.event_id AND e.subject_id = ANY($1)`,
    [approvalIds, days],
  );
}

async function eventsOf(g: GateFixture, approvalId: string): Promise<number> {
  return count(g.pool, 'actionledger.notification_events WHERE subject_id = $1', [approvalId]);
}

t.test('the retention period defaults to 7 days and can be set', (t) => {
  const base = { tools: gateRoutes(), gate: gateSection() };
  t.equal(compileConfig(base, {}).notifications.delivery.retentionDays, 7);
  t.equal(
    compileConfig({ ...base, notifications: { delivery: { retention_days: 30 } } }, {}).notifications.delivery
      .retentionDays,
    30,
  );
  t.throws(() => compileConfig({ ...base, notifications: { delivery: { retention_days: 0 } } }, {}), {
    code: 'config_invalid',
  });
  t.end();
});

t.test('delivered events older than the retention period are removed with their deliveries', async (t) => {
  const { g, delivery } = await setup(t);
  const old = await requestApproval(g, 'old-1');
  const young = await requestApproval(g, 'young-1');
  await drain(g, delivery);
  t.equal(await count(g.pool, "actionledger.notification_deliveries WHERE status = 'delivered'"), 2);

  t.equal(await delivery.prune(), 0, 'nothing is old enough yet');
  await age(g, [old], 8);
  await age(g, [young], 6);
  t.equal(await delivery.prune(), 1, 'one event is past 7 days');
  t.equal(await eventsOf(g, old), 0, 'the old event is gone');
  t.equal(await eventsOf(g, young), 1, 'the younger one is kept');
  t.equal(await count(g.pool, 'actionledger.notification_deliveries'), 1, 'and only its delivery is left');
});

t.test('an old event with a pending delivery to a configured destination is kept', async (t) => {
  const { g, receiver, delivery } = await setup(t, 1);
  receiver.failFirst = 1;
  const id = await requestApproval(g, 'pending-1');
  await delivery.tick(); // routed, first attempt refused: a retry is pending
  await age(g, [id], 2);
  t.equal(await delivery.prune(), 0, 'a delivery still to be attempted keeps its event');
  t.equal(await eventsOf(g, id), 1);
  await drain(g, delivery);
  t.equal(receiver.accepted().size, 1, 'and it is delivered');
  t.equal(await delivery.prune(), 1, 'then removed');
});

t.test('an old delivery to a destination no configuration names ends as failed and is removed', async (t) => {
  const { g, delivery } = await setup(t);
  const id = await requestApproval(g, 'gone-1');
  await drain(g, delivery);
  await g.pool.query(
    `INSERT INTO actionledger.notification_deliveries (event_id, destination)
     SELECT event_id, 'retired' FROM actionledger.notification_events WHERE subject_id = $1`,
    [id],
  );
  await delivery.tick();
  t.equal(
    await count(g.pool, "actionledger.notification_deliveries WHERE destination = 'retired' AND status = 'pending'"),
    1,
    'a young delivery to an unknown destination is left for a worker that knows it',
  );
  await age(g, [id], 8);
  t.equal(await delivery.prune(), 1, 'once old, its event is removed');
  t.equal(await eventsOf(g, id), 0);
  const ended = await auditRows(g.pool, "action = 'notification' AND outcome = 'failed'");
  t.match(
    ended.map((r) => r.detail),
    [{ destination: 'retired', error: 'destination_removed' }],
    'its end is audited',
  );
});

t.test('a process whose configuration names no destination writes no events', async (t) => {
  const g = await gateFixture(t);
  const off = createPool(g.url, {
    max: 1,
    statementTimeoutMs: 30_000,
    applicationName: 'test-off',
    notifications: false,
  });
  t.teardown(() => off.end());
  await off.query(
    "INSERT INTO actionledger.gate_kill_switches (tenant_id, tool_name, engaged_by, reason) VALUES ('tenant-a', '*', 'op', 'x')",
  );
  t.equal(await count(g.pool, 'actionledger.notification_events'), 0, 'no event from a session with notifications off');
  await g.pool.query("DELETE FROM actionledger.gate_kill_switches WHERE tenant_id = 'tenant-a'");
  t.equal(await count(g.pool, 'actionledger.notification_events'), 1, 'a session without the setting writes them');
});
