/**
 * A Slack approval environment shared by the Slack tests: real parts (the HTTP API on a fresh database, the
 * outbox posting to a local stand-in for Slack's Web API), and requests posted and drained as a person would see them.
 */
import type { Test } from 'tap';
import { AuditWriter } from '../../gate/index.js';
import { createLogger } from '../../core/log.js';
import { NotificationDelivery, SlackInteractions, linkSlackUser } from '../../notifier/index.js';
import { apiFixture, type ApiFixture } from './api.js';
import { count, gctx } from './gate.js';
import { FakeSlack, receiverPki } from './notify-receivers.js';
import { predispatchEnv, type PredispatchEnv } from './predispatch-env.js';

export const BOT = 'xoxb-test-bot-token';
export const SIGNING = 'slack-signing-secret-for-tests';
export const TEAM = 'T0TEAM';
export const CHANNEL = 'C0APPROVALS';
export const DEST = 'approvals-slack';

export interface SlackEnv {
  e: PredispatchEnv;
  api: ApiFixture;
  slack: FakeSlack;
  delivery: NotificationDelivery;
}

/**
 * The HTTP API on a fresh database with a Slack destination posting to a local stand-in for Slack's Web API, the
 * Slack interactivity handler, the delivery loop, and the people: two supervisors linked to Slack, an editor who
 * asks (and also holds the supervisor role), a supervisor nobody linked.
 */
export async function slackEnv(t: Test): Promise<SlackEnv> {
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

/** Runs the delivery loop until nothing is pending. */
export async function drain(env: Pick<SlackEnv, 'api' | 'delivery'>): Promise<void> {
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
export async function requested(
  env: Pick<SlackEnv, 'api' | 'delivery'>,
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
