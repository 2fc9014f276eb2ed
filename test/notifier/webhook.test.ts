/**
 * Signed webhooks through the notification outbox, received by a real HTTPS receiver that verifies every
 * request with the reference `standardwebhooks` library: the signature verifies under both secrets of a
 * rotation, the timestamp is checked, a receiver that fails twice gets the same webhook-id three times and
 * keeps one event, the body shows the envelope as the console does (redacted), attempts end in `failed` with
 * an audit row once spent, and routing by tenant and tool holds.
 */
import { randomBytes } from 'node:crypto';
import t, { type Test } from 'tap';
import { Registry } from 'prom-client';
import { Webhook } from 'standardwebhooks';
import { AuditWriter } from '../../gate/index.js';
import { createLogger } from '../../core/log.js';
import { NotificationDelivery } from '../../notifier/index.js';
import { auditRows, count, gateFixture, gctx, type GateFixture } from '../helpers/gate.js';
import { receiverPki, WebhookReceiver } from '../helpers/notify-receivers.js';

const secret = (): string => `whsec_${randomBytes(32).toString('base64')}`;
const NEW = secret();
const OLD = secret();
const ENV = { WH_NEW: NEW, WH_OLD: OLD };

async function setup(
  t: Test,
  over: {
    routes?: unknown[];
    delivery?: Record<string, unknown>;
    receiverSecrets?: string[];
    strangerCa?: boolean;
  } = {},
): Promise<{ g: GateFixture; receiver: WebhookReceiver; delivery: NotificationDelivery; registry: Registry }> {
  const pki = await receiverPki();
  const receiver = await new WebhookReceiver(
    over.strangerCa === true ? await receiverPki() : pki,
    over.receiverSecrets ?? [NEW, OLD],
  ).start(t);
  const g = await gateFixture(t, {
    gate: { tools: { update_document: { redact: ['status'] } } },
    extra: {
      notifications: {
        destinations: {
          ops: {
            type: 'webhook',
            url: `${receiver.url}/hooks`,
            secret_envs: ['WH_NEW', 'WH_OLD'],
            ca_file: pki.paths.caCert,
            allow_private_network: true, // the receiver listens on loopback
          },
        },
        routes: over.routes ?? [{ destinations: ['ops'], tenants: ['tenant-a'] }],
        delivery: { backoff_initial_ms: 10, backoff_max_ms: 20, timeout_ms: 2000, lease_ms: 3000, ...over.delivery },
      },
    },
  });
  const log = createLogger({ level: 'silent', name: 'notify-test' });
  const registry = new Registry();
  const delivery = new NotificationDelivery({
    config: g.config,
    pool: g.pool,
    audit: new AuditWriter({ config: g.config, pool: g.pool, log }),
    log,
    env: ENV,
    registry,
  });
  t.teardown(() => delivery.stop());
  return { g, receiver, delivery, registry };
}

/** Ticks until no delivery is pending (backoff waits included), at most `max` ticks. */
async function drain(g: GateFixture, delivery: NotificationDelivery, max = 200): Promise<void> {
  for (let i = 0; i < max; i++) {
    await delivery.tick();
    const pending =
      (await count(g.pool, "actionledger.notification_deliveries WHERE status = 'pending'")) +
      (await count(g.pool, 'actionledger.notification_events WHERE fanned_out_at IS NULL'));
    if (pending === 0) return;
    await new Promise((r) => setTimeout(r, 15));
  }
  throw new Error('deliveries still pending');
}

async function requestApproval(g: GateFixture, step: string): Promise<string> {
  const held = await g.gate.call(
    gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: step }),
    'update_document',
    {
      document_id: 'DOC-1',
      status: 'published',
    },
  );
  if (held.ok || held.error !== 'approval_required' || held.request_id === undefined)
    throw new Error(JSON.stringify(held));
  return held.request_id;
}

t.test('a receiver failing twice gets one webhook-id three times, every copy signed and in its window', async (t) => {
  const { g, receiver, delivery, registry } = await setup(t);
  receiver.failFirst = 2;
  const approvalId = await requestApproval(g, 'wh-1');
  await drain(g, delivery);

  t.equal(receiver.received.length, 3, 'two failures, then the acceptance');
  const ids = new Set(receiver.received.map((r) => r.id));
  t.equal(ids.size, 1, 'the same webhook-id on every attempt');
  const [event] = (await g.pool.query<{ event_id: string }>('SELECT event_id FROM actionledger.notification_events'))
    .rows;
  t.same([...ids], [event?.event_id], 'the webhook-id is the event id');
  for (const r of receiver.received) {
    t.same(r.verified, [true, true], 'the reference library accepts it under the new and the old secret');
    t.equal(r.signature.split(' ').length, 2, 'two signatures during the rotation');
    t.ok(Math.abs(Number(r.timestamp) - Date.now() / 1000) < 60, 'the timestamp is now');
  }
  const first = receiver.received[0];
  if (first === undefined) throw new Error('nothing received');
  const headers = { 'webhook-id': first.id, 'webhook-signature': first.signature };
  t.throws(
    () => new Webhook(NEW).verify(first.body, { ...headers, 'webhook-timestamp': String(Number(first.timestamp) + 1) }),
    'a changed timestamp breaks the signature',
  );
  t.throws(
    () =>
      new Webhook(NEW).verify(first.body.replace('DOC-1', 'DOC-2'), {
        ...headers,
        'webhook-timestamp': first.timestamp,
      }),
    'a changed body breaks the signature',
  );
  t.throws(
    () => new Webhook(secret()).verify(first.body, { ...headers, 'webhook-timestamp': first.timestamp }),
    'another secret does not verify',
  );

  const kept = receiver.accepted();
  t.equal(kept.size, 1, 'a receiver dropping duplicates by id keeps one event');
  const body = [...kept.values()][0] as { type: string; data: Record<string, unknown> };
  const view = await g.gate.approvals.show(approvalId, { tenant_id: 'tenant-a' });
  t.equal(body.type, 'approval.requested');
  t.equal(body.data.approval_id, approvalId);
  t.equal(body.data.envelope_sha256, view.envelope_sha256, 'the hash the approver must send back');
  t.equal(body.data.requester_id, 'editor-1', 'who asked');
  t.ok(typeof body.data.time_left_s === 'number' && body.data.time_left_s > 0, 'time left');
  const env = body.data.envelope as { arguments: Record<string, unknown>; resources: unknown[] };
  t.same(env.arguments, { document_id: 'DOC-1', status: '[redacted]' }, 'the redacted argument is not sent');
  t.notOk(first.body.includes('published'), 'nowhere in the body');
  t.same(env.resources, [{ type: 'document', id: 'DOC-1', version: '7' }], 'resources with their versions');

  const row = (
    await g.pool.query<{ status: string; attempts: number }>(
      'SELECT status, attempts FROM actionledger.notification_deliveries',
    )
  ).rows[0];
  t.same(row, { status: 'delivered', attempts: 3 });
  const audit = await auditRows(g.pool, "action = 'notification'");
  t.equal(audit.length, 1, 'the delivery is audited once, at its end');
  t.equal(audit[0]?.outcome, 'delivered');
  t.equal(audit[0]?.subject_id, event?.event_id);
  const attempts = await registry.getSingleMetric('actionledger_notification_attempts_total')?.get();
  t.same(
    attempts?.values.map((v) => [v.labels.outcome, v.value]).sort(),
    [
      ['delivered', 1],
      ['retry', 2],
    ],
    'attempts counted by outcome',
  );
});

t.test('decisions, expiries and kill switches are events too; attempts spent end failed and audited', async (t) => {
  const { g, receiver, delivery } = await setup(t, { delivery: { max_attempts: 2 } });
  receiver.finalStatus = 503; // never accepts
  const approvalId = await requestApproval(g, 'wh-2');
  await g.gate.reject(approvalId, { tenant_id: 'tenant-a', principal_id: 'sup-1', role: 'supervisor' }, 'not now');
  await g.gate.engageKillSwitch('tenant-a', 'update_document', 'op-1', 'incident 42');
  await g.gate.liftKillSwitch('tenant-a', 'update_document', 'op-1');
  await drain(g, delivery);
  const types = (
    await g.pool.query<{ event_type: string; status: string; attempts: number }>(
      `SELECT e.event_type, d.status, d.attempts FROM actionledger.notification_events e
       JOIN actionledger.notification_deliveries d USING (event_id) ORDER BY e.created_at, e.event_type`,
    )
  ).rows;
  t.same(types.map((r) => r.event_type).sort(), [
    'approval.decided',
    'approval.requested',
    'kill_switch.engaged',
    'kill_switch.lifted',
  ]);
  t.ok(
    types.every((r) => r.status === 'failed' && r.attempts === 2),
    'each tried max_attempts times, then failed',
  );
  t.equal(receiver.received.length, 8);
  const audit = await auditRows(g.pool, "action = 'notification'");
  t.equal(audit.length, 4);
  t.ok(audit.every((a) => a.outcome === 'failed'));
});

t.test('routes choose by event, tenant and tool', async (t) => {
  const { g, receiver, delivery } = await setup(t, {
    routes: [
      { destinations: ['ops'], events: ['kill_switch.engaged'], tenants: ['tenant-a'], tools: ['issue_refund'] },
    ],
  });
  await requestApproval(g, 'wh-3'); // wrong event type
  await g.gate.engageKillSwitch('tenant-b', 'issue_refund', 'op-1', 'other tenant');
  await g.gate.engageKillSwitch('tenant-a', 'transfer_funds', 'op-1', 'other tool');
  await g.gate.engageKillSwitch('tenant-a', 'issue_refund', 'op-1', 'this one');
  await drain(g, delivery);
  t.equal(await count(g.pool, 'actionledger.notification_events'), 4, 'every change wrote its event');
  t.equal(receiver.received.length, 1, 'one matched the route');
  const body = JSON.parse(receiver.received[0]?.body ?? '{}') as { type: string; data: Record<string, unknown> };
  t.equal(body.type, 'kill_switch.engaged');
  t.equal(body.data.reason, 'this one');
});

t.test('a secret that is missing or too short refuses to start the loop', async (t) => {
  const { g } = await setup(t);
  const log = createLogger({ level: 'silent', name: 'notify-test' });
  const audit = new AuditWriter({ config: g.config, pool: g.pool, log });
  t.throws(() => new NotificationDelivery({ config: g.config, pool: g.pool, audit, log, env: { WH_NEW: NEW } }), {
    code: 'secret_missing',
  });
  t.throws(
    () =>
      new NotificationDelivery({
        config: g.config,
        pool: g.pool,
        audit,
        log,
        env: { WH_NEW: 'whsec_c2hvcnQ=', WH_OLD: OLD },
      }),
    { code: 'config_invalid' },
  );
});

t.test('the client rules of providers: a redirect is never followed, an unknown CA is never trusted', async (t) => {
  const pki = await receiverPki();
  const elsewhere = await new WebhookReceiver(pki, [NEW]).start(t);
  const { g, receiver, delivery } = await setup(t, { delivery: { max_attempts: 2 } });
  receiver.finalStatus = 307;
  receiver.location = `${elsewhere.url}/stolen`;
  await requestApproval(g, 'wh-redirect');
  await drain(g, delivery);
  t.equal(receiver.received.length, 2, 'each attempt went to the configured URL');
  t.equal(elsewhere.received.length, 0, 'the Location was never followed');
  const redirected = (
    await g.pool.query<{ status: string; last_error: string }>(
      'SELECT status, last_error FROM actionledger.notification_deliveries',
    )
  ).rows;
  t.same(redirected, [{ status: 'failed', last_error: 'attempts_spent:unknown:redirect:307' }]);

  const other = await setup(t, { strangerCa: true, delivery: { max_attempts: 2 } });
  await requestApproval(other.g, 'wh-stranger');
  await drain(other.g, other.delivery);
  t.equal(
    other.receiver.received.length,
    0,
    'no request reached a server whose certificate the CA file does not vouch for',
  );
  const refused = (
    await other.g.pool.query<{ status: string; last_error: string }>(
      'SELECT status, last_error FROM actionledger.notification_deliveries',
    )
  ).rows;
  t.same(refused, [{ status: 'failed', last_error: 'attempts_spent:not_sent:tls' }]);
});
