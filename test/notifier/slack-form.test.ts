/**
 * The Slack interactivity endpoint reads its signed form strictly (the same real parts as slack.test.ts: the
 * HTTP API on a fresh database, the outbox posting to a local stand-in for Slack's Web API, requests signed as
 * Slack signs them): a field sent twice, `payload` above all, is refused rather than the first one taken, and
 * so are bytes or percent-escapes that are not UTF-8. A signed request that is refused approves nothing.
 */
import t, { type Test } from 'tap';
import { AuditWriter } from '../../gate/index.js';
import { createLogger } from '../../core/log.js';
import { Secret } from '../../core/secret.js';
import {
  APPROVE_ACTION,
  NotificationDelivery,
  SlackInteractions,
  linkSlackUser,
  slackSignature,
} from '../../notifier/index.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { count, gctx } from '../helpers/gate.js';
import { FakeSlack, receiverPki } from '../helpers/notify-receivers.js';
import { predispatchEnv, type PredispatchEnv } from '../helpers/predispatch-env.js';

const BOT = 'xoxb-test-bot-token';
const SIGNING = 'slack-signing-secret-for-tests';
const TEAM = 'T0TEAM';
const CHANNEL = 'C0APPROVALS';
const DEST = 'approvals-slack';

interface Env {
  e: PredispatchEnv;
  api: ApiFixture;
  slack: FakeSlack;
  delivery: NotificationDelivery;
}

async function setup(t: Test): Promise<Env> {
  const pki = await receiverPki();
  const slack = await new FakeSlack(pki, BOT).start(t);
  const e = await predispatchEnv(t);
  const api = await apiFixture(t, {
    url: e.url,
    pool: e.pool,
    endpoint: e.provider.endpoint,
    extra: {
      notifications: {
        destinations: {
          [DEST]: {
            type: 'slack',
            channel: CHANNEL,
            team_id: TEAM,
            bot_token_env: 'SLACK_BOT_TOKEN',
            signing_secret_env: 'SLACK_SIGNING_SECRET',
            api_base_url: slack.apiBase,
            ca_file: pki.paths.caCert,
            allow_private_network: true, // the fake Slack listens on loopback
          },
        },
        routes: [{ destinations: [DEST], events: ['approval.requested', 'approval.decided', 'approval.expired'] }],
        delivery: { backoff_initial_ms: 10, backoff_max_ms: 20 },
      },
    },
  });
  const env = { SLACK_BOT_TOKEN: BOT, SLACK_SIGNING_SECRET: SIGNING };
  const log = createLogger({ level: 'silent', name: 'slack-test' });
  api.deps.slack = new SlackInteractions({
    config: api.config,
    pool: api.pool,
    gate: api.gate,
    principals: api.store,
    audit: api.deps.audit,
    log,
    env,
  });
  const delivery = new NotificationDelivery({
    config: api.config,
    pool: api.pool,
    audit: new AuditWriter({ config: api.config, pool: api.pool, log }),
    log,
    env,
  });
  t.teardown(() => delivery.stop());
  // People: two supervisors linked to Slack, an editor who asks (and also holds the supervisor role, so the
  // four-eyes rule, not the role, is what refuses their own click), and a supervisor nobody linked.
  await api.token('sup-1', ['supervisor']);
  await api.token('editor-1', ['editor', 'supervisor']);
  await api.token('sup-unlinked', ['supervisor']);
  for (const [principal, user] of [
    ['sup-1', 'U0SUP1'],
    ['editor-1', 'U0EDITOR'],
  ] as const)
    await linkSlackUser(api.config, api.pool, api.deps.audit, {
      tenant_id: 'tenant-a',
      team_id: TEAM,
      slack_user_id: user,
      principal_id: principal,
      actor: 'op-1',
    });
  return { e, api, slack, delivery };
}

async function drain(env: Env): Promise<void> {
  for (let i = 0; i < 200; i++) {
    await env.delivery.tick();
    const pending =
      (await count(env.api.pool, "actionledger.notification_deliveries WHERE status = 'pending'")) +
      (await count(env.api.pool, 'actionledger.notification_events WHERE fanned_out_at IS NULL'));
    if (pending === 0) return;
    await new Promise((r) => setTimeout(r, 15));
  }
  throw new Error('deliveries still pending');
}

/** editor-1 asks to publish DOC-1 (or `call` is made); the request is posted to Slack. Returns the approval id and the message's ts. */
async function requested(
  env: Env,
  step: string,
  call: { principal: string; role: string; tool: string; args: Record<string, unknown> } = {
    principal: 'editor-1',
    role: 'editor',
    tool: 'update_document',
    args: { document_id: 'DOC-1', status: 'published' },
  },
): Promise<{ approvalId: string; ts: string }> {
  const held = await env.api.gate.call(
    gctx({ principal_id: call.principal, role: call.role, workflow_step_id: step }),
    call.tool,
    call.args,
  );
  if (held.ok || held.request_id === undefined) throw new Error(JSON.stringify(held));
  await drain(env);
  const ts = (
    await env.api.pool.query<{ message_ts: string }>(
      'SELECT message_ts FROM actionledger.notification_slack_messages WHERE approval_id = $1',
      [held.request_id],
    )
  ).rows[0]?.message_ts;
  if (ts === undefined) throw new Error('not posted');
  return { approvalId: held.request_id, ts };
}

async function approvalStatus(env: Env, id: string): Promise<string | undefined> {
  return (
    await env.api.pool.query<{ status: string }>(
      'SELECT status FROM actionledger.gate_approvals WHERE approval_id = $1',
      [id],
    )
  ).rows[0]?.status;
}

/** An approve click's `payload` field on the message `m`, as Slack encodes it. */
function clickField(m: { approvalId: string; ts: string }): string {
  const payload = {
    type: 'block_actions',
    user: { id: 'U0SUP1', team_id: TEAM },
    team: { id: TEAM },
    container: { type: 'message', channel_id: CHANNEL, message_ts: m.ts },
    channel: { id: CHANNEL },
    actions: [{ action_id: APPROVE_ACTION, type: 'button', value: JSON.stringify({ approval_id: m.approvalId }) }],
  };
  return new URLSearchParams({ payload: JSON.stringify(payload) }).toString();
}

/** Posts `body` (the form exactly as given) to the interactivity endpoint, signed with the destination's secret. */
async function signed(env: Env, body: Buffer) {
  const timestamp = String(Math.floor(Date.now() / 1000));
  const signature = slackSignature(new Secret(Buffer.from(SIGNING)), timestamp, body);
  return env.api.call('POST', `/integrations/slack/${DEST}/interactions`, {
    raw: body,
    headers: {
      'content-type': 'application/x-www-form-urlencoded',
      'x-slack-request-timestamp': timestamp,
      'x-slack-signature': signature,
    },
  });
}

t.test('a signed request with payload twice, or any field twice, is refused and approves nothing', async (t) => {
  const env = await setup(t);
  const m = await requested(env, 'repeated-payload');
  const click = clickField(m);
  const other = clickField({ approvalId: m.approvalId, ts: '1.000' });
  for (const [label, body] of [
    ['payload twice, the approve click first', `${click}&${other}`],
    ['payload twice, the same click', `${click}&${click}`],
    ['another field twice', `${click}&x=1&x=2`],
  ] as const) {
    const r = await signed(env, Buffer.from(body));
    t.match(r, { status: 422, body: { ok: false, error: 'invalid_request' } }, label);
    t.match(r.body.message, /more than once/, `${label}: says why`);
    t.ok(r.headers.get('x-request-id'), `${label}: a request id`);
  }
  t.equal(await approvalStatus(env, m.approvalId), 'pending', 'nothing approved');
  t.equal(
    await count(env.api.pool, "actionledger.gate_audit WHERE outcome = 'slack_click:invalid'"),
    3,
    'each refusal of a signed request is audited',
  );
  const once = await signed(env, Buffer.from(click));
  t.match(once, { status: 200, body: { ok: true } }, 'the click sent once counts');
  t.equal(await approvalStatus(env, m.approvalId), 'executed', 'approved and executed');
});

t.test('a signed request whose bytes or percent-escapes are not UTF-8 is refused, not read with U+FFFD', async (t) => {
  const env = await setup(t);
  const m = await requested(env, 'not-utf8');
  const click = clickField(m);
  // Raw bytes are refused by the API before the handler reads the form, a percent-escape by the handler: both
  // 422, as every invalid_request of the API.
  for (const [label, body, status] of [
    ['a raw byte that is not UTF-8', Buffer.concat([Buffer.from(`${click}&note=`), Buffer.from([0xff])]), 422],
    ['a percent-escape that is not UTF-8', Buffer.from(`${click}&note=%FF`), 422],
    ['a malformed percent-escape', Buffer.from(`${click}&note=%zz`), 422],
  ] as const) {
    const r = await signed(env, body);
    t.match(r, { status, body: { ok: false, error: 'invalid_request' } }, label);
    t.match(r.body.message, /UTF-8|percent-escape/, `${label}: says why`);
  }
  t.equal(await approvalStatus(env, m.approvalId), 'pending', 'nothing approved');
});
