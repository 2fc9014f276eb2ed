/**
 * The Slack interactivity endpoint reads its signed form strictly (the same real parts as slack.test.ts: the
 * HTTP API on a fresh database, the outbox posting to a local stand-in for Slack's Web API, requests signed as
 * Slack signs them): a field sent twice, `payload` above all, is refused rather than the first one taken, and
 * so are bytes or percent-escapes that are not UTF-8. A signed request that is refused approves nothing.
 */
import t from 'tap';
import { Secret } from '../../core/secret.js';
import { APPROVE_ACTION, slackSignature } from '../../notifier/index.js';
import { count } from '../helpers/gate.js';
import { CHANNEL, DEST, SIGNING, TEAM, requested, slackEnv, type SlackEnv } from '../helpers/slack-env.js';

async function approvalStatus(env: SlackEnv, id: string): Promise<string | undefined> {
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
async function signed(env: SlackEnv, body: Buffer) {
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
  const env = await slackEnv(t);
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
  const env = await slackEnv(t);
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
