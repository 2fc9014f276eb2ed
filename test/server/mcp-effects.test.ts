/**
 * What an MCP tool call does in the world: the SDK's client over Streamable HTTP against the API's listener,
 * a real dispatcher, the built-in authorization service over mTLS and the sandbox provider counting what it
 * receives per Idempotency-Key. One call within limits is one effect (called again, the same operation); the
 * fourteen-refund injection stops at the conversation cap with one audited refusal per extra refund; an
 * approval given through the HTTP API lets the held call happen once; the operation is followed to its receipt.
 */
import t from 'tap';
import { auditRows, count } from '../helpers/gate.js';
import { call, mcpClient, mcpDispatchEnv, meta } from '../helpers/mcp.js';

const USER = { principal_id: 'user-1', role: 'agent', account_id: 'acct-1', conversation_id: 'conv-1' };
const asUser = (step: string, turn = 'turn-1') => meta(step, { user: { ...USER, turn_id: turn } });

t.test('a call within limits is one provider effect, and the operation is followed to its receipt', async (t) => {
  const { e, f, dispatch } = await mcpDispatchEnv(t);
  const client = await mcpClient(t, f.base, await f.token('runtime-1', ['agent-runtime']));
  const refund = { order_id: 'O-1', amount: 20, currency: 'GBP' };
  const first = await call(client, 'issue_refund', refund, asUser('r-1'));
  t.match(first, { isError: false, body: { ok: true, status: 'reserved', created: true, operation_id: String } });
  const again = await Promise.all(
    Array.from({ length: 8 }, () => call(client, 'issue_refund', refund, asUser('r-1', 'turn-2'))),
  );
  for (const r of again)
    t.match(r.body, { ok: true, operation_id: first.body.operation_id, created: false }, 'the same step: same op');
  const id = String(first.body.operation_id);
  t.equal((await dispatch(id)).status, 'succeeded');
  t.equal(e.provider.effectsFor(String(first.body.effect_key)), 1, 'exactly one effect');
  t.equal(e.provider.requestsFor(String(first.body.effect_key)), 1, 'sent once');
  t.equal(e.provider.allEffects().length, 1);

  const followed = await call(client, 'actionledger_operation', { operation_id: id }, asUser('any'));
  t.match(followed, { isError: false, body: { ok: true, status: 'succeeded', receipt: String, tool: 'issue_refund' } });
  const templates = await client.listResourceTemplates();
  t.same(
    templates.resourceTemplates.map((x) => x.uriTemplate),
    ['actionledger://operations/{operation_id}'],
  );
  const resource = await client.readResource({ uri: String(first.body.operation_uri), _meta: asUser('any') });
  const text = resource.contents[0] !== undefined && 'text' in resource.contents[0] ? resource.contents[0].text : '';
  t.match(JSON.parse(text), { status: 'succeeded', receipt: followed.body.receipt });

  const stranger = await mcpClient(t, f.base, await f.token('agent-9', ['agent']));
  const notYours = await call(stranger, 'actionledger_operation', { operation_id: id }, meta('x'));
  const random = await call(stranger, 'actionledger_operation', { operation_id: crypto.randomUUID() }, meta('x'));
  t.match(notYours, { isError: true, body: { error: 'not_found' } }, 'another principal’s operation');
  t.same(notYours.body, random.body, 'looks exactly like one that does not exist');
  await t.rejects(stranger.readResource({ uri: String(first.body.operation_uri) }), /no such resource/);
});

t.test('the fourteen-refund injection stops at the conversation cap, one audited refusal each', async (t) => {
  const { e, f, dispatch } = await mcpDispatchEnv(t);
  const client = await mcpClient(t, f.base, await f.token('runtime-1', ['agent-runtime']));
  // Text the model read asked for a refund of every order; it tries all fourteen at once.
  const results = await Promise.all(
    Array.from({ length: 14 }, (_, i) =>
      call(client, 'issue_refund', { order_id: `O-${i + 1}`, amount: 243.71, currency: 'GBP' }, asUser(`r-${i}`)),
    ),
  );
  const allowed = results.filter((r) => !r.isError);
  const refused = results.filter((r) => r.isError);
  t.equal(allowed.length, 2, 'two refunds fit the 500 GBP conversation cap');
  t.equal(refused.length, 12);
  for (const r of refused) t.match(r.body, { ok: false, error: 'limit_exceeded', message: String });
  t.equal((await auditRows(f.pool, "action = 'call' AND outcome = 'limit_exceeded'")).length, 12);
  t.equal(await count(f.pool, 'actionledger.operations'), 2);
  for (const r of allowed) t.equal((await dispatch(String(r.body.operation_id))).status, 'succeeded');
  t.equal(e.provider.allEffects().length, 2, 'two effects in the world, no more');
});

t.test(
  'approval_required names the request and what the approver sees; approved over the API, one effect',
  async (t) => {
    const { e, f, dispatch } = await mcpDispatchEnv(t);
    const editor = await mcpClient(t, f.base, await f.token('editor-1', ['editor']));
    const args = { document_id: 'DOC-1', status: 'published' };
    const held = await call(editor, 'update_document', args, meta('d-1'));
    t.match(held, {
      isError: true,
      body: {
        ok: false,
        error: 'approval_required',
        request_id: String,
        envelope_sha256: /^[0-9a-f]{64}$/,
        approval: { shown_to_approvers: { effect: 'Set document DOC-1 to published' } },
      },
    });
    t.equal(await count(f.pool, 'actionledger.operations'), 0, 'nothing reserved while it waits');
    const supervisor = await f.token('supervisor-1', ['supervisor']);
    const approved = await f.call('POST', `/v1/approvals/${String(held.body.request_id)}/approve`, {
      token: supervisor,
      body: { envelope_sha256: held.body.envelope_sha256 },
    });
    t.match(approved, { status: 200, body: { ok: true, operation_id: String } });
    const id = String(approved.body.operation_id);
    t.equal((await dispatch(id)).status, 'succeeded');
    t.equal(e.provider.allEffects().length, 1, 'one effect');
    const followed = await call(editor, 'actionledger_operation', { operation_id: id }, meta('d-1'));
    t.match(followed.body, { ok: true, status: 'succeeded' }, 'the requester follows it');
  },
);
