/**
 * The host's trusted context (`_meta`), checked whole: a host that got something wrong is told every missing or
 * malformed field in one answer, not one field per attempt, both in a tool error (`tools/call`) and in a
 * JSON-RPC error (`tools/list`, `resources/read`), whose message carries the SDK's `MCP error -32602:` once.
 * Driven by the SDK's own client against the API's real listener and a real PostgreSQL.
 */
import t from 'tap';
import { apiFixture } from '../helpers/api.js';
import { count } from '../helpers/gate.js';
import { call, mcpClient, meta } from '../helpers/mcp.js';

const TRANSFER = { to_account: 'ACC0000000001', amount: 5 };
const USER = '_meta.actionledger/user';

t.test('tools/call: every missing or malformed _meta field in one tool error', async (t) => {
  const f = await apiFixture(t);
  const runtime = await mcpClient(t, f.base, await f.token('runtime-1', ['agent-runtime']));
  // A host acting for a user that left out the step, the user's conversation and turn, and sent a number role.
  const r = await call(runtime, 'transfer_funds', TRANSFER, {
    'actionledger/task_id': 'task-1',
    'actionledger/user': { principal_id: 'user-1', role: 7, account_id: 'acct-1' },
  });
  const fields = ['_meta.actionledger/workflow_step_id', `${USER}.role`, `${USER}.conversation_id`, `${USER}.turn_id`];
  t.match(r, {
    isError: true,
    body: {
      ok: false,
      error: 'invalid_context',
      details: {
        field: fields[0],
        problem: 'required',
        fields,
        problems: [
          { field: fields[0], problem: 'required' },
          { field: fields[1], problem: 'type' },
          { field: fields[2], problem: 'required' },
          { field: fields[3], problem: 'required' },
        ],
      },
    },
  });
  const message = String(r.body.message);
  for (const field of fields) t.ok(message.includes(field), `the message names ${field}`);
  t.match(message, /\(4 problems\)/);

  // Fixed as told, the next attempt goes through: nothing else was wrong.
  const user = { principal_id: 'user-1', role: 'agent', account_id: 'acct-1', conversation_id: 'c-1', turn_id: 'u1' };
  t.match(await call(runtime, 'transfer_funds', TRANSFER, meta('s-1', { user })), {
    isError: false,
    body: { ok: true, status: 'reserved' },
  });
  t.equal(await count(f.pool, 'actionledger.operations'), 1, 'the refused attempt reserved nothing');
});

t.test('tools/call as itself: task, step and a malformed turn together; one problem says so', async (t) => {
  const f = await apiFixture(t);
  const agent = await mcpClient(t, f.base, await f.token('agent-1', ['agent']));
  const none = await call(agent, 'transfer_funds', TRANSFER, { 'actionledger/turn_id': ' t' });
  t.match(none.body, {
    error: 'invalid_context',
    details: {
      fields: ['_meta.actionledger/task_id', '_meta.actionledger/workflow_step_id', '_meta.actionledger/turn_id'],
    },
  });
  const one = await call(agent, 'transfer_funds', TRANSFER, { 'actionledger/task_id': 'task-1' });
  t.match(one.body, {
    error: 'invalid_context',
    message: /\(1 problem\): _meta\.actionledger\/workflow_step_id is missing$/,
    details: { field: '_meta.actionledger/workflow_step_id', problem: 'required' },
  });
});

t.test('tools/call: several roles held and none named is one of the problems listed', async (t) => {
  const f = await apiFixture(t);
  const multi = await mcpClient(t, f.base, await f.token('multi-1', ['agent', 'admin']));
  const r = await call(multi, 'transfer_funds', TRANSFER, { 'actionledger/task_id': 'task-1' });
  t.match(r.body, {
    error: 'invalid_context',
    details: { fields: ['_meta.actionledger/workflow_step_id', '_meta.actionledger/role'] },
  });
  t.match(String(r.body.message), /_meta\.actionledger\/role is missing: you hold several roles here \(admin, agent\)/);
});

t.test('tools/list and resources/read: a JSON-RPC error with one prefix, every field named', async (t) => {
  const f = await apiFixture(t);
  const runtime = await mcpClient(t, f.base, await f.token('runtime-1', ['agent-runtime']));
  const err = await runtime
    .listTools({ _meta: { 'actionledger/user': { principal_id: 'user-1', role: 'agent', account_id: 'acct-1' } } })
    .then(
      () => null,
      (e: unknown) => e as { message: string; code: number; data: Record<string, unknown> },
    );
  if (err === null) throw new Error('expected tools/list to be refused');
  t.equal(err.code, -32602);
  t.equal(
    err.message,
    `MCP error -32602: invalid_context: the host's _meta is not a usable trusted context (2 problems): ` +
      `${USER}.conversation_id is missing; ${USER}.turn_id is missing`,
    'the SDK prefix once, then the stable code',
  );
  t.match(err.data, {
    error: 'invalid_context',
    details: { fields: [`${USER}.conversation_id`, `${USER}.turn_id`] },
  });
  const missing = await runtime.readResource({ uri: 'actionledger://operations/nope' }).then(
    () => null,
    (e: unknown) => e as Error,
  );
  t.equal(missing?.message, 'MCP error -32602: not_found: no such resource');
});
