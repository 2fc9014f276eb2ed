/**
 * Review attacks on the notification outbox: what a webhook receiver (a third party holding only the webhook
 * secret) can learn about arguments the tool redacts, and what the outbox keeps when nothing consumes it.
 * Each test states what should hold; a failing assertion is a finding.
 */
import { createHash, randomBytes } from 'node:crypto';
import t, { type Test } from 'tap';
import { AuditWriter } from '../../gate/index.js';
import { createLogger } from '../../core/log.js';
import { canonicalJson, sha256Hex, type JsonObject, type JsonValue } from '../../core/json.js';
import { compileConfig } from '../../config/index.js';
import { NotificationDelivery } from '../../notifier/index.js';
import { slackApprovalRequest } from '../../notifier/render.js';
import { count, gateConfig, gateFixture, gateRoutes, gateSection, gctx, type GateFixture } from '../helpers/gate.js';
import { receiverPki, WebhookReceiver } from '../helpers/notify-receivers.js';

const SECRET = `whsec_${randomBytes(32).toString('base64')}`;

async function setup(
  t: Test,
  redact: string[],
): Promise<{ g: GateFixture; receiver: WebhookReceiver; delivery: NotificationDelivery }> {
  const pki = await receiverPki();
  const receiver = await new WebhookReceiver(pki, [SECRET]).start(t);
  const g = await gateFixture(t, {
    gate: { tools: { update_document: { redact } } },
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
        delivery: { backoff_initial_ms: 10, backoff_max_ms: 20, timeout_ms: 2000, lease_ms: 3000 },
      },
    },
  });
  const log = createLogger({ level: 'silent', name: 'review-attacks' });
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

async function requestApproval(g: GateFixture, step: string, status: string): Promise<string> {
  const held = await g.gate.call(
    gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: step }),
    'update_document',
    { document_id: 'DOC-1', status },
  );
  if (held.ok || held.error !== 'approval_required' || held.request_id === undefined)
    throw new Error(JSON.stringify(held));
  return held.request_id;
}

t.test('a redacted argument cannot be recovered from the hashes a webhook carries', async (t) => {
  const { g, receiver, delivery } = await setup(t, ['status']);
  await requestApproval(g, 'hash-1', 'reviewed');
  await drain(g, delivery);
  const body = [...receiver.accepted().values()][0] as { data: { envelope: JsonObject; envelope_sha256: string } };
  const env = body.data.envelope;
  t.same(env.arguments, { document_id: 'DOC-1', status: '[redacted]' }, 'the value itself is redacted');

  // The receiver guesses: the schema says status is one of three words (any short or guessable value will do).
  const candidates = ['draft', 'reviewed', 'published'];
  const args = env.arguments as JsonObject;
  const byArgs = candidates.find(
    (c) =>
      createHash('sha256')
        .update(canonicalJson({ ...args, status: c }))
        .digest('hex') === env.args_sha256,
  );
  t.equal(byArgs, undefined, 'envelope.args_sha256 does not confirm a guess of the redacted value');

  const byEnvelope = candidates.find((c) => {
    const whole = {
      ...env,
      arguments: { ...args, status: c },
      effect: (typeof env.effect === 'string' ? env.effect : '').replace('[redacted]', c),
    } as JsonValue;
    return sha256Hex(canonicalJson(whole)) === body.data.envelope_sha256;
  });
  t.equal(byEnvelope, undefined, 'envelope_sha256 does not confirm a guess of the redacted value');
});

t.test('a redacted argument that binds a resource is not sent as the resource id', async (t) => {
  const { g, receiver, delivery } = await setup(t, ['document_id']);
  await requestApproval(g, 'res-1', 'published');
  await drain(g, delivery);
  const raw = receiver.received[0]?.body ?? '';
  const body = JSON.parse(raw) as { data: { envelope: JsonObject } };
  t.same(body.data.envelope.arguments, { document_id: '[redacted]', status: 'published' }, 'redacted in arguments');
  t.notOk(raw.includes('DOC-1'), 'the redacted document id appears nowhere in the webhook body');
});

t.test('the Slack message does not show a redacted argument as a resource id', (t) => {
  const config = compileConfig(
    { tools: gateRoutes(), gate: gateSection({ tools: { update_document: { redact: ['document_id'] } } }) },
    {},
  );
  const msg = slackApprovalRequest(config, {
    event_id: '00000000-0000-4000-8000-000000000002',
    destination: 'chat',
    attempts: 1,
    event_type: 'approval.requested',
    tenant_id: 'tenant-a',
    tool_name: 'update_document',
    subject_id: 'a-2',
    created_at: new Date(),
    now_s: Date.parse('2026-01-01T00:00:00Z') / 1000,
    payload: {
      approval_id: 'a-2',
      tool: 'update_document',
      requester_id: 'editor-1',
      requester_role: 'editor',
      required_approvals: 1,
      envelope_sha256: 'f'.repeat(64),
      expires_at: '2026-01-01T00:10:00Z',
      envelope: {
        tool: 'update_document',
        arguments: { document_id: 'DOC-424242', status: 'published' },
        resources: [{ type: 'document', id: 'DOC-424242', version: '7' }],
      },
    },
  });
  t.notMatch(JSON.stringify(msg), /DOC-424242/, 'the redacted id appears nowhere in the message');
  t.end();
});

t.test('a worker whose configuration does not yet name a destination does not end its deliveries', async (t) => {
  // A rolling deploy adds the destination `ops`: the new worker routes an event to it, a worker still on the
  // previous configuration (another destination only) claims the delivery first.
  const { g, receiver, delivery } = await setup(t, ['status']);
  const pki = await receiverPki();
  const other = await new WebhookReceiver(pki, [SECRET]).start(t);
  const oldConfig = gateConfig(g.url, {
    extra: {
      notifications: {
        destinations: {
          audit: {
            type: 'webhook',
            url: `${other.url}/hooks`,
            secret_envs: ['WH'],
            ca_file: pki.paths.caCert,
            allow_private_network: true,
          },
        },
        routes: [{ destinations: ['audit'], events: ['kill_switch.engaged'] }],
        delivery: { backoff_initial_ms: 10, backoff_max_ms: 20, timeout_ms: 2000, lease_ms: 3000 },
      },
    },
  });
  const log = createLogger({ level: 'silent', name: 'review-attacks-old' });
  const oldWorker = new NotificationDelivery({
    config: oldConfig,
    pool: g.pool,
    audit: new AuditWriter({ config: oldConfig, pool: g.pool, log }),
    log,
    env: { WH: SECRET },
  });
  t.teardown(() => oldWorker.stop());
  receiver.failFirst = 1;
  await requestApproval(g, 'rolling-1', 'published');
  await delivery.tick(); // the new worker routes the event to ops; its first attempt fails, a retry is due soon
  await new Promise((r) => setTimeout(r, 100));
  await oldWorker.tick(); // the old worker claims the retry first
  await drain(g, delivery);
  const rows = (
    await g.pool.query<{ status: string; last_error: string | null }>(
      'SELECT status, last_error FROM actionledger.notification_deliveries',
    )
  ).rows;
  t.same(
    rows.map((r) => r.status),
    ['delivered'],
    `the delivery is not ended by a worker that does not know it (${JSON.stringify(rows)})`,
  );
  t.equal(receiver.accepted().size, 1, 'the receiver got the event');
});

t.test('without any destination, approvals leave no unredacted copy in an outbox nothing drains', async (t) => {
  const g = await gateFixture(t, { gate: { tools: { update_document: { redact: ['status'] } } } });
  await requestApproval(g, 'no-dest-1', 'published');
  const rows = (await g.pool.query<{ payload: JsonObject }>('SELECT payload FROM actionledger.notification_events'))
    .rows;
  t.equal(rows.length, 0, 'no event is written when no destination can ever take it (nothing prunes them)');
  t.notMatch(JSON.stringify(rows), /published/, 'no copy of the redacted argument kept outside the approval row');
});
