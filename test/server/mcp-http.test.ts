/**
 * The MCP server over Streamable HTTP, driven by the SDK's own client against the API's real listener and a
 * real PostgreSQL: who gets in (no token, an expired one, a revoked role, another principal's session), what
 * `tools/list` shows (the tenant's routed tools the roles may call, with their schemas and annotations), that
 * identity never comes from arguments, and the two confirmation paths (elicitation through the client, with
 * changed arguments refused; the next-turn confirm without it).
 */
import t from 'tap';
import type { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { MAX_SESSIONS_PER_PRINCIPAL } from '../../server/mcp/http.js';
import { apiFixture } from '../helpers/api.js';
import { auditRows, count, gateRoutes } from '../helpers/gate.js';
import { call, mcpClient, meta } from '../helpers/mcp.js';

const EMAIL = { to: 'customer@example.com', subject: 'Your refund', body: 'It is on its way.' };
const names = async (client: Client, m?: Record<string, unknown>) =>
  (await client.listTools(m === undefined ? undefined : { _meta: m })).tools.map((x) => x.name);

t.test('no token, an expired token and a bad one are refused before any tool is listed', async (t) => {
  const f = await apiFixture(t);
  await t.rejects(mcpClient(t, f.base, undefined), /401|unauthenticated/i, 'no token');
  await t.rejects(mcpClient(t, f.base, 'al_not_a_real_token'), /401|unauthenticated|invalid_token/i, 'unknown token');
  const expired = await f.token('agent-1', ['agent']);
  await f.pool.query(
    "UPDATE actionledger.api_tokens SET created_at = now() - interval '2 days', expires_at = now() - interval '1 second'",
  );
  await t.rejects(mcpClient(t, f.base, expired), /401|unauthenticated/i, 'expired token');
  const raw = await f.call('POST', '/mcp', {
    body: { jsonrpc: '2.0', id: 1, method: 'tools/list' },
    headers: { accept: 'application/json, text/event-stream' },
  });
  t.match(raw, { status: 401, body: { ok: false, error: 'unauthenticated' } });
  t.notOk(raw.text.includes('issue_refund'), 'nothing about the tools');
});

t.test('hostile bodies are refused by the API’s strict parser before the MCP transport reads them', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('agent-1', ['agent']);
  const headers = { accept: 'application/json, text/event-stream', 'content-type': 'application/json' };
  const init =
    '"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"x","version":"1"}}';
  const dup = await f.call('POST', '/mcp', { token, headers, raw: `{"jsonrpc":"2.0","id":1,"id":2,${init}}` });
  t.match(dup, { status: 400, body: { ok: false, error: 'invalid_json' } }, 'duplicate keys');
  const proto = await f.call('POST', '/mcp', {
    token,
    headers,
    raw: `{"jsonrpc":"2.0","id":1,"__proto__":{},${init}}`,
  });
  t.match(proto, { status: 400, body: { error: 'invalid_json' } }, '__proto__');
  const text = await f.call('POST', '/mcp', {
    token,
    headers: { ...headers, 'content-type': 'text/plain' },
    raw: '{}',
  });
  t.match(text, { status: 415, body: { error: 'unsupported_media_type' } });
  const noSession = await f.call('POST', '/mcp', {
    token,
    headers,
    body: { jsonrpc: '2.0', id: 1, method: 'tools/list' },
  });
  t.match(noSession, { status: 422, body: { error: 'invalid_request', details: { field: 'mcp-session-id' } } });
});

t.test('tools/list: the tenant’s routed tools the roles may call, their strict schemas and annotations', async (t) => {
  const endpoint = 'https://localhost:9443/v1/effects';
  const routes = gateRoutes(endpoint);
  const f = await apiFixture(t, {
    endpoint,
    extra: { tools: { ...routes, transfer_funds: { ...routes.transfer_funds, allowed_tenants: ['tenant-a'] } } },
  });
  const agent = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  const listed = (await agent.listTools()).tools;
  t.same(
    listed.map((x) => x.name),
    [
      'issue_refund',
      'send_email',
      'transfer_funds',
      'actionledger_confirm_proposal',
      'actionledger_cancel_proposal',
      'actionledger_operation',
    ],
    'the agent role’s tools only: no editor, admin or role-less tool',
  );
  const refund = listed.find((x) => x.name === 'issue_refund');
  t.same(refund?.inputSchema, f.config.gate.tools.get('issue_refund')?.schema, 'the tool’s own strict schema');
  t.match(refund?.annotations, { destructiveHint: false, idempotentHint: true, readOnlyHint: false });
  t.match(refund?.description, /above 500 GBP needs approval/);
  t.match(refund?.description, /at most 3 calls and a value of 500 per conversation/);
  t.match(listed.find((x) => x.name === 'send_email')?.description, /confirmation/);

  const otherTenant = await mcpClient(t, f.base, await f.token('agent-b', ['agent'], { tenant: 'tenant-b' }));
  t.notOk((await names(otherTenant)).includes('transfer_funds'), 'a tool not routed for the tenant is absent');

  const editor = await mcpClient(t, f.base, await f.token('editor-1', ['editor']));
  const doc = (await editor.listTools()).tools.find((x) => x.name === 'update_document');
  t.match(doc?.annotations, { destructiveHint: true, idempotentHint: true }, 'irreversible: destructive');
  t.match(doc?.description, /Every call needs approval/);

  const runtime = await mcpClient(t, f.base, await f.token('runtime-1', ['agent-runtime']));
  t.same(await names(runtime), [], 'a role that calls no tool sees none');
  const user = { principal_id: 'user-1', role: 'agent', account_id: 'acct-1', conversation_id: 'c-1', turn_id: 'u1' };
  t.ok((await names(runtime, meta('s', { user }))).includes('issue_refund'), 'acting for a user: the user’s role');
  const reader = await mcpClient(t, f.base, await f.token('auditor-1', ['auditor']));
  t.same(await names(reader), []);
  await t.rejects(names(reader, meta('s', { user })), /permission_denied/, 'without act_for_users: refused');
  await t.rejects(names(agent, meta('s', { role: 'admin' })), /permission_denied/, 'a role not held: refused');
  t.same(await names(agent, meta('s', { role: 'agent' })), await names(agent), 'the one role it holds, named');
});

t.test('a revoked role: the open session lists nothing more and its calls are refused', async (t) => {
  const f = await apiFixture(t);
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  t.ok((await names(client)).includes('issue_refund'));
  await f.store.revoke('agent-1', 'tenant-a', 'agent', 'test');
  t.same(await names(client), []);
  const r = await call(client, 'transfer_funds', { to_account: 'ACC0000000001', amount: 5 }, meta('s-1'));
  t.match(r, { isError: true, body: { ok: false, error: 'permission_denied' } });
  t.equal(await count(f.pool, 'actionledger.operations'), 0);
  t.equal(
    (await auditRows(f.pool, "action = 'api' AND outcome = 'permission_denied'")).length,
    1,
    'the refusal is audited',
  );
});

t.test('a session belongs to its principal: another caller naming it gets what an unknown id gets', async (t) => {
  const f = await apiFixture(t);
  const owner = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  await owner.listTools();
  const transport = (owner as unknown as { transport: { sessionId?: string } }).transport;
  const sessionId = transport.sessionId ?? '';
  t.match(sessionId, /^[0-9a-f-]{36}$/);
  const other = await f.token('agent-2', ['agent']);
  const headers = { accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' };
  const body = { jsonrpc: '2.0', id: 9, method: 'tools/list' };
  const stolen = await f.call('POST', '/mcp', {
    token: other,
    body,
    headers: { ...headers, 'mcp-session-id': sessionId },
  });
  const unknown = await f.call('POST', '/mcp', {
    token: other,
    body,
    headers: { ...headers, 'mcp-session-id': '00000000-0000-4000-8000-000000000000' },
  });
  t.equal(stolen.status, 404);
  t.same(stolen.body, unknown.body);
  await (transport as unknown as { terminateSession(): Promise<void> }).terminateSession();
  const ended = await f.call('POST', '/mcp', {
    token: await f.token('agent-1', []),
    body,
    headers: { ...headers, 'mcp-session-id': sessionId },
  });
  t.match(ended, { status: 404, body: { error: 'not_found' } }, 'an ended session is gone for its owner too');
});

t.test('a principal that never ends its sessions loses its oldest one, not other principals theirs', async (t) => {
  const f = await apiFixture(t);
  const token = await f.token('agent-1', ['agent']);
  const other = await mcpClient(t, f.base, await f.token('agent-2', ['agent']));
  const mine: Client[] = [];
  for (let i = 0; i < MAX_SESSIONS_PER_PRINCIPAL; i++) mine.push(await mcpClient(t, f.base, token));
  for (const c of mine.slice(1)) await c.listTools();
  await mcpClient(t, f.base, token);
  await t.rejects((mine[0] as Client).listTools(), /404|not_found|session/i, 'the least recently used one is closed');
  t.ok((await names(mine[1] as Client)).includes('issue_refund'), 'the others stay');
  t.ok((await names(other)).includes('issue_refund'), 'another principal’s session is untouched');
});

t.test('identity comes from the session and the host’s metadata, never from the arguments', async (t) => {
  const f = await apiFixture(t);
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  const transfer = { to_account: 'ACC0000000001', amount: 5 };
  for (const field of ['tenant_id', 'principal_id', 'account_id', 'role', 'turn_id', 'user']) {
    const r = await call(client, 'transfer_funds', { ...transfer, [field]: 'tenant-b' }, meta(`s-${field}`));
    t.match(r, { isError: true, body: { ok: false, error: 'invalid_arguments' } }, `${field} in the arguments`);
  }
  t.equal((await auditRows(f.pool, "action = 'call' AND outcome = 'invalid_arguments'")).length, 6);
  const missing = await call(client, 'transfer_funds', transfer, {});
  t.match(missing, { isError: true, body: { error: 'invalid_context', details: { problem: 'required' } } });
  const forUser = await call(
    client,
    'transfer_funds',
    transfer,
    meta('s-u', { user: { principal_id: 'u', role: 'agent', account_id: 'a', conversation_id: 'c', turn_id: 't' } }),
  );
  t.match(forUser, { isError: true, body: { error: 'permission_denied', details: { capability: 'act_for_users' } } });
  t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved');

  const ok = await call(client, 'transfer_funds', transfer, meta('s-ok', { conversation_id: 'c-9', turn_id: 't-1' }));
  t.match(ok, {
    isError: false,
    body: { ok: true, status: 'reserved', operation_uri: /^actionledger:\/\/operations\// },
  });
  const row = await f.pool.query(
    'SELECT tenant_id, principal_id, task_id, workflow_step_id FROM actionledger.operations',
  );
  t.same(row.rows, [{ tenant_id: 'tenant-a', principal_id: 'agent-1', task_id: 'task-1', workflow_step_id: 's-ok' }]);
  const audit = await auditRows(f.pool, "action = 'call' AND outcome = 'allowed'");
  t.match(audit, [{ account_id: 'agent-1', conversation_id: 'c-9', turn_id: 't-1' }]);
});

t.test(
  'an elicited confirmation: the user’s answer confirms and executes; changed arguments are refused',
  async (t) => {
    const f = await apiFixture(t);
    const token = await f.token('agent-1', ['agent']);
    const asked: string[] = [];
    let edit: Record<string, unknown> = {};
    let action: 'accept' | 'decline' | 'fail' = 'accept';
    const client = await mcpClient(t, f.base, token, {
      elicit: (params) => {
        asked.push(params.message);
        const schema = (params as { requestedSchema?: { properties: Record<string, { default?: unknown }> } })
          .requestedSchema;
        const shown = Object.fromEntries(Object.entries(schema?.properties ?? {}).map(([k, v]) => [k, v.default]));
        if (action === 'fail') throw new Error('the host could not show the form');
        return action === 'accept' ? { action, content: { ...shown, confirm: true, ...edit } } : { action };
      },
    });
    const sent = await call(client, 'send_email', EMAIL, meta('e-1', { turn_id: 'turn-1' }));
    t.match(sent, { isError: false, body: { ok: true, status: 'reserved', operation_id: String } });
    t.match(asked[0], /customer@example\.com/, 'the user saw the exact arguments');
    const proposal = await f.pool.query('SELECT status, turn_id, confirmed_turn_id FROM actionledger.gate_proposals');
    t.match(proposal.rows, [{ status: 'executed', turn_id: 'turn-1', confirmed_turn_id: /^elicitation:/ }]);

    edit = { to: 'attacker@example.net' };
    const changed = await call(client, 'send_email', EMAIL, meta('e-2', { turn_id: 'turn-2' }));
    t.match(changed, { isError: true, body: { ok: false, error: 'params_mismatch' } });
    const second = await f.pool.query("SELECT status FROM actionledger.gate_proposals WHERE workflow_step_id = 'e-2'");
    t.same(second.rows, [{ status: 'cancelled' }], 'the changed proposal is cancelled');
    edit = { bcc: 'attacker@example.net' };
    const added = await call(client, 'send_email', EMAIL, meta('e-4', { turn_id: 'turn-4' }));
    t.match(added, { isError: true, body: { error: 'params_mismatch' } }, 'an argument added in the answer');
    t.equal((await auditRows(f.pool, "action = 'execute' AND outcome = 'params_mismatch'")).length, 2, 'audited');

    edit = {};
    action = 'decline';
    const declined = await call(client, 'send_email', EMAIL, meta('e-3', { turn_id: 'turn-3' }));
    t.match(declined, { isError: true, body: { error: 'confirmation_declined' } });
    t.equal(await count(f.pool, 'actionledger.operations'), 1, 'one email, the confirmed one');

    action = 'fail';
    const unasked = await call(client, 'send_email', EMAIL, meta('e-5', { turn_id: 'turn-5' }));
    t.match(
      unasked,
      { isError: true, body: { error: 'confirmation_required', request_id: String, confirm_token: String } },
      'the client could not ask: the next-turn confirmation applies',
    );
    const later = meta('e-5', { turn_id: 'turn-6' });
    const confirmed = await call(
      client,
      'actionledger_confirm_proposal',
      { confirm_token: unasked.body.confirm_token },
      later,
    );
    t.match(confirmed, { isError: false, body: { ok: true, status: 'reserved' } });
    t.equal(await count(f.pool, 'actionledger.operations'), 2);
  },
);

t.test(
  'an elicited confirmation of hidden characters or right-to-left text: shown by codes, a second yes required',
  async (t) => {
    const f = await apiFixture(t);
    const token = await f.token('agent-1', ['agent']);
    type Schema = { properties: Record<string, { default?: unknown }>; required: string[] };
    const asked: { message: string; schema: Schema }[] = [];
    // The SDK's client checks an answer against the form, so it always sends the required second field: false
    // is the user leaving it unticked.
    let accept = false;
    let second = true;
    const client = await mcpClient(t, f.base, token, {
      elicit: (params) => {
        const schema = (params as { requestedSchema: Schema }).requestedSchema;
        asked.push({ message: params.message, schema });
        const shown = Object.fromEntries(Object.entries(schema.properties).map(([k, v]) => [k, v.default]));
        const content = { ...shown, confirm: true, ...(second ? { accept_hidden_characters: accept } : {}) };
        return { action: 'accept', content };
      },
    });
    const hidden = { ...EMAIL, subject: 'Refund of \u202e0057\u202c GBP' };
    const refused = await call(client, 'send_email', hidden, meta('h-1', { turn_id: 'turn-1' }));
    t.match(refused, { isError: true, body: { ok: false, error: 'hidden_characters', request_id: String } });
    const q = asked[0];
    t.notOk(/[\u202e\u202c]/u.test(q?.message ?? ''), 'nothing hidden is drawn raw in the question');
    t.match(q?.message, /Exact arguments: .*Refund of \\u202e0057\\u202c GBP/, 'the arguments as JSON escapes');
    t.match(q?.message, /Warning \(hidden_characters\).*\\u202E at \/arguments\/subject/);
    t.equal(q?.schema.properties.subject?.default, 'Refund of \\u202E0057\\u202C GBP', 'the preset shows the codes');
    t.ok(q?.schema.required.includes('accept_hidden_characters'), 'the second yes is a required field');
    t.same(
      (await f.pool.query("SELECT status FROM actionledger.gate_proposals WHERE workflow_step_id = 'h-1'")).rows,
      [{ status: 'cancelled' }],
      'confirmed without the second yes: cancelled',
    );
    t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved');

    accept = true;
    const yes = await call(client, 'send_email', hidden, meta('h-3', { turn_id: 'turn-3' }));
    t.match(yes, { isError: false, body: { ok: true, status: 'reserved' } }, 'the preset, left as shown, is the value');
    const rtl = { ...EMAIL, body: 'IBAN \u05d0 1234 5678' };
    const right = await call(client, 'send_email', rtl, meta('h-4', { turn_id: 'turn-4' }));
    t.match(right, { isError: false, body: { ok: true, status: 'reserved' } });
    t.match(asked.at(-1)?.message, /right-to-left text at \/arguments\/body/, 'right-to-left text asks too');
    const stored = await f.pool.query<{ args: Record<string, string> }>(
      'SELECT arguments_json AS args FROM actionledger.operations ORDER BY created_at',
    );
    t.same(
      stored.rows.map((r) => [r.args.subject, r.args.body]),
      [
        [hidden.subject, EMAIL.body],
        [EMAIL.subject, rtl.body],
      ],
      'exactly what was proposed, the hidden characters themselves',
    );

    second = false;
    asked.length = 0;
    await call(client, 'send_email', EMAIL, meta('h-5', { turn_id: 'turn-5' }));
    t.notOk('accept_hidden_characters' in (asked[0]?.schema.properties ?? {}), 'plain text needs no second yes');
    t.notMatch(asked[0]?.message, /Warning/);
  },
);

t.test('without elicitation, the next-turn confirmation: the same turn is refused, a later one executes', async (t) => {
  const f = await apiFixture(t);
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  const held = await call(client, 'send_email', EMAIL, meta('e-1', { turn_id: 'turn-1' }));
  t.match(held, {
    isError: true,
    body: { ok: false, error: 'confirmation_required', request_id: String, confirm_token: String },
  });
  const confirm = { confirm_token: held.body.confirm_token };
  const same = await call(client, 'actionledger_confirm_proposal', confirm, meta('e-1', { turn_id: 'turn-1' }));
  t.match(same, { isError: true, body: { error: 'proposal_same_turn_confirm' } });
  const next = await call(client, 'actionledger_confirm_proposal', confirm, meta('e-1', { turn_id: 'turn-2' }));
  t.match(next, { isError: false, body: { ok: true, status: 'reserved', operation_id: String } });
  const replay = await call(client, 'actionledger_confirm_proposal', confirm, meta('e-1', { turn_id: 'turn-3' }));
  t.match(replay, { isError: true, body: { error: 'invalid_state_transition' } }, 'a token counts once');
  t.equal(await count(f.pool, 'actionledger.operations'), 1);
});

t.test('the built-in confirm without the host’s turn is refused invalid_context, nothing confirmed', async (t) => {
  const f = await apiFixture(t);
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  const held = await call(client, 'send_email', EMAIL, meta('e-1'));
  const confirm = { confirm_token: held.body.confirm_token };
  const unturned = await call(client, 'actionledger_confirm_proposal', confirm, meta('e-1'));
  t.match(unturned, { isError: true, body: { error: 'invalid_context', details: { problem: 'required' } } });
  const turned = await call(client, 'actionledger_confirm_proposal', confirm, meta('e-1', { turn_id: 'turn-2' }));
  t.match(turned, { isError: false, body: { ok: true, status: 'reserved' } }, 'the token was not spent');
});

t.test('an argument named like the confirmation field: the form keeps the two apart', async (t) => {
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
  const forms: Record<string, Record<string, unknown>>[] = [];
  let tick: string | undefined;
  const client = await mcpClient(t, f.base, await f.token('agent-1', ['agent']), {
    elicit: (params) => {
      const props =
        (params as { requestedSchema?: { properties: Record<string, Record<string, unknown>> } }).requestedSchema
          ?.properties ?? {};
      forms.push(props);
      const shown = Object.fromEntries(Object.entries(props).map(([k, v]) => [k, v.default]));
      return {
        action: 'accept',
        content: { ...shown, confirm: true, ...(tick === undefined ? {} : { [tick]: true }) },
      };
    },
  });
  // With the argument: its field is argument:confirm, every other argument's too; `confirm` is the yes.
  const asShown = await call(client, 'send_email', { ...EMAIL, confirm: false }, meta('e-1', { turn_id: 't-1' }));
  t.same(Object.keys(forms[0] ?? {}).sort(), [
    'argument:body',
    'argument:confirm',
    'argument:subject',
    'argument:to',
    'confirm',
  ]);
  t.match(forms[0]?.confirm, { title: 'Carry this out' });
  t.match(forms[0]?.['argument:confirm'], { type: 'boolean', title: 'confirm', default: false });
  t.match(asShown, { isError: false, body: { ok: true, status: 'reserved' } }, 'the yes alone runs the proposal');
  tick = 'argument:confirm';
  const changed = await call(client, 'send_email', { ...EMAIL, confirm: false }, meta('e-2', { turn_id: 't-2' }));
  t.match(changed, { isError: true, body: { error: 'params_mismatch' } }, 'the user’s changed value is not dropped');
  // Without it: the fields are the arguments' own names.
  tick = undefined;
  const plain = await call(client, 'send_email', EMAIL, meta('e-3', { turn_id: 't-3' }));
  t.same(Object.keys(forms[2] ?? {}).sort(), ['body', 'confirm', 'subject', 'to']);
  t.match(plain, { isError: false, body: { ok: true, status: 'reserved' } });
  t.equal(await count(f.pool, 'actionledger.operations'), 2);
});
