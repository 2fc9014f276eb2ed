/**
 * Slack, end to end with real parts: the HTTP API on a fresh database, the notification outbox delivering to a
 * local HTTPS server that plays Slack's Web API, interactivity requests signed as Slack signs them
 * (`v0:<timestamp>:<body>`, HMAC-SHA256 with the signing secret), the gate deciding, a real dispatcher sending
 * to the sandbox provider over mTLS. An approval clicked in Slack succeeds once and reaches the provider once;
 * a forged signature, a stale timestamp, an unmapped user, the requester's own click, a click after the
 * resource moved and a click after expiry are each refused with nothing dispatched.
 */
import { Registry } from 'prom-client';
import t, { type Test } from 'tap';
import { AuditWriter, AuthorizationService } from '../../gate/index.js';
import { createLogger } from '../../core/log.js';
import { Secret } from '../../core/secret.js';
import {
  APPROVE_ACTION,
  NotificationDelivery,
  REJECT_ACTION,
  SlackInteractions,
  linkSlackUser,
  slackSignature,
} from '../../notifier/index.js';
import { apiFixture, type ApiFixture } from '../helpers/api.js';
import { settled } from '../helpers/fleet.js';
import { auditRows, count, GATE_RESOLVERS, gateRoutes, gctx } from '../helpers/gate.js';
import { FakeSlack, receiverPki } from '../helpers/notify-receivers.js';
import { predispatchEnv, type PredispatchEnv } from '../helpers/predispatch-env.js';
import { BOT, CHANNEL, DEST, SIGNING, TEAM, drain, requested } from '../helpers/slack-env.js';

interface Env {
  e: PredispatchEnv;
  api: ApiFixture;
  slack: FakeSlack;
  delivery: NotificationDelivery;
  registry: Registry;
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
  const registry = new Registry();
  api.deps.slack = new SlackInteractions({
    config: api.config,
    pool: api.pool,
    gate: api.gate,
    principals: api.store,
    audit: api.deps.audit,
    log,
    env,
    registry,
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
  return { e, api, slack, delivery, registry };
}

interface ClickOptions {
  user?: string;
  action?: string;
  timestamp?: number;
  secret?: string;
}

/** Posts a block_actions payload to the interactivity endpoint, signed as Slack signs it. */
async function click(env: Env, m: { approvalId: string; ts: string }, o: ClickOptions = {}) {
  const payload = {
    type: 'block_actions',
    user: { id: o.user ?? 'U0SUP1', team_id: TEAM },
    team: { id: TEAM },
    container: { type: 'message', channel_id: CHANNEL, message_ts: m.ts },
    channel: { id: CHANNEL },
    actions: [
      {
        action_id: o.action ?? APPROVE_ACTION,
        type: 'button',
        value: JSON.stringify({ approval_id: m.approvalId }),
      },
    ],
  };
  const body = new URLSearchParams({ payload: JSON.stringify(payload) }).toString();
  const timestamp = String(o.timestamp ?? Math.floor(Date.now() / 1000));
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

async function operations(env: Env): Promise<number> {
  return count(env.api.pool, 'actionledger.operations');
}

t.test('the message shows the exact request; an approval clicked in Slack reaches the provider once', async (t) => {
  const env = await setup(t);
  const m = await requested(env, 'slack-ok');
  const post = env.slack.of('chat.postMessage')[0];
  const shown = JSON.stringify(post?.body);
  const view = await env.api.gate.approvals.show(m.approvalId, { tenant_id: 'tenant-a' });
  t.equal(post?.authorization, `Bearer ${BOT}`, 'the bot token from its environment variable');
  t.equal(post?.body.channel, CHANNEL);
  const code = /```([^`]*)```/.exec(String((post?.body.blocks as { text?: { text: string } }[])[2]?.text?.text));
  t.same(
    JSON.parse(code?.[1] ?? 'null'),
    { document_id: 'DOC-1', status: 'published' },
    'the exact arguments, as a code block',
  );
  t.match(shown, /document `DOC-1` at version `7`/, 'resources and versions');
  t.match(shown, /Time left: \*\d+ min\*/, 'time left');
  t.match(shown, view.envelope_sha256, 'the envelope hash');
  t.match(shown, APPROVE_ACTION);
  t.match(shown, REJECT_ACTION);
  t.notMatch(shown, SIGNING);

  const r = await click(env, m);
  t.equal(r.status, 200);
  t.same([r.body.ok, r.body.outcome], [true, 'reserved'], 'approved and reserved');
  t.equal(await approvalStatus(env, m.approvalId), 'executed');
  const again = await click(env, m);
  t.same([again.body.ok, again.body.error], [false, 'invalid_state_transition'], 'a second click counts for nothing');

  const service = new AuthorizationService({
    config: env.api.config,
    pool: env.e.pool,
    resolvers: GATE_RESOLVERS,
    tls: { ...env.e.pki.server, ca: env.e.pki.ca.cert },
  });
  t.teardown(() => service.stop());
  await service.start();
  const op = (
    await env.api.pool.query<{ operation_id: string; effect_key: string }>(
      'SELECT operation_id, effect_key FROM actionledger.operations',
    )
  ).rows;
  t.equal(op.length, 1, 'one operation');
  const d = await env.e.open({ tools: gateRoutes(env.e.provider.endpoint), authorizationUrl: service.authorizeUrl });
  const done = await settled(env.e.pool, op[0]?.operation_id ?? '');
  await d.stop();
  t.equal(done.status, 'succeeded');
  t.equal(env.e.provider.requestsFor(op[0]?.effect_key ?? ''), 1, 'the provider was called once');
  t.equal(env.e.provider.effectsFor(op[0]?.effect_key ?? ''), 1, 'one effect');

  await drain(env);
  const updates = env.slack.of('chat.update');
  t.ok(updates.length >= 1, 'the message was updated');
  t.ok(
    updates.every((u) => u.body.ts === m.ts && u.body.channel === CHANNEL),
    'the same message',
  );
  t.match(
    JSON.stringify(updates.at(-1)?.body),
    /approved and reserved[\s\S]*sup-1/,
    'with the decision and who made it',
  );
  const ephemeral = env.slack.of('chat.postEphemeral');
  t.same(
    ephemeral.map((c) => c.body.user),
    ['U0SUP1', 'U0SUP1'],
    'the clicker was told each time',
  );
  const audit = await auditRows(env.api.pool, "action = 'notification' AND outcome LIKE 'slack_click:%'");
  t.same(
    audit.map((a) => [a.outcome, a.principal_id]),
    [
      ['slack_click:reserved', 'sup-1'],
      ['slack_click:invalid_state_transition', 'sup-1'],
    ],
    'each click is audited with the principal it maps to',
  );
  t.equal(
    (await auditRows(env.api.pool, "action = 'approve' AND principal_id = 'sup-1'")).length,
    2,
    'and the gate audited its decisions',
  );
});

t.test('refused clicks: nothing approved, nothing dispatched, the clicker told why', async (t) => {
  const env = await setup(t);

  await t.test('a forged signature', async (t) => {
    const m = await requested(env, 'forged');
    const r = await click(env, m, { secret: 'not-the-signing-secret' });
    t.equal(r.status, 401);
    t.equal(r.body.error, 'unauthenticated');
    t.equal(await approvalStatus(env, m.approvalId), 'pending');
  });

  await t.test('a stale timestamp (signed correctly, six minutes old)', async (t) => {
    const m = await requested(env, 'stale');
    const r = await click(env, m, { timestamp: Math.floor(Date.now() / 1000) - 360 });
    t.equal(r.status, 401);
    t.match(String(r.body.message), /stale_timestamp/);
    t.equal(await approvalStatus(env, m.approvalId), 'pending');
  });

  await t.test('a Slack user linked to no principal', async (t) => {
    const m = await requested(env, 'unmapped');
    const before = env.slack.of('chat.postEphemeral').length;
    const r = await click(env, m, { user: 'U0STRANGER' });
    t.same([r.status, r.body.ok, r.body.error], [200, false, 'permission_denied']);
    t.equal(await approvalStatus(env, m.approvalId), 'pending');
    const told = env.slack.of('chat.postEphemeral').slice(before);
    t.equal(told.length, 1);
    t.equal(told[0]?.body.user, 'U0STRANGER');
    t.match(String(told[0]?.body.text), /not linked[\s\S]*slack-link/, 'told why, and how an operator fixes it');
  });

  await t.test("the requester's own click", async (t) => {
    const m = await requested(env, 'self');
    const before = env.slack.of('chat.postEphemeral').length;
    const r = await click(env, m, { user: 'U0EDITOR' });
    t.same([r.body.ok, r.body.error], [false, 'self_approval_forbidden']);
    t.equal(await approvalStatus(env, m.approvalId), 'pending');
    const told = env.slack.of('chat.postEphemeral').slice(before);
    t.match(
      String(told[0]?.body.text),
      /^Refused \(self_approval_forbidden\): self_approval_forbidden: you asked for this yourself \(as editor-1\)/,
      "told the gate's blocker, its code and why, not a generic refusal",
    );
    t.match(r.body.blockers, [{ code: 'self_approval_forbidden', details: { reason: 'requester' } }]);
  });

  await t.test('a click after the resource moved', async (t) => {
    const m = await requested(env, 'moved');
    await env.api.pool.query("UPDATE shop.documents SET version = version + 1 WHERE doc_id = 'DOC-1'");
    t.teardown(() => env.api.pool.query("UPDATE shop.documents SET version = 7 WHERE doc_id = 'DOC-1'"));
    const before = env.slack.of('chat.postEphemeral').length;
    const r = await click(env, m);
    t.same([r.body.ok, r.body.error], [false, 'reapproval_required']);
    t.equal(await approvalStatus(env, m.approvalId), 'invalidated');
    t.match(
      String(env.slack.of('chat.postEphemeral').slice(before)[0]?.body.text),
      /reapproval_required: what this approval binds no longer holds \(stale_resource\)/,
      'told what moved, as read before the click invalidated it',
    );
    await drain(env);
    const update = env.slack.of('chat.update').filter((u) => u.body.ts === m.ts);
    t.equal(update.length, 1, 'updated once, to the current state');
    t.match(JSON.stringify(update[0]?.body), /reapproval required/, 'the message now says so');
  });

  await t.test('a click after expiry', async (t) => {
    const m = await requested(env, 'expired');
    await env.api.pool.query(
      `UPDATE actionledger.gate_approvals SET created_at = now() - interval '2 hours', expires_at = now() - interval '1 hour'
       WHERE approval_id = $1`,
      [m.approvalId],
    );
    const r = await click(env, m);
    t.same([r.body.ok, r.body.error], [false, 'approval_expired']);
    t.equal(await approvalStatus(env, m.approvalId), 'expired');
    await drain(env);
    const update = env.slack.of('chat.update').find((u) => u.body.ts === m.ts);
    t.match(JSON.stringify(update?.body), /expired/, 'the message now says so');
  });

  await t.test('a message this system never posted', async (t) => {
    const m = await requested(env, 'unknown-message');
    const r = await click(env, { ...m, ts: '999.000001' });
    t.same([r.body.ok, r.body.error], [false, 'not_found']);
    t.equal(await approvalStatus(env, m.approvalId), 'pending');
  });

  t.equal(await operations(env), 0, 'no operation was reserved by any refused click');
  t.equal(env.e.provider.requests().length, 0, 'and nothing reached the provider');
  const refusals = await auditRows(env.api.pool, "action = 'notification' AND outcome LIKE 'slack_click:%'");
  t.same(
    refusals.map((a) => a.outcome),
    [
      'slack_click:permission_denied',
      'slack_click:self_approval_forbidden',
      'slack_click:reapproval_required',
      'slack_click:approval_expired',
      'slack_click:not_found',
    ],
    'every refused signed click is in the audit log',
  );
  const unsigned = (await env.registry.getSingleMetric('actionledger_slack_requests_unauthenticated_total')?.get())
    ?.values;
  t.same(
    unsigned?.map((v) => [v.labels.destination, v.labels.reason, v.value]).sort(),
    [
      [DEST, 'bad_signature', 1],
      [DEST, 'stale_timestamp', 1],
    ],
    'the two requests whose signature did not hold are counted, not audited',
  );
});

t.test('reject from Slack is final and updates the message', async (t) => {
  const env = await setup(t);
  const m = await requested(env, 'reject');
  const r = await click(env, m, { action: REJECT_ACTION });
  t.same([r.body.ok, r.body.outcome], [true, 'rejected']);
  t.equal(await approvalStatus(env, m.approvalId), 'rejected');
  const late = await click(env, m);
  t.equal(late.body.ok, false, 'an approve after the rejection is refused');
  await drain(env);
  t.match(JSON.stringify(env.slack.of('chat.update').at(-1)?.body), /rejected[\s\S]*rejected in Slack by sup-1/);
  t.equal(await operations(env), 0);
});

t.test('hostile bodies, correctly signed, are refused before anything is read', async (t) => {
  const env = await setup(t);
  const m = await requested(env, 'hostile');
  const send = (body: string, contentType = 'application/x-www-form-urlencoded') => {
    const timestamp = String(Math.floor(Date.now() / 1000));
    return env.api.call('POST', `/integrations/slack/${DEST}/interactions`, {
      raw: body,
      headers: {
        'content-type': contentType,
        'x-slack-request-timestamp': timestamp,
        'x-slack-signature': slackSignature(new Secret(Buffer.from(SIGNING)), timestamp, body),
      },
    });
  };
  const dup = `payload=${encodeURIComponent(`{"type":"block_actions","type":"view_submission"}`)}`;
  const cases: [string, string, number, string][] = [
    ['duplicate keys', dup, 422, 'invalid_request'],
    ['no payload field', 'other=1', 422, 'invalid_request'],
    ['not JSON', 'payload=%7Bnope', 422, 'invalid_request'],
    [
      'an unknown action',
      `payload=${encodeURIComponent(JSON.stringify({ type: 'block_actions', actions: [{ action_id: 'x' }] }))}`,
      422,
      'invalid_request',
    ],
  ];
  for (const [what, body, status, error] of cases) {
    const r = await send(body);
    t.same([r.status, r.body.error], [status, error], what);
  }
  const json = await send('{"payload":"x"}', 'application/json');
  t.equal(json.status, 415, 'only the form encoding Slack uses');
  const unknown = await env.api.call('POST', '/integrations/slack/nope/interactions', {
    raw: 'payload=%7B%7D',
    headers: { 'content-type': 'application/x-www-form-urlencoded' },
  });
  t.same([unknown.status, unknown.body.error], [404, 'not_found'], 'an unconfigured destination');
  t.equal(await approvalStatus(env, m.approvalId), 'pending');
  t.equal(await operations(env), 0);
});

t.test('four eyes and revocation apply to Slack clicks as to the console', async (t) => {
  const env = await setup(t);
  await env.api.token('admin-1', ['admin']);
  for (const [principal, user] of [
    ['sup-2', 'U0SUP2'],
    ['sup-3', 'U0SUP3'],
  ] as const) {
    await env.api.token(principal, ['supervisor']);
    await linkSlackUser(env.api.config, env.api.pool, env.api.deps.audit, {
      tenant_id: 'tenant-a',
      team_id: TEAM,
      slack_user_id: user,
      principal_id: principal,
      actor: 'op-1',
    });
  }
  const m = await requested(env, 'two-approvers', {
    principal: 'admin-1',
    role: 'admin',
    tool: 'delete_customer',
    args: { customer_id: 'C-1' },
  });
  const first = await click(env, m);
  t.same([first.body.ok, first.body.outcome], [true, 'pending_approvals'], 'one vote of two');
  const twice = await click(env, m);
  t.same([twice.body.ok, twice.body.error], [false, 'self_approval_forbidden'], 'nobody counts twice');
  await env.api.store.revoke('sup-2', 'tenant-a', 'supervisor', 'op-1');
  const revoked = await click(env, m, { user: 'U0SUP2' });
  t.same([revoked.body.ok, revoked.body.error], [false, 'permission_denied'], 'a revoked role decides nothing');
  t.equal(await operations(env), 0, 'still one vote: nothing reserved');
  const second = await click(env, m, { user: 'U0SUP3' });
  t.same([second.body.ok, second.body.outcome], [true, 'reserved'], 'the second person reserves it');
  t.equal(await operations(env), 1);
  const view = await env.api.gate.approvals.show(m.approvalId, { tenant_id: 'tenant-a' });
  t.same([...view.approvers].sort(), ['sup-1', 'sup-3']);
  await drain(env);
  t.match(JSON.stringify(env.slack.of('chat.update').at(-1)?.body), /approved and reserved[\s\S]*sup-1[\s\S]*sup-3/);
});

t.test('a request decided before its message went out is not asked in Slack; its outcome is posted', async (t) => {
  const env = await setup(t);
  const held = await env.api.gate.call(
    gctx({ principal_id: 'editor-1', role: 'editor', workflow_step_id: 'late' }),
    'update_document',
    { document_id: 'DOC-1', status: 'draft' },
  );
  if (held.ok || held.request_id === undefined) throw new Error(JSON.stringify(held));
  await env.api.gate.reject(
    held.request_id,
    { tenant_id: 'tenant-a', principal_id: 'sup-1', role: 'supervisor' },
    'no',
  );
  await drain(env);
  const posts = env.slack.of('chat.postMessage');
  t.equal(posts.length, 1, 'one message');
  t.notMatch(JSON.stringify(posts[0]?.body), new RegExp(APPROVE_ACTION), 'without buttons');
  t.match(JSON.stringify(posts[0]?.body), /rejected/, 'saying what happened');
  t.equal(env.slack.of('chat.update').length, 0);
});
