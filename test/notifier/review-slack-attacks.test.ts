/**
 * Review attacks on the Slack interactivity endpoint, with the same real parts as slack.test.ts (the HTTP API
 * on a fresh database, the outbox posting to a local stand-in for Slack's Web API, requests signed as Slack
 * signs them). Each test states what should hold; a failing assertion is a finding.
 */
import t from 'tap';
import { Secret } from '../../core/secret.js';
import { APPROVE_ACTION, slackSignature } from '../../notifier/index.js';
import { count } from '../helpers/gate.js';
import { CHANNEL, DEST, SIGNING, TEAM, requested, slackEnv, type SlackEnv } from '../helpers/slack-env.js';

interface ClickOptions {
  user?: string;
  team?: string;
  userTeam?: string;
  secret?: string;
}

/** Posts a block_actions payload to the interactivity endpoint, signed as Slack signs it. */
async function click(env: SlackEnv, m: { approvalId: string; ts: string }, o: ClickOptions = {}) {
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

async function approvalStatus(env: SlackEnv, id: string): Promise<string | undefined> {
  return (
    await env.api.pool.query<{ status: string }>(
      'SELECT status FROM actionledger.gate_approvals WHERE approval_id = $1',
      [id],
    )
  ).rows[0]?.status;
}

t.test('a click whose user belongs to another Slack team is refused even if the payload team matches', async (t) => {
  const env = await slackEnv(t);
  const m = await requested(env, 'foreign-user-team');
  // A user from another workspace (a Slack Connect guest in a shared channel) whose user id equals a linked one.
  const r = await click(env, m, { userTeam: 'T0OTHERORG' });
  t.equal(r.body.ok, false, 'a user of another team is not the linked user');
  t.equal(await approvalStatus(env, m.approvalId), 'pending', 'nothing approved');
});

t.test('a principal whose every credential was revoked cannot approve through Slack', async (t) => {
  const env = await slackEnv(t);
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
  const env = await slackEnv(t);
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
