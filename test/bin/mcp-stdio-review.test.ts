/**
 * Adversarial review of `actionledger mcp --stdio`: the token's request window, which every HTTP request of
 * the same token is held to, must hold for a model looping over the stdio server too.
 */
import t from 'tap';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { PrincipalStore } from '../../principals/index.js';
import { BIN } from '../helpers/cli.js';
import { TEST_SECRET } from '../helpers/db.js';
import { count, gateFixture, gateRoutes, gateSection } from '../helpers/gate.js';
import { call, meta } from '../helpers/mcp.js';
import { nodeCommand } from '../helpers/node-child.js';

t.test('the stdio server holds the token to its request window', async (t) => {
  const api = { rate_limit: { requests: 5, window_s: 3600 } };
  const { pool, url, config } = await gateFixture(t, { extra: { api } });
  const cfg = join(mkdtempSync(join(tmpdir(), 'al-mcp-stdio-rev-')), 'config.json');
  writeFileSync(cfg, JSON.stringify({ tools: gateRoutes(), gate: gateSection(), api }));
  const env = { DATABASE_URL: url, ACTIONLEDGER_CONFIG: cfg, ACTIONLEDGER_EFFECT_KEY_SECRET: TEST_SECRET };
  const store = new PrincipalStore(config, pool);
  await store.add('agent-1', 'service', 'agent', 'test');
  await store.grant('agent-1', 'tenant-a', 'agent', 'test');
  const { token } = await store.createToken('agent-1', 'tenant-a', 'host', 1, 'test');
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
  const results = [];
  for (let i = 0; i < 20; i++)
    results.push(await call(client, 'transfer_funds', { to_account: 'ACC0000000001', amount: 1 }, meta(`s-${i}`)));
  const reserved = await count(pool, 'actionledger.operations');
  t.ok(reserved <= 5, `a window of 5 requests; reserved ${reserved} of 20`);
  t.ok(
    results.some((r) => r.body.error === 'rate_limited'),
    'the requests beyond the window are refused rate_limited',
  );
});
