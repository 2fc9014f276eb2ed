/**
 * `actionledger mcp --stdio`, spawned by the SDK's own stdio client exactly as a local agent host starts it:
 * the token's tools listed, a call reserved once with the host's metadata as its context, a refusal as a tool
 * error, a revoked role seen by the next request of the same process, and a missing token refused before the
 * protocol starts.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { PrincipalStore } from '../../principals/index.js';
import { BIN, runCli, lastJson } from '../helpers/cli.js';
import { TEST_SECRET } from '../helpers/db.js';
import { auditRows, count, gateFixture, gateRoutes, gateSection } from '../helpers/gate.js';
import { call, meta } from '../helpers/mcp.js';
import { nodeCommand } from '../helpers/node-child.js';

t.test('the stdio server: listing, one reservation, refusals as tool errors, revocation', async (t) => {
  const { pool, url, config } = await gateFixture(t);
  const cfg = join(mkdtempSync(join(tmpdir(), 'al-mcp-stdio-')), 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate: gateSection() }));
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
  const store = new PrincipalStore(config, pool);
  await store.add('agent-1', 'service', 'agent', 'test');
  await store.grant('agent-1', 'tenant-a', 'agent', 'test');
  const created = await store.createToken('agent-1', 'tenant-a', 'host', 1, 'test');
  const token = created.token;

  const missing = await runCli(['mcp', '--stdio'], env, { input: '' });
  t.equal(missing.code, 1);
  t.match(lastJson(missing.stdout), { ok: false, error: 'unauthenticated' });

  const bogus = await runCli(['mcp', '--stdio'], { ...env, ACTIONLEDGER_TOKEN: 'alt_not_a_token' }, { input: '' });
  t.equal(bogus.code, 1, 'an unknown token: refused before the protocol starts');
  t.match(lastJson(bogus.stdout), { ok: false, error: 'unauthenticated' });
  const init = {
    jsonrpc: '2.0',
    id: 1,
    method: 'initialize',
    params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'pipe', version: '1' } },
  };
  const piped = await runCli(
    ['mcp', '--stdio'],
    { ...env, ACTIONLEDGER_TOKEN: token },
    { input: `${JSON.stringify(init)}\n` },
  );
  t.equal(piped.code, 0, 'stdin closed: the server stops and exits 0');
  const lines = piped.stdout.trim().split('\n');
  t.equal(lines.length, 1, 'stdout carries only the protocol');
  t.match(JSON.parse(lines[0] ?? '{}'), { jsonrpc: '2.0', id: 1, result: { serverInfo: { name: 'actionledger' } } });

  const [command, commandArgs] = nodeCommand([BIN, 'mcp', '--stdio']);
  const transport = new StdioClientTransport({
    command,
    args: commandArgs,
    env: { PATH: process.env.PATH ?? '', ...env, ACTIONLEDGER_TOKEN: token },
    stderr: 'pipe',
  });
  const client = new Client({ name: 'actionledger-test-host', version: '1.0.0' });
  await client.connect(transport);
  t.teardown(() => client.close());

  const tools = (await client.listTools()).tools.map((x) => x.name);
  t.ok(tools.includes('transfer_funds') && tools.includes('send_email'), 'the agent role’s tools');
  t.notOk(tools.includes('update_document') || tools.includes('lookup_order'), 'no other role’s, no role-less');

  const transfer = { to_account: 'ACC0000000001', amount: 5 };
  const done = await call(client, 'transfer_funds', transfer, meta('s-1', { turn_id: 't-1' }));
  t.match(done, { isError: false, body: { ok: true, status: 'reserved', created: true, operation_id: String } });
  const again = await call(client, 'transfer_funds', transfer, meta('s-1', { turn_id: 't-2' }));
  t.match(again.body, { ok: true, created: false, operation_id: done.body.operation_id });
  const row = await pool.query('SELECT tenant_id, principal_id, workflow_step_id FROM actionledger.operations');
  t.same(row.rows, [{ tenant_id: 'tenant-a', principal_id: 'agent-1', workflow_step_id: 's-1' }]);

  const injected = await call(client, 'transfer_funds', { ...transfer, tenant_id: 'tenant-b' }, meta('s-2'));
  t.match(injected, { isError: true, body: { ok: false, error: 'invalid_arguments' } });
  const noValidator = await call(client, 'issue_refund', { order_id: 'O-1', amount: 5, currency: 'GBP' }, meta('s-3'));
  t.match(noValidator, { isError: true, body: { error: 'config_invalid' } }, 'the CLI runs no business validators');

  await store.revoke('agent-1', 'tenant-a', 'agent', 'test');
  t.same((await client.listTools()).tools, [], 'the next request sees the revocation');
  const refused = await call(client, 'transfer_funds', transfer, meta('s-4'));
  t.match(refused, { isError: true, body: { error: 'permission_denied' } });
  t.equal(await count(pool, 'actionledger.operations'), 1);
  t.ok((await auditRows(pool, "action = 'call' AND outcome = 'invalid_arguments'")).length === 1);

  await store.revokeToken(created.token_id, 'test');
  await t.rejects(client.listTools(), /unauthenticated/, 'a token revoked mid-session: the next request is refused');
  await t.rejects(call(client, 'transfer_funds', transfer, meta('s-5')), /unauthenticated/);

  // A host that pipes its requests and closes stdin at once still gets every answer before the process exits.
  await store.add('agent-2', 'service', 'agent', 'test');
  await store.grant('agent-2', 'tenant-a', 'agent', 'test');
  const second = await store.createToken('agent-2', 'tenant-a', 'pipe', 1, 'test');
  const pipedCall = {
    jsonrpc: '2.0',
    id: 2,
    method: 'tools/call',
    params: { name: 'transfer_funds', arguments: { to_account: 'ACC0000000009', amount: 3 }, _meta: meta('s-pipe') },
  };
  const batch = [init, { jsonrpc: '2.0', method: 'notifications/initialized' }, pipedCall];
  const answered = await runCli(
    ['mcp', '--stdio'],
    { ...env, ACTIONLEDGER_TOKEN: second.token },
    { input: batch.map((m) => `${JSON.stringify(m)}\n`).join('') },
  );
  t.equal(answered.code, 0, 'stdin closed after a call: exit 0 once it is answered');
  const answers = answered.stdout
    .trim()
    .split('\n')
    .map((l) => JSON.parse(l) as { id: number; result: { structuredContent?: Record<string, unknown> } });
  t.same(
    answers.map((a) => a.id),
    [1, 2],
  );
  t.match(answers[1]?.result.structuredContent, { ok: true, status: 'reserved', created: true });
});
