/**
 * Review attacks on the Slack interactivity endpoint, with the same real parts as slack.test.ts (the HTTP API
 * on a fresh database, the outbox posting to a local stand-in for Slack's Web API, requests signed as Slack
 * signs them). Each test states what should hold; a failing assertion is a finding.
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

interface ClickOptions {
  user?: string;
  team?: string;
  userTeam?: string;
  secret?: string;
}

/** Posts a block_actions payload to the interactivity endpoint, signed as Slack signs it. */
async function click(env: Env, m: { approvalId: string; ts: string }, o: ClickOptions = {}) {
  const payload = {
    type: 'block_actions',
    user: { id: o.user ?? 'U0SUP1', team_id: o.userTeam ?? TEAM },
    team: { id: o.team ?? TEAM },
    container: { type: 'message', channel_id: CHANNEL, message_ts: m.ts },
    channel: { id: CHANNEL },
    actions: [{ action_id: APPROVE_ACTION, type: 'button', value: JSON.stringify({ approval_id: m.approvalId }) }],
  };
  const body = new URLSearchParams({ payload: JSON.stringify(payload) }).toString();
  const timestamp = String(Math.floor(Date.now() / 1000));
  const signature = slackSignature(new Secret(Buffer.from(o.secret ?? SIGNING)), timestamp, body);
  return env.api.call('POST', `/integrations/slack/${DEST}/interactions`, {
    raw: body,
    headers: {
      'content-type': 'application/x-www-form-urlencoded',
      'x-slack-request-timestamp': timestamp,
      'x-slack-signature': signature,
    },
  });
}

async function approvalStatus(env: Env, id: string): Promise<string | undefined> {
  return (
    await env.api.pool.query<{ status: string }>(
      'SELECT status FROM actionledger.gate_approvals WHERE approval_id = $1',
      [id],
    )
  ).rows[0]?.status;
}

t.test('a click whose user belongs to another Slack team is refused even if the payload team matches', async (t) => {
  const env = await setup(t);
  const m = await requested(env, 'foreign-user-team');
  // A user from another workspace (a Slack Connect guest in a shared channel) whose user id equals a linked one.
  const r = await click(env, m, { userTeam: 'T0OTHERORG' });
  t.equal(r.body.ok, false, 'a user of another team is not the linked user');
  t.equal(await approvalStatus(env, m.approvalId), 'pending', 'nothing approved');
});

t.test('a principal whose every credential was revoked cannot approve through Slack', async (t) => {
  const env = await setup(t);
  const m = await requested(env, 'revoked-credentials');
  const tokens = await env.api.pool.query<{ token_id: string }>(
    "SELECT token_id FROM actionledger.api_tokens WHERE principal_id = 'sup-1'",
  );
  for (const { token_id } of tokens.rows) t.ok(await env.api.store.revokeToken(token_id, 'op-1'), 'token revoked');
  const r = await click(env, m);
  t.equal(r.body.ok, false, 'sup-1 can no longer authenticate anywhere; the Slack click should not count either');
  t.equal(await approvalStatus(env, m.approvalId), 'pending', 'nothing approved');
});

t.test('unsigned requests cannot grow the audit table one row per request', async (t) => {
  const env = await setup(t);
  const m = await requested(env, 'flood');
  const before = await count(env.api.pool, "actionledger.gate_audit WHERE outcome = 'slack_click:refused'");
  const n = 40;
  for (let i = 0; i < n; i++) {
    const r = await click(env, m, { secret: 'anyone-without-the-secret' });
    t.equal(r.status, 401);
  }
  const after = await count(env.api.pool, "actionledger.gate_audit WHERE outcome = 'slack_click:refused'");
  t.ok(after - before < n, `an unauthenticated sender wrote ${after - before} audit rows with ${n} requests`);
});
