/**
 * Adversarial review of the MCP server: each test states the behaviour a safe server must have, and fails
 * while the flaw it names is present.
 */
import t from 'tap';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { MAX_SESSIONS, MAX_SESSIONS_PER_PRINCIPAL } from '../../server/mcp/http.js';
import { apiFixture } from '../helpers/api.js';
import { count } from '../helpers/gate.js';
import { call, mcpClient, meta } from '../helpers/mcp.js';

const EMAIL = { to: 'customer@example.com', subject: 'Your refund', body: 'It is on its way.' };
const HEADERS = {
  accept: 'application/json, text/event-stream',
  'content-type': 'application/json',
  'mcp-protocol-version': '2025-06-18',
};
const sessionOf = (c: Client): string =>
  (c as unknown as { transport: { sessionId?: string } }).transport.sessionId ?? '';

t.test('a host that sets no turn_id: the model cannot confirm its own proposal in its next call', async (t) => {
  const f = await apiFixture(t);
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  // The host sets task and step (required) but no turn: every request is then a turn of its own.
  const held = await call(client, 'send_email', EMAIL, meta('e-1'));
  t.match(held, { isError: true, body: { error: 'confirmation_required', confirm_token: String } });
  // The model, never having asked anyone, calls the built-in right away with the token it was handed.
  const self = await call(
    client,
    'actionledger_confirm_proposal',
    { confirm_token: held.body.confirm_token },
    meta('e-1'),
  );
  t.equal(self.isError, true, 'a confirmation with no user turn between must be refused');
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved without the user');
});

t.test('act_for_users taken from the runtime while the user is asked: the answer must not execute', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('runtime-1', ['agent-runtime']);
  let revoked = false;
  const client = await mcpClient(t, f.base, token, {
    elicit: async (params) => {
      // While the form is open, the operator takes act_for_users away from the runtime.
      await f.store.revoke('runtime-1', 'tenant-a', 'agent-runtime', 'test');
      revoked = true;
      const schema = (params as { requestedSchema?: { properties: Record<string, { default?: unknown }> } })
        .requestedSchema;
      const shown = Object.fromEntries(Object.entries(schema?.properties ?? {}).map(([k, v]) => [k, v.default]));
      return { action: 'accept', content: { ...shown, confirm: true } };
    },
  });
  const user = { principal_id: 'user-1', role: 'agent', account_id: 'acct-1', conversation_id: 'c-1', turn_id: 'u1' };
  const r = await call(client, 'send_email', EMAIL, meta('e-1', { user }));
  t.ok(revoked, 'the user was asked');
  // The very next request of the runtime is refused permission_denied...
  const next = await call(client, 'send_email', EMAIL, meta('e-2', { user: { ...user, turn_id: 'u2' } }));
  t.match(next, { isError: true, body: { error: 'permission_denied' } }, 'the next call is refused');
  // ...but the call that was waiting for the answer acted for the user with the capability it no longer has.
  t.equal(r.isError, true, 'the waiting call must be refused too');
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved for a runtime without act_for_users');
});

t.test('a JSON-RPC batch of tool calls is counted once in the API rate window', async (t) => {
  const f = await apiFixture(t, { api: { rate_limit: { requests: 10, window_s: 3600 } } });
  const token = await f.token('agent-1', ['agent']);
  const client = await mcpClient(t, f.base, token);
  const batch = Array.from({ length: 60 }, (_, i) => ({
    jsonrpc: '2.0',
    id: 1000 + i,
    method: 'tools/call',
    params: {
      name: 'transfer_funds',
      arguments: { to_account: 'ACC0000000001', amount: 1 },
      _meta: meta(`b-${i}`),
    },
  }));
  const res = await fetch(`${f.base}/mcp`, {
    method: 'POST',
    headers: { ...HEADERS, authorization: `Bearer ${token}`, 'mcp-session-id': sessionOf(client) },
    body: JSON.stringify(batch),
  });
  const text = await res.text();
  t.ok(res.status === 200 || res.status === 429, `answered ${res.status}`);
  t.ok(text.length > 0);
  const reserved = await count(f.pool, 'actionledger.operations');
  t.ok(reserved <= 10, `at most the window's 10 requests reach the gate (reserved ${reserved})`);
});

t.test('parallel initializes of one principal keep its sessions at the cap', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('agent-1', ['agent']);
  const n = MAX_SESSIONS_PER_PRINCIPAL * 3;
  const settled = await Promise.allSettled(Array.from({ length: n }, () => mcpClient(t, f.base, token)));
  const clients = settled.flatMap((s) => (s.status === 'fulfilled' ? [s.value] : []));
  const alive = await Promise.all(
    clients.map((c) =>
      c.listTools().then(
        () => 1,
        () => 0,
      ),
    ),
  );
  const open = alive.reduce<number>((a, b) => a + b, 0);
  t.ok(open <= MAX_SESSIONS_PER_PRINCIPAL, `${open} sessions open for one principal`);
});

t.test('an argument named confirm: the value the user left in the form is the one executed', async (t) => {
  const schema = {
    type: 'object',
    additionalProperties: false,
    required: ['to', 'subject', 'body'],
    properties: {
      to: { type: 'string', pattern: '^[^@\\s]+@[^@\\s]+$' },
      subject: { type: 'string', maxLength: 200 },
      body: { type: 'string', maxLength: 5000 },
      confirm: { type: 'boolean' },
    },
  };
  const f = await apiFixture(t, { gate: { tools: { send_email: { schema } } } });
  const seen: Record<string, unknown>[] = [];
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']), {
    elicit: (params) => {
      const props = (params as { requestedSchema?: { properties: Record<string, Record<string, unknown>> } })
        .requestedSchema?.properties;
      seen.push(props ?? {});
      const shown = Object.fromEntries(Object.entries(props ?? {}).map(([k, v]) => [k, v.default]));
      // The user ticks the tool's confirm argument, preset to false (the field titled with its name, wherever the
      // form keeps it), and says yes to carrying it out.
      const argument = Object.entries(props ?? {}).find(([k, v]) => k !== 'confirm' && v.title === 'confirm')?.[0];
      return {
        action: 'accept',
        content: { ...shown, ...(argument === undefined ? {} : { [argument]: true }), confirm: true },
      };
    },
  });
  const r = await call(client, 'send_email', { ...EMAIL, confirm: false }, meta('e-1', { turn_id: 't-1' }));
  t.match(seen[0]?.confirm, { title: 'Carry this out' }, 'the form still asks whether to carry it out');
  const ran = await f.pool.query<{ arguments_json: Record<string, unknown> }>(
    'SELECT arguments_json FROM actionledger.gate_proposals',
  );
  t.ok(
    r.isError || ran.rows[0]?.arguments_json.confirm === true,
    `the user left confirm=true; executed with ${JSON.stringify(ran.rows[0]?.arguments_json.confirm)}`,
  );
});

t.test('one tenant cannot fill every MCP session of the process and lock the others out', async (t) => {
  const f = await apiFixture(t);
  const init = {
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'flood', version: '1' } },
  };
  const open = async (token: string): Promise<number> => {
    const res = await fetch(`${f.base}/mcp`, {
      method: 'POST',
      headers: { ...HEADERS, authorization: `Bearer ${token}` },
      body: JSON.stringify(init),
    });
    await res.text();
    return res.status;
  };
  // Tenant A's principals, each within its own per-principal cap.
  const principals = Math.ceil(MAX_SESSIONS / MAX_SESSIONS_PER_PRINCIPAL);
  const tokens: string[] = [];
  for (let p = 0; p < principals; p++) tokens.push(await f.token(`flood-${p}`, ['agent']));
  for (const token of tokens) await Promise.all(Array.from({ length: MAX_SESSIONS_PER_PRINCIPAL }, () => open(token)));
  // A principal of tenant B, which has opened nothing, cannot start a session.
  const other = await f.token('agent-b', ['agent'], { tenant: 'tenant-b' });
  t.equal(await open(other), 200, 'another tenant still gets a session');
});

t.test('two confirmed emails for one step: each user-confirmed proposal is what happens, or is refused', async (t) => {
  const f = await apiFixture(t);
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']), {
    elicit: (params) => {
      const props = (params as { requestedSchema?: { properties: Record<string, { default?: unknown }> } })
        .requestedSchema?.properties;
      const shown = Object.fromEntries(Object.entries(props ?? {}).map(([k, v]) => [k, v.default]));
      return { action: 'accept', content: { ...shown, confirm: true } };
    },
  });
  const a = await call(client, 'send_email', EMAIL, meta('e-1', { turn_id: 't-1' }));
  const b = await call(client, 'send_email', { ...EMAIL, to: 'other@example.com' }, meta('e-1', { turn_id: 't-2' }));
  t.match(a, { isError: false, body: { ok: true, status: 'reserved' } });
  const ops = await f.pool.query<{ operation_id: string }>('SELECT operation_id FROM actionledger.operations');
  // The user confirmed an email to other@example.com; an answer of success must be that email.
  if (!b.isError)
    t.not(b.body.operation_id, a.body.operation_id, 'the second confirmed email is not the first one’s operation');
  t.ok(ops.rows.length >= 1);
});

t.test('an agent’s own role revoked while the user is asked: the answer does not execute', async (t) => {
  const f = await apiFixture(t);
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']), {
    elicit: async (params) => {
      await f.store.revoke('agent-1', 'tenant-a', 'agent', 'test');
      const props = (params as { requestedSchema?: { properties: Record<string, { default?: unknown }> } })
        .requestedSchema?.properties;
      const shown = Object.fromEntries(Object.entries(props ?? {}).map(([k, v]) => [k, v.default]));
      return { action: 'accept', content: { ...shown, confirm: true } };
    },
  });
  const r = await call(client, 'send_email', EMAIL, meta('e-1', { turn_id: 't-1' }));
  t.match(r, { isError: true, body: { error: 'permission_denied' } });
  t.equal(await count(f.pool, 'actionledger.operations'), 0);
});
